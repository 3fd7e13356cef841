"""Open runs in DuckDB: the tables as views over the Parquet files, plus the functions (macros).

The only module that knows both the on-disk layout and the functions. `connect()` serves Python users and the
CLI; `init_sql()` is the same thing as a SQL file written into every run for plain DuckDB clients.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import duckdb

from . import db, functions, schema, store
from .errors import OlderSchemaWarning, TraceError


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def escape_path(path: str) -> str:
    """`path` as DuckDB reads exactly that file: DuckDB takes `*`, `?` and `[` in a path as a glob pattern, so
    each becomes a one-character class (`exp[1]` -> `exp[[]1]`) that matches only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


def views_sql(files_per_table: dict[str, list[str]], present: dict[str, set[str]] | None = None) -> str:
    """A view per table over its Parquet files (named one by one, never globbed); a table with none (runs of an
    older schema) is empty. `present`: for tables whose files may lack columns (runs of an older schema), the
    columns they have: the view reads the files by name and gives each missing column as NULL."""
    lines = []
    for name, table in schema.TABLES.items():
        files = ", ".join(_quote(escape_path(f)) for f in files_per_table[name])
        lines.append(f"-- {table.doc}")
        empty = ", ".join(f'CAST(NULL AS {c.type}) AS "{c.name}"' for c in table.columns)
        have = (present or {}).get(name)
        if files and have is not None and not set(table.column_names) <= have:
            columns = ", ".join(f'"{c.name}"' if c.name in have else f'CAST(NULL AS {c.type}) AS "{c.name}"'
                                for c in table.columns)
            source = f"SELECT {columns} FROM read_parquet([{files}], union_by_name = true)"
        else:
            source = f"SELECT * FROM read_parquet([{files}])" if files else f"SELECT {empty} WHERE false"
        lines.append(f"CREATE OR REPLACE VIEW {name} AS {source};")
    return "\n".join(lines) + "\n"


def init_sql(files=None) -> str:
    """The SQL a plain DuckDB client runs (from inside the run folder) to see the tables and functions: views
    over the run's files (`files`: the manifest's, `table/file.parquet`), or over `table/*.parquet`."""
    header = (
        f"-- tracesql run (schema version {schema.SCHEMA_VERSION}). Open it in any DuckDB client, from this folder:\n"
        "--   cd <this run> && duckdb -init init.sql\n"
        "-- or in Python: os.chdir(run); con.execute(open('init.sql').read())\n"
    )
    if files is None:
        per_table = {t: [f"{t}/*.parquet"] for t in schema.TABLES}
        return header + views_sql(per_table).replace("[*]", "*") + functions.sql()
    per_table = {t: [f for f in sorted(files) if f.split("/")[0] == t] for t in schema.TABLES}
    return header + views_sql(per_table) + functions.sql()


def cache_root() -> Path:
    base = os.environ.get("TRACESQL_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracesql"
    return Path(base)


def resolve(target) -> list[Path]:
    """The run folders behind `target`: a run, a folder of runs (a fleet), or raw traces (ingested into a cache)."""
    path = Path(target)
    if store.being_written(path.absolute()) and not store.is_run(path):  # the first ingest of it is running
        store.wait_for_writer(path.absolute())
    if not path.exists():
        raise TraceError(path, "no such file or folder")
    if store.is_run(path):
        return [path]
    if path.is_dir():  # a fleet: its runs; hidden folders are an ingest's work in progress, never runs
        runs = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".") and store.is_run(p))
        if runs:
            return runs
    from .ingestion import ingest

    key = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    cached = cache_root() / f"{path.resolve().name}-{key}"
    ingest([path], cached, run_id=path.resolve().name.split(".")[0])
    return [cached]


SWAP_ATTEMPTS = 3
_SWAPPED_PROBLEMS = ("missing:", "changed:", "not part of the run", "not a readable tracesql run")


def on_fresh_connection(target, work):
    """`work(con)` on a new connection to `target`, and again (up to SWAP_ATTEMPTS times) on another if a file of
    the run vanished under it: an ingest swapped the run in between listing its files and opening them; the
    next attempt sees the new run whole."""
    for attempt in range(1, SWAP_ATTEMPTS + 1):
        con = None
        try:
            con = connect(target)
            return work(con)
        except TraceError as e:  # the manifest read, then the run swapped: its files are the next run's
            if attempt == SWAP_ATTEMPTS or not e.problem.startswith(_SWAPPED_PROBLEMS):
                raise
        except duckdb.IOException as e:
            if attempt == SWAP_ATTEMPTS or not any(s in str(e) for s in ("No such file", "No files found")):
                raise
        finally:
            if con is not None:
                con.close()


def connect(target, *, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection where the run's (or fleet's) tables are views and the tracesql functions exist.
    `target` may also be a list of targets, read together as one fleet (e.g. the two runs of a diff).

    >>> con = tracesql.connect("runs/1234")                     # doctest: +SKIP
    >>> con.sql("SELECT kind, count(*) FROM slices GROUP BY 1").show()   # doctest: +SKIP
    """
    targets = target if isinstance(target, (list, tuple)) else [target]
    runs = list(dict.fromkeys(run.absolute() for t in targets for run in resolve(t)))
    files = {t: [] for t in schema.TABLES}
    older = []
    for run in runs:
        manifest = store.load_manifest(run)  # refuses newer runs with a clear message
        note = store.older_schema_note(manifest)
        if note:
            warnings.warn(f"{run}: {note}", OlderSchemaWarning, stacklevel=2)
            older.append(run)
        for rel in store.files_of(run, manifest):  # refuses a run whose files are not its manifest's
            files[rel.split("/")[0]].append(str(run / rel))
    con = db.connect(threads)
    present = None
    if older:  # their files may lack columns added since: which columns each table's files have
        present = {}
        for t, table_files in files.items():
            if table_files:
                listed = ", ".join(_quote(escape_path(f)) for f in table_files)
                present[t] = {r[0] for r in con.execute(
                    f"DESCRIBE SELECT * FROM read_parquet([{listed}], union_by_name = true)").fetchall()}
    con.execute(views_sql(files, present))
    functions.install(con)
    return con
