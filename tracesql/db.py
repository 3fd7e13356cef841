"""The one way tracesql opens DuckDB: quiet (no progress bar on stderr) and with a thread count."""

from __future__ import annotations

import duckdb


def connect(threads: int | None = None, memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """`memory_limit` caps DuckDB's own working memory (it spills to a temporary folder beyond it)."""
    con = duckdb.connect(config={"threads": threads} if threads else {})
    con.execute("SET enable_progress_bar = false").fetchall()
    if memory_limit:
        con.execute(f"SET memory_limit = '{memory_limit}'").fetchall()
    return con
