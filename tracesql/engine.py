"""Open runs in DuckDB: the tables as views over the Parquet files, plus the functions (macros).

The only module that knows both the on-disk layout and the functions. `connect()` serves Python users and the
CLI; `init_sql()` is the same thing as a SQL file written into every run for plain DuckDB clients.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import duckdb

from . import db, functions, schema, store
from .errors import TraceError


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def views_sql(globs_per_table: dict[str, list[str]]) -> str:
    lines = []
    for name, table in schema.TABLES.items():
        files = ", ".join(_quote(g) for g in globs_per_table[name])
        lines.append(f"-- {table.doc}")
        lines.append(f"CREATE OR REPLACE VIEW {name} AS SELECT * FROM read_parquet([{files}]);")
    return "\n".join(lines) + "\n"


def init_sql() -> str:
    """The SQL a plain DuckDB client runs (from inside the run folder) to see the tables and functions."""
    header = (
        f"-- tracesql run (schema version {schema.SCHEMA_VERSION}). Open it in any DuckDB client, from this folder:\n"
        "--   cd <this run> && duckdb -init init.sql\n"
        "-- or in Python: os.chdir(run); con.execute(open('init.sql').read())\n"
    )
    return header + views_sql({t: [f"{t}/*.parquet"] for t in schema.TABLES}) + functions.sql()


def cache_root() -> Path:
    base = os.environ.get("TRACESQL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracesql"
    return Path(base)


def resolve(target) -> list[Path]:
    """The run folders behind `target`: a run, a folder of runs (a fleet), or raw traces (ingested into a cache)."""
    path = Path(target)
    if not path.exists():
        raise TraceError(path, "no such file or folder")
    if store.is_run(path):
        return [path]
    if path.is_dir():
        runs = sorted(p for p in path.iterdir() if p.is_dir() and store.is_run(p))
        if runs:
            return runs
    from .ingestion import ingest

    key = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    cached = cache_root() / f"{path.resolve().name}-{key}"
    ingest([path], cached, run_id=path.resolve().name.split(".")[0])
    return [cached]


def connect(target, *, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection where the run's (or fleet's) tables are views and the tracesql functions exist.
    `target` may also be a list of targets, read together as one fleet (e.g. the two runs of a diff).

    >>> con = tracesql.connect("runs/1234")                     # doctest: +SKIP
    >>> con.sql("SELECT kind, count(*) FROM slices GROUP BY 1").show()   # doctest: +SKIP
    """
    targets = target if isinstance(target, (list, tuple)) else [target]
    runs = list(dict.fromkeys(run.absolute() for t in targets for run in resolve(t)))
    for run in runs:
        store.load_manifest(run)  # refuses runs of another schema version with a clear message
    con = db.connect(threads)
    globs = {t: [str(run.absolute() / t / "*.parquet") for run in runs] for t in schema.TABLES}
    con.execute(views_sql(globs))
    functions.install(con)
    return con
