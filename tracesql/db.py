"""The one way tracesql opens DuckDB: quiet (no progress bar on stderr) and with a thread count."""

from __future__ import annotations

import contextlib
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
        con.execute(_spill_setting()).fetchall()
    return con


def _spill_setting() -> str:
    """The SET statement of a new spill folder where temporary files go now."""
    spill = Path(tempfile.gettempdir()) / f"tracesql-spill-{uuid.uuid4().hex[:12]}"
    return f"SET temp_directory = '{str(spill).replace(chr(39), chr(39) * 2)}'"


#: Connections `for_trace` keeps for the next trace of this process, by (threads, memory limit, temporary folder)
#: (a connection of another thread count or folder is moved: _moved).
_kept: dict[tuple, list[duckdb.DuckDBPyConnection]] = {}


@contextlib.contextmanager
def for_trace(threads: int | None = None, memory_limit: str | None = None, database: Path | None = None):
    """A connection for one trace's work (a reader's, normalize's) or a run's (the ingest's run-wide steps). On a
    scratch database file (a big trace), a new one, closed after. In memory, one kept open afterwards for the next
    trace this process reads: opening one and creating the macros costs more CPU than all the work on a tiny trace
    (an archive of 5,000 ranks pays it 5,000 times); what the work made (tables, views, registered Arrow tables) is dropped after it, the macros
    and their data tables (tracesql.functions) stay. A connection whose work failed is closed, not kept."""
    if database is not None:
        con = connect(threads, memory_limit, database=database)
        try:
            yield con
        finally:
            con.close()
        return
    key = (threads, memory_limit, tempfile.gettempdir())
    for other in [k for k in _kept if k[1] != memory_limit]:  # another ingest's memory limit: not needed again
        for con in _kept.pop(other, []):
            con.close()
    free = _kept.setdefault(key, [])
    try:
        con = free.pop()  # (atomic: two threads never get the same one)
    except IndexError:
        con = _moved(key) or connect(threads, memory_limit)
    try:
        yield con
        clear(con)
    except BaseException:
        con.close()
        raise
    free.append(con)


def _moved(key: tuple) -> duckdb.DuckDBPyConnection | None:
    """A kept connection of the same memory limit but another thread count or temporary folder (the previous
    ingest's scratch folder, or the run-wide steps' after the reads: tracesql.ingestion), set to `key`'s: its
    macros stay made (installing them again took 0.1-0.2 CPU-s an ingest). None when there is none. One that
    has spilled into its folder cannot move (DuckDB keeps it): it is closed."""
    threads, memory_limit, folder = key
    for other in [k for k in _kept if k != key and k[1] == memory_limit]:
        while True:
            try:
                con = _kept.get(other, []).pop()
            except IndexError:
                break
            try:
                if memory_limit and other[2] != folder:
                    con.execute(_spill_setting()).fetchall()
                if other[0] != threads:
                    con.execute(f"SET threads = {threads}" if threads else "RESET threads").fetchall()
            except duckdb.Error:
                con.close()
                continue
            return con
    return None


def clear(con) -> None:
    """Drop what a trace's work made on `con`, keeping the macros' data tables."""
    from . import functions

    kept = functions.table_names()
    drops = []
    for name, kind in con.execute("SELECT view_name, 'VIEW' FROM duckdb_views() WHERE NOT internal UNION ALL "
                                  "SELECT table_name, 'TABLE' FROM duckdb_tables()").fetchall():
        if name.lower() not in kept:
            if kind == "VIEW":
                con.unregister(name)  # an Arrow table registered on `con` (a view the work made: no-op)
            drops.append(f'DROP {kind} IF EXISTS "{name}";')
    if drops:
        con.execute("".join(drops))


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
