"""Open runs in DuckDB: the tables as views over the Parquet files, plus the functions (macros).

`connect()` serves Python users and the CLI (`sandbox=True`: for SQL that programs feed in, see `lock_down`);
`views.init_sql()` is the same thing as a SQL file written into every run for plain DuckDB clients. `resolve()`
turns a target (a run, a fleet, raw traces) into run folders, ingesting raw traces into a cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import duckdb

from . import db, functions, schema, store
from .errors import OlderSchemaWarning, TraceError
from .limits import SANDBOX_MEMORY
from .views import escape_path, files_sql, init_sql, quote, views_sql  # noqa: F401  (also engine.init_sql, ...)


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
    key = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    cached = cache_root() / f"{path.resolve().name}-{key}"
    stamp = cached.parent / f".{cached.name}.sources.json"  # hidden: never taken for a run
    now = source_stamp(path)  # taken before the ingest: a change while it reads is seen next time
    if store.is_run(cached) and _read_stamp(stamp) == now and \
            store.load_manifest(cached).get("schema_version") == schema.SCHEMA_VERSION:
        return [cached]  # nothing changed since the last ingest: no need to import the readers to find that out
    from .ingestion import ingest

    ingest([path], cached, run_id=path.resolve().name.split(".")[0])
    tmp = stamp.with_name(f"{stamp.name}.{os.getpid()}")
    tmp.write_text(json.dumps(now))
    tmp.replace(stamp)
    return [cached]


def source_stamp(path: Path) -> dict:
    """What raw traces at `path` are, as far as a cached run of them goes: the size and modification time of each
    file, and the modification time of each folder (it changes when a file is added, removed or renamed in it);
    hidden files and folders left out, as the ingest leaves them out."""
    def stat(p: Path) -> list[int]:
        st = p.stat()
        return [st.st_size, st.st_mtime_ns]

    path = path.resolve()
    if not path.is_dir():
        return {"files": {str(path): stat(path)}, "dirs": {}}
    files, dirs = {}, {}
    for root, subdirs, names in os.walk(path):
        subdirs[:] = sorted(d for d in subdirs if not d.startswith("."))
        dirs[root] = Path(root).stat().st_mtime_ns
        files.update({str(Path(root, n)): stat(Path(root, n)) for n in sorted(names) if not n.startswith(".")})
    return {"files": files, "dirs": dirs}


def _read_stamp(stamp: Path) -> dict | None:
    try:
        return json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None


SWAP_ATTEMPTS = 5

#: What a connection's DuckDB keeps of the blocks it frees, for its next ones (a share of its memory limit)
BLOCK_CACHE = "25%"


def published(run: Path):
    """Which publication of `run` this is: its manifest file's identity (every ingest writes a new manifest and
    swaps it in with the run's files), None while there is none."""
    try:
        st = (Path(run) / store.MANIFEST).stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


def while_unchanged(runs, work):
    """`work()`, and again (up to SWAP_ATTEMPTS times) when it failed while an ingest swapped one of `runs`: a
    reader that listed a generation's files finds one gone (part names are never reused for other bytes, see
    store) and starts over on the new generation, whatever the error said (missing file, "No files found",
    a manifest that no longer matches the folder). An error while every run stayed put is raised as it is.
    Each try holds the runs' reader lock (`store.reading`): an ingest swaps none of them in meanwhile, unless
    the try outlasts store.READER_WAIT_S."""
    runs = [Path(r) for r in runs]
    for attempt in range(1, SWAP_ATTEMPTS + 1):
        with store.reading(runs):
            before = [published(r) for r in runs]
            try:
                return work()
            except Exception as e:
                after = [published(r) for r in runs]
                if after == before:
                    raise
                error = e
        if attempt == SWAP_ATTEMPTS:
            changed = next(r for r, b, a in zip(runs, before, after) if a != b)
            raise TraceError(changed, f"replaced by an ingest {SWAP_ATTEMPTS} times while being read (each "
                                      "time a file it had listed was gone): read it again once ingests "
                                      "pause") from error


def on_fresh_connection(target, work, names=None, sandbox: bool = False, memory_limit: str | None = None):
    """`work(con)` on a new connection to `target` (with the views and functions `names` need, sandboxed or not, its
    memory limit: see `connect`), again on another when an ingest swapped a run of it in meanwhile (see
    while_unchanged)."""
    targets = target if isinstance(target, (list, tuple)) else [target]
    runs = list(dict.fromkeys(run.absolute() for t in targets for run in resolve(t)))

    def attempt():
        con = connect(runs, names=names, sandbox=sandbox, memory_limit=memory_limit)
        try:
            return work(con)
        finally:
            con.close()

    return while_unchanged(runs, attempt)


def connect(target, *, threads: int | None = None, names=None, sandbox: bool = False,
            memory_limit: str | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection where the run's (or fleet's) tables are views and the tracesql functions exist.
    `target` may also be a list of targets, read together as one fleet (e.g. the two runs of a diff).
    `names` (identifiers of the SQL to be run, `functions.words(sql)`) limits the views to those that SQL needs
    (and the functions, where the compiled ones cannot be attached: functions.install): what the CLI does, to start
    a query sooner; by default all of them.
    Unrestricted, like any DuckDB session: its SQL can read and write any file the user can. With `sandbox`, SQL
    reads the run's tables and nothing else, writes nothing, and cannot change that (see `lock_down`).
    `memory_limit` (a DuckDB size): DuckDB's working memory (default: DuckDB's, 80 % of RAM; in a sandbox
    SANDBOX_MEMORY).

    >>> con = tracesql.connect("runs/1234")                     # doctest: +SKIP
    >>> con.sql("SELECT kind, count(*) FROM slices GROUP BY 1").show()   # doctest: +SKIP
    """
    targets = target if isinstance(target, (list, tuple)) else [target]
    runs = list(dict.fromkeys(run.absolute() for t in targets for run in resolve(t)))
    tables = list(schema.TABLES)
    if names is not None:
        names = {n.lower() for n in names}
        _, used = functions.needed(names, set(tables))
        tables = [t for t in tables if t in used]
    older, files = [], {t: [] for t in schema.TABLES}
    classes_stored = True
    for run in runs:
        manifest = store.load_manifest(run)  # refuses newer runs with a clear message
        classes_stored &= manifest["schema_version"] >= schema.CLASSES_STORED_SINCE
        note = store.older_schema_note(manifest)
        if note:
            warnings.warn(f"{run}: {note}", OlderSchemaWarning, stacklevel=2)
            older.append(run)
        for rel in store.files_of(run, manifest):  # refuses a run whose files are not its manifest's
            table = rel.split("/")[0]
            files[table].append(str(run / rel))
            if table in tables:  # a flipped bit in a file read is refused, never a wrong answer (robustness.md)
                store.check_digest(run, rel, (manifest.get("files") or {}).get(rel))
    con = db.connect(threads, None if sandbox else memory_limit)
    # DuckDB's freed blocks kept for its next ones, not handed back to the system and faulted in again (a page fault
    # ~3 us here): `findings` at 24x made 0.5 M fewer faults, ~2 CPU-s less (docs/benchmarks.md). Up to a quarter of
    # the memory limit stays with the connection while it is open; not in a sandbox, whose memory stays its bound.
    if not sandbox:
        con.execute(f"SET block_allocator_memory = '{BLOCK_CACHE}'").fetchall()
    # each Parquet file's footer parsed once a connection, not at every statement that binds or scans it (a run's
    # files never change: a new ingest writes new ones). Binding the findings rules' last statements took half as
    # long at 24x; `findings` 0.4 s less wall (docs/benchmarks.md)
    con.execute("SET parquet_metadata_cache = true").fetchall()
    listed = {t: files[t] for t in tables}
    present = None
    if older:  # their files may lack columns added since: which columns each table's files have
        present = {}
        for t, table_files in listed.items():
            if table_files:
                present[t] = {r[0] for r in con.execute(
                    f"DESCRIBE SELECT * FROM read_parquet([{files_sql(table_files)}], union_by_name = true)").fetchall()}
    if listed:
        con.execute(views_sql(listed, present)).fetchall()
    con.execute(f"SET VARIABLE tracesql_classes_stored = {str(classes_stored).lower()}")
    functions.install(con, names=names, cache=cache_root())
    # the functions of Python, not SQL (see their module): for SQL that calls the walk, or a macro that does (what_if)
    if names is None or functions.walks(names):
        from . import critical_path

        critical_path.register(con)
    if sandbox:
        # each file as the views name it (glob characters escaped: DuckDB checks that name) and as it is opened
        files = [f for table_files in listed.values() for f in table_files]
        lock_down(con, files + [escape_path(f) for f in files], memory_limit)
    return con


def lock_down(con: duckdb.DuckDBPyConnection, readable: list[str], memory_limit: str | None = None) -> None:
    """Make `con` a sandbox for SQL that a program feeds in (an agent's, a web form's): from now on it reads the
    files `readable` (the run's Parquet files, which its views read) and nothing else — no other file
    (`read_text('/etc/passwd')`), no network, no `COPY ... TO`, no `ATTACH` of a file, no `INSTALL` or `LOAD`, no
    Python variable taken for a table — and writes nothing, not even spill files: a query needing more than
    `memory_limit` (default SANDBOX_MEMORY) fails with DuckDB's one-line "Out of Memory Error". The configuration
    is locked last, so no `SET` or `RESET` gives any of it back. Views and macros made before keep working: a view
    reads its files when it is queried, and those are the `readable` ones."""
    for setting in (f"allowed_paths = [{', '.join(quote(p) for p in readable)}]",
                    f"memory_limit = {quote(memory_limit or SANDBOX_MEMORY)}", "temp_directory = ''",
                    "autoinstall_known_extensions = false", "autoload_known_extensions = false",
                    "allow_community_extensions = false", "python_enable_replacements = false",
                    "enable_external_access = false", "lock_configuration = true"):
        con.execute(f"SET {setting}").fetchall()
