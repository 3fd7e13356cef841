from tracesql.cli import command_line  # absolute: spark-submit runs this file as a script

command_line()
