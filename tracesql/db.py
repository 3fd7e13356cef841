"""The one way tracesql opens DuckDB: quiet (no progress bar on stderr) and with a thread count."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

import duckdb

from . import limits


def connect(threads: int | None = None, memory_limit: str | None = None,
            database: Path | None = None) -> duckdb.DuckDBPyConnection:
    """`memory_limit` caps DuckDB's own working memory: beyond it, it spills to a temporary folder (beside
    `database`, a scratch database file, when given: then its tables live on disk, not in memory)."""
    con = duckdb.connect(str(database) if database else ":memory:", config={"threads": threads} if threads else {})
    limits.watch_connection(con)  # interrupted when the read of a file passes the memory bound
    con.execute("SET enable_progress_bar = false").fetchall()
    if memory_limit:
        con.execute(f"SET memory_limit = '{memory_limit}'").fetchall()
    if database:
        con.execute(f"SET temp_directory = '{database}.spill'").fetchall()
    elif memory_limit:  # spills where temporary files go (an ingest's scratch folder), not in the working folder
        spill = Path(tempfile.gettempdir()) / f"tracesql-spill-{uuid.uuid4().hex[:12]}"
        con.execute(f"SET temp_directory = '{str(spill).replace(chr(39), chr(39) * 2)}'").fetchall()
    return con


def on_cursor(con, views: dict, work):
    """`work(cursor)` on a cursor of `con`, for queries that run beside others on `con` (DuckDB runs one query
    at a time per connection): the cursor shares the database (its tables, macros, settings and memory limit),
    not the Arrow tables registered on `con`, so `views` (name -> table) are registered on it."""
    cur = con.cursor()
    try:
        cur.execute("SET enable_progress_bar = false")
        for name, table in views.items():
            cur.register(name, table)
        return work(cur)
    finally:
        cur.close()


def sql_list(values) -> str:
    """Constant strings as the inside of a SQL `IN (...)`: ('a', 'b') -> "'a', 'b'"."""
    return ", ".join(f"'{v}'" for v in values)
