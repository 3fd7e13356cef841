"""SQL macros (and the data tables they use) available in every tracesql DuckDB session.

Everything here is plain files so that a run opened in any DuckDB client gets the same definitions:
- `*.csv`: small data tables (kernel class rules, device peaks), created as tables of the file's name;
- `NN_topic.sql`: macros, run in file-name order (a table macro binds the tables it reads when it is created).
`install(con)` runs them on a connection; `sql()` is the same text, written into every run's `init.sql`.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

HERE = Path(__file__).parent
_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _literal(value: str, sql_type: str) -> str:
    if value == "":
        return "NULL"
    return value if sql_type != "VARCHAR" else "'" + value.replace("'", "''") + "'"


def csv_table_sql(path: Path) -> str:
    """A CSV file as CREATE TABLE + INSERT: the data travels inside the SQL, never as a path. A column whose
    values are all integers is INTEGER, all numbers DOUBLE, otherwise VARCHAR."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    columns = list(rows[0]) if rows else []
    types = {}
    for c in columns:
        values = [r[c] for r in rows if r[c] != ""]
        if values and all(re.fullmatch(r"-?\d+", v) for v in values):
            types[c] = "BIGINT"
        elif values and all(_NUMBER.fullmatch(v) for v in values):
            types[c] = "DOUBLE"
        else:
            types[c] = "VARCHAR"
    name = path.stem
    values = ",\n    ".join("(" + ", ".join(_literal(r[c], types[c]) for c in columns) + ")" for r in rows)
    return (f"-- {name}: from tracesql/functions/{path.name}; edit or insert rows to change it for this session.\n"
            f"CREATE OR REPLACE TABLE {name} ({', '.join(f'{c} {types[c]}' for c in columns)});\n"
            f"INSERT INTO {name} VALUES\n    {values};\n")


def sql(files: tuple[str, ...] | None = None) -> str:
    """The SQL of `files` (names in this folder), or of all of them."""
    chosen = sorted(p for p in HERE.iterdir() if p.suffix in (".csv", ".sql") and (files is None or p.name in files))
    tables = [csv_table_sql(p) for p in chosen if p.suffix == ".csv"]
    macros = [p.read_text() for p in chosen if p.suffix == ".sql"]
    return "\n".join(tables + macros)


def install(con, files: tuple[str, ...] | None = None) -> None:
    con.execute(sql(files)).fetchall()
