from tracesql.cli import main  # absolute: spark-submit runs this file as a script

main()
