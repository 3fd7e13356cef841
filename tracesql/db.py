"""The one way tracesql opens DuckDB: quiet (no progress bar on stderr) and with a thread count."""

from __future__ import annotations

import duckdb


def connect(threads: int | None = None) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(config={"threads": threads} if threads else {})
    con.execute("SET enable_progress_bar = false").fetchall()
    return con
