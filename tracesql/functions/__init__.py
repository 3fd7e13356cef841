"""SQL macros (and the kernel-class rules they use) available in every tracesql DuckDB session.

They are plain SQL files in this folder so that a run opened in any DuckDB client gets the same definitions:
`install(con)` runs them here, and `sql()` is what the engine writes into a run's `init.sql`.
"""

from __future__ import annotations

import csv
from pathlib import Path

HERE = Path(__file__).parent
SQL_FILES = ("sizes.sql", "activity.sql")


def kernel_classes_sql() -> str:
    """`kernel_classes` as an inline table: the class rules travel with the SQL, not as a file path."""
    with open(HERE / "kernel_classes.csv", newline="") as f:
        rows = list(csv.DictReader(f))

    def lit(v: str, numeric: bool = False) -> str:
        if v == "":
            return "NULL"
        return v if numeric else "'" + v.replace("'", "''") + "'"

    values = ",\n    ".join(
        f"({lit(r['scheme'])}, {lit(r['priority'], True)}, {lit(r['kind'])}, {lit(r['name_regex'])}, "
        f"{lit(r['class'])}, {lit(r['note'])})"
        for r in rows
    )
    return (
        "-- Kernel classes: the first matching rule (lowest priority) of a scheme gives a device event its class.\n"
        "-- Edit this table (or insert rules with a new scheme) to change what counts as communication.\n"
        "CREATE OR REPLACE TABLE kernel_classes (scheme VARCHAR, priority INTEGER, kind VARCHAR, "
        "name_regex VARCHAR, class VARCHAR, note VARCHAR);\n"
        f"INSERT INTO kernel_classes VALUES\n    {values};\n"
    )


def sql() -> str:
    return "\n".join([kernel_classes_sql()] + [(HERE / name).read_text() for name in SQL_FILES])


def install(con) -> None:
    con.execute(sql())
