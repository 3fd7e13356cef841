"""Nsight Systems SQLite exports (`nsys export --type sqlite`): CUDA kernels, copies, memsets, synchronizations,
runtime/driver calls and NVTX ranges of one process.

Times in the export are ns since the session start; TARGET_INFO_SESSION_START_TIME.utcEpochNs (when recorded)
makes them absolute. Host threads come from globalTid, which packs the pid in bits 24-47 and the tid in bits 0-23.

CUPTI_ACTIVITY_KIND_RUNTIME holds CUDA runtime calls (eventClass 0), driver calls (1) and, when backtraces were
collected, a second record of the same call (67, 'CUDA backtrace', same correlationId): only 0 and 1 are calls.

An export of one process is one rank (named by the file name when it names one, as for every format). An export
of several processes that ran device work (`nsys profile mpirun ...`) gives one rank per such process: ranks 0,
1, ... in pid order (the export does not record MPI ranks), said in a note. A process that only made CUDA API calls
(a launcher, a process that initialized CUDA) is no rank: its calls are left out, said in a note.

Speed and memory: SQLite columns are read as Arrow record batches by the ADBC SQLite driver (C, no Python object
per value), integers only: SQLite is typed per value, so every column is read as "the integer, or NULL" and every
text as bytes, then decoded with invalid UTF-8 replaced. DuckDB turns the batches into slices as they stream
(string ids to names, args JSON, thread labels) and they go to a memory-mapped scratch file: memory holds a few
batches and DuckDB's working memory (the limit), whatever the export's size.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import db, limits
from ..arrays import array, to_numpy
from ..errors import TraceError
from .common import MAX_NAME_CHARS, OUT_BATCH_ROWS

FORMAT = "nsys"
SUFFIXES = (".sqlite", ".nsys.sqlite")

_MAGIC = b"SQLite format 3\x00"
_PID_MASK = 0xFFFFFF
# Enums of the export schema (ENUM_CUDA_MEMCPY_OPER, ENUM_CUDA_MEM_KIND, ENUM_CUPTI_SYNC_TYPE; older exports
# lack those tables but use the same values), named as Kineto names the same events.
_COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
               10: "PtoP", 11: "HtoD (Unified)", 12: "DtoH (Unified)", 13: "DtoD (Unified)"}
_MEMORY_KINDS = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
                 6: "Managed Static"}
_SYNC_KINDS = {1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}
_UNKNOWN = "'unknown'"
_NO_STREAM = 4294967295  # CUPTI's "invalid" id: a context or event sync names no stream
# NVTX_EVENTS.eventType (ENUM_NSYS_EVENT_TYPE): push/pop and start/end ranges, marks; the rest name things.
_NVTX_RANGES = (59, 60)
_NVTX_MARK = 34
_KERNEL, _MEMCPY, _MEMSET, _SYNC, _RUNTIME, _NVTX = (
    "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")
_DEVICE_WORK = (_KERNEL, _MEMCPY, _MEMSET)  # what makes a process a rank
_BATCH_ROWS = 1 << 16
#: Strings are read fewer at a time: a batch holds up to this many names of MAX_NAME_CHARS (32 MB)
_STRING_BATCH_ROWS = 1 << 12
_MAX_TIME = 2**62  # |start|, |end| beyond this cannot be a time in ns (readers.MAX_TS_NS)
_MAX_BASE = 2**61
_METADATA_ROWS = 10_000  # rows read of a metadata table (devices, export description): these are small


def detect(path: Path, head: bytes) -> bool:
    # a damaged file that is named like an export gets this reader's message, not "unknown format"
    return head.startswith(_MAGIC) or path.name.endswith(SUFFIXES)


def _case(expr: str, names: dict[int, str], default: str) -> str:
    whens = " ".join(f"WHEN {k} THEN '{v}'" for k, v in names.items())
    return f"CASE {expr} {whens} ELSE {default} END"


def _memory_kind(expr: str) -> str:
    return _case(expr, _MEMORY_KINDS, _UNKNOWN)


class _Table:
    """One event table: the integer columns read from SQLite (NULL where a value is no integer, or the column is
    missing in this export's version) and the DuckDB SELECT that makes slices of them (`b`: the batches, with
    slice_id, start and end checked)."""

    def __init__(self, name: str, ints: tuple[str, ...], select: str, where: str = "", text: str | None = None):
        self.name, self.ints, self.select, self.where, self.text = name, ints, select, where, text

    def sqlite(self, columns: set[str], process_column: str, process: int) -> str:
        values = [f"CASE WHEN typeof(\"{c}\") = 'integer' THEN \"{c}\" END AS \"{c}\"" if c in columns
                  else f'NULL AS "{c}"' for c in self.ints]
        if self.text:  # bytes, never NULL (the driver types a column by its first batch): a flag says NULL
            values += [f'CAST(COALESCE("{self.text}", \'\') AS BLOB) AS text', f'"{self.text}" IS NULL AS no_text']
        where = f"(\"{process_column}\" >> 24) = {process}" + (f" AND ({self.where})" if self.where else "")
        return f'SELECT {", ".join(values)} FROM "{self.name}" WHERE {where}'


_STREAM = f"CASE WHEN b.streamId = {_NO_STREAM} THEN -1 ELSE b.streamId END"


def _device(table: str, kind: str, ints: tuple[str, ...], name: str, args: str, joins: str = "") -> _Table:
    # device rows put the device in pid and the stream in tid, as schema.slices (and Kineto) do
    return _Table(table, ("start", "end", "deviceId", "streamId", "correlationId", *ints), f"""
    SELECT b.slice_id, '{kind}' AS kind, '{table}' AS category, {name} AS name, b.start + $base AS ts,
        b."end" - b.start AS dur, b.deviceId AS pid, {_STREAM} AS tid, b.deviceId AS device_id, {_STREAM} AS stream,
        'device ' || b.deviceId || ' / stream ' || ({_STREAM}) AS track, b.correlationId AS correlation,
        {args} AS args
    FROM batches b {joins}""")


# host track: 'process name / thread name (tid)', from the process's thread names
_HOST = """(b.globalTid >> 24) & 16777215 AS pid, b.globalTid & 16777215 AS tid,
    $process_label || ' / ' || COALESCE(t.name || ' (' || (b.globalTid & 16777215) || ')',
                                        'thread ' || (b.globalTid & 16777215)) AS track"""
_THREAD_JOIN = "LEFT JOIN thread_names t ON t.tid = b.globalTid & 16777215"

#: In the order their slices are numbered.
_TABLES = (
    _device(_KERNEL, "kernel", ("demangledName", "shortName", "gridX", "gridY", "gridZ", "blockX", "blockY",
                                "blockZ", "registersPerThread", "staticSharedMemory", "dynamicSharedMemory",
                                "contextId"),
            "COALESCE(d.value, s.value)",
            "json_object('grid', json_array(b.gridX, b.gridY, b.gridZ), 'block', json_array(b.blockX, b.blockY, "
            "b.blockZ), 'registers per thread', b.registersPerThread, 'shared memory', b.staticSharedMemory"
            " + b.dynamicSharedMemory, 'context', b.contextId, 'short name', s.value)",
            "LEFT JOIN strings d ON d.id = b.demangledName LEFT JOIN strings s ON s.id = b.shortName"),
    _device(_MEMCPY, "memcpy", ("copyKind", "srcKind", "dstKind", "bytes", "contextId"),
            f"'Memcpy ' || {_case('b.copyKind', _COPY_KINDS, _UNKNOWN)} || ' (' || {_memory_kind('b.srcKind')}"
            f" || ' -> ' || {_memory_kind('b.dstKind')} || ')'",
            "json_object('bytes', b.bytes, 'context', b.contextId)"),
    _device(_MEMSET, "memset", ("memKind", "bytes", "value", "contextId"),
            f"'Memset (' || {_memory_kind('b.memKind')} || ')'",
            "json_object('bytes', b.bytes, 'value', b.value, 'context', b.contextId)"),
    _device(_SYNC, "sync", ("syncType", "contextId"), _case("b.syncType", _SYNC_KINDS, "'Sync'"),
            "json_object('context', b.contextId)"),
    # nsys names runtime entry points with their ABI version ('cudaLaunchKernel_v7000'): the API name is the call
    _Table(_RUNTIME, ("start", "end", "eventClass", "globalTid", "correlationId", "nameId", "returnValue"), f"""
    SELECT b.slice_id, CASE b.eventClass WHEN 1 THEN 'driver' ELSE 'runtime' END AS kind, '{_RUNTIME}' AS category,
        regexp_replace(s.value, '_v\\d+$', '') AS name, b.start + $base AS ts, b."end" - b.start AS dur, {_HOST},
        b.correlationId AS correlation, json_object('return value', b.returnValue) AS args
    FROM batches b LEFT JOIN strings s ON s.id = b.nameId {_THREAD_JOIN}""", where="eventClass IN (0, 1)"),
    _Table(_NVTX, ("start", "end", "eventType", "globalTid", "textId", "domainId"), f"""
    SELECT b.slice_id, CASE WHEN b.eventType = {_NVTX_MARK} THEN 'instant' ELSE 'user_annotation' END AS kind,
        '{_NVTX}' AS category, COALESCE(b.text, s.value) AS name, b.start + $base AS ts, b."end" - b.start AS dur,
        {_HOST}, json_object('domain', b.domainId) AS args
    FROM batches b LEFT JOIN strings s ON s.id = b.textId {_THREAD_JOIN}""",
           where=f"eventType IN ({_NVTX_MARK}, {', '.join(map(str, _NVTX_RANGES))})", text="text"),
)


def _open(path: Path):
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_MAGIC))
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if magic != _MAGIC:
        raise TraceError(path, "not an SQLite database")
    # immutable: no lock or journal files next to a trace that may sit on a read-only share
    con = sqlite3.connect(_uri(path), uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")  # names with invalid UTF-8 are read, not refused
    return con


def _uri(path: Path) -> str:
    return f"{path.resolve().as_uri()}?mode=ro&immutable=1"


def read(path: Path, threads: int | None = None):
    import duckdb
    from adbc_driver_manager import Error as AdbcError

    con = _open(path)
    try:
        with tempfile.TemporaryDirectory(prefix="tracesql-") as scratch:
            return _read(path, con, Path(scratch), threads)
    except (sqlite3.Error, AdbcError) as e:  # a truncated or damaged file fails on the first page it lacks
        raise TraceError(path, f"damaged or unsupported SQLite export ({e})") from None
    except OSError as e:  # the driver's errors, as Arrow passes them on
        if "[SQLite]" not in str(e):
            raise
        raise TraceError(path, f"damaged or unsupported SQLite export ({e})") from None
    except duckdb.OutOfMemoryException:  # not the export's fault: the ingest names the file and the limit
        raise
    except duckdb.Error as e:
        raise TraceError(path, f"unreadable export ({str(e).splitlines()[0]})") from None
    finally:
        con.close()


def _read(path: Path, con, scratch: Path, threads: int | None):
    import adbc_driver_sqlite.dbapi

    tables = {name: {c[1] for c in con.execute(f'PRAGMA table_info("{name}")')}
              for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
    if _KERNEL not in tables and _RUNTIME not in tables:
        raise TraceError(path, "not an Nsight Systems export: no CUPTI_ACTIVITY_KIND_KERNEL table")
    processes, notes = _processes(con, tables)
    if not processes:
        raise TraceError(path, "no CUDA activity: the export's kernel, copy and runtime tables are empty")
    if len(processes) > 1:
        notes.append(f"{len(processes)} processes with CUDA activity: ranks 0-{len(processes) - 1} in pid order "
                     f"(pids {', '.join(str(p & _PID_MASK) for p in processes)})")
    base, base_note = _base_time(con, tables)
    notes += base_note
    lim = limits.current()
    common = {"metadata": _metadata(con, tables), "devices": _devices(con, tables)}
    with adbc_driver_sqlite.dbapi.connect(_uri(path)) as source:
        duck = db.connect(threads, lim.memory, database=scratch / "nsys.duckdb")
        # the batches stream through (slice_id says their order); the lookup tables are what joins build hash
        # tables of: DuckDB cannot tell the size of a stream and would otherwise build on it, holding it all
        duck.execute("SET preserve_insertion_order = false")
        duck.execute("SET disabled_optimizers = 'build_side_probe_side'")
        try:
            notes += _load_strings(source, duck, tables)
            traces = [_read_process(path, con, source, duck, tables, process, base, scratch / f"slices-{i}.arrows",
                                    lim.max_events, rank=i if len(processes) > 1 else None, notes=notes, **common)
                      for i, process in enumerate(processes)]
        finally:
            duck.close()
    return traces if len(traces) > 1 else traces[0]


def _processes(con, tables) -> tuple[list[int], list[str]]:
    """The processes (vm id + pid) that are ranks, in order: those with device work, or, when none has any,
    those that made CUDA calls. And a note on the processes left out."""
    def having(parts):
        parts = [p for p in parts if p]
        if not parts:
            return {}
        return dict(con.execute(f"SELECT p, count(*) FROM ({' UNION ALL '.join(parts)}) GROUP BY p ORDER BY p"))

    integer = "typeof({}) = 'integer'"
    device = having([f'SELECT "globalPid" >> 24 AS p FROM "{t}" WHERE {integer.format("globalPid")}'
                     for t in _DEVICE_WORK if t in tables])
    api = having([f'SELECT "globalTid" >> 24 AS p FROM "{_RUNTIME}" WHERE eventClass IN (0, 1) AND '
                  f'{integer.format("globalTid")}' if _RUNTIME in tables else ""])
    notes = []
    for table in _TABLES:  # rows read but naming no process belong to no rank: said, not dropped silently
        column = _process_column(table.name)
        if column in tables.get(table.name, ()):
            (lost,), = con.execute(f'SELECT count(*) FROM "{table.name}" WHERE NOT {integer.format(column)}'
                                   + (f" AND ({table.where})" if table.where else ""))
            if lost:
                notes.append(f"{lost:,} rows of {table.name} left out: their {column} is not an integer, so they "
                             "belong to no process")
    if not device:
        return list(api), notes
    left_out = {p: n for p, n in api.items() if p not in device}
    if left_out:
        notes.append(f"{len(left_out)} process(es) made CUDA calls but ran no device work, so are no rank: "
                     + ", ".join(f"pid {p & _PID_MASK} ({n:,} calls left out)" for p, n in list(left_out.items())[:10]))
    return list(device), notes


def _process_column(table: str) -> str:
    """The column that names a row's process: globalPid in device tables, globalTid (pid in bits 24-47) else."""
    return "globalPid" if table in (*_DEVICE_WORK, _SYNC) else "globalTid"


def _base_time(con, tables) -> tuple[int, list[str]]:
    base = _scalar(con, tables, "TARGET_INFO_SESSION_START_TIME", "utcEpochNs")
    if base is None:
        return 0, []
    if isinstance(base, int) and 0 <= base < _MAX_BASE:
        return base, []
    return 0, [f"TARGET_INFO_SESSION_START_TIME.utcEpochNs {str(base)[:40]!r} is not a time in ns: times are "
               "kept relative to the session start"]


def _batches(source, sql: str, rows: int = _BATCH_ROWS):
    """The query's rows from SQLite, as Arrow record batches of `rows` rows."""
    cur = source.cursor()
    try:
        cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(rows)})
        cur.execute(sql)
        yield from cur.fetch_record_batch()
    finally:
        cur.close()


def _utf8(column: pa.Array) -> pa.Array:
    """SQLite text read as bytes -> strings, invalid UTF-8 replaced by U+FFFD (only a batch that has any is
    decoded in Python)."""
    if not pa.types.is_binary(column.type) and not pa.types.is_large_binary(column.type):
        return column.cast(pa.string())  # an empty result: the driver says int64
    try:
        return column.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([b.decode("utf-8", "replace") if b is not None else None for b in column.to_pylist()],
                        pa.string())


def _load_strings(source, duck, tables) -> list[str]:
    """StringIds into DuckDB (table `strings`: id -> value), a batch at a time; returns a note on the names cut
    to MAX_NAME_CHARS."""
    duck.execute("CREATE TABLE strings (id BIGINT, value VARCHAR)")
    if {"id", "value"} <= tables.get("StringIds", set()):
        # cut in SQLite (one character over: cut is noted below), never a whole name of hundreds of MB in Arrow
        sql = ("SELECT CASE WHEN typeof(id) = 'integer' THEN id END AS id, CAST(substr(COALESCE(value, ''), 1, "
               f"{MAX_NAME_CHARS + 1}) AS BLOB) AS value FROM StringIds")
        for batch in _batches(source, sql, _STRING_BATCH_ROWS):
            _insert(duck, "strings", pa.record_batch([batch["id"].cast(pa.int64()), _utf8(batch["value"])],
                                                     names=["id", "value"]))
    # a hand-made export may repeat an id: its first value, as a lookup by id would give
    duck.execute(f"CREATE OR REPLACE TABLE strings AS SELECT id, left(first(value ORDER BY rowid), {MAX_NAME_CHARS}) "
                 f"AS value, max(length(value)) > {MAX_NAME_CHARS} AS cut FROM strings WHERE id IS NOT NULL GROUP BY id")
    cut = duck.execute("SELECT count(*) FROM strings WHERE cut").fetchone()[0]
    return [f"{cut} strings longer than {MAX_NAME_CHARS:,} characters cut to that length"] if cut else []


def _insert(duck, table: str, batch: pa.RecordBatch) -> None:
    duck.register("incoming", batch)
    duck.execute(f"INSERT INTO {table} SELECT * FROM incoming")
    duck.unregister("incoming")


def _read_process(path: Path, con, source, duck, tables: dict, process: int, base: int, slices_file: Path,
                  max_events: int | None, rank: int | None, notes: list[str], metadata: dict, devices: list):
    from .common import FileMapping, TraceData, mapped_slices

    _load_thread_names(source, duck, tables, process)
    skipped: dict[str, int] = {}
    numbered = [0]  # slices numbered so far: slice_id goes on across tables
    label = _process_label(con, tables, process)

    def slices():
        for table in _TABLES:
            if table.name not in tables or (max_events and numbered[0] >= max_events):
                continue
            sql = table.sqlite(tables[table.name], _process_column(table.name), process)
            checked = _checked(_batches(source, sql), table, numbered, skipped, max_events)
            first = next(checked, None)
            if first is None:
                continue
            cur = duck.cursor()  # its own connection: the result streams while the next table is queried
            try:
                cur.register("batches", pa.RecordBatchReader.from_batches(first.schema, _chain(first, checked)))
                params = {"base": base, **({"process_label": label} if "$process_label" in table.select else {})}
                yield from cur.sql(table.select, params=params).to_arrow_reader(OUT_BATCH_ROWS)
            finally:
                cur.close()

    mapping: FileMapping = mapped_slices(slices_file, slices())
    sliced = mapping.table()
    if max_events and numbered[0] >= max_events:
        notes = notes + [f"read only the first {max_events:,} events (--max-events)"]
    return TraceData(
        format=FORMAT,
        slices=sliced,
        rank=rank,
        base_time_ns=base,
        event_count=sliced.num_rows + sum(skipped.values()),
        skipped=skipped,
        notes=list(notes),
        metadata={**metadata, "pid": process & _PID_MASK},
        devices=devices,
        mappings=[mapping],
    )


def _chain(first, rest):
    yield first
    yield from rest


def _checked(batches, table: _Table, numbered: list[int], skipped: dict[str, int], max_events: int | None):
    """The batches with slice_id (numbered on from `numbered[0]`, in the export's order) and text decoded, less
    the rows whose times are unusable, counted in `skipped` by reason."""
    nvtx = table.name == _NVTX
    for batch in batches:
        n = batch.num_rows
        if max_events:
            n = min(n, max_events - numbered[0])
            batch = batch.slice(0, n)
        if not n:
            break
        ids = np.arange(numbered[0], numbered[0] + n, dtype=np.int64)
        numbered[0] += n
        start, end = batch["start"], batch["end"]
        has_start, has_end = to_numpy(start.is_valid()), to_numpy(end.is_valid())
        s, e = to_numpy(start.cast(pa.int64()), fill=0), to_numpy(end.cast(pa.int64()), fill=0)
        if nvtx:  # a mark has no end; a range without a usable one is no slice
            mark = to_numpy(batch["eventType"].cast(pa.int64()), fill=0) == _NVTX_MARK
            e = np.where(mark, s, e)
            has_end |= mark
            reasons = {"NVTX range without an end": has_start & (~has_end | (e < s))}
        else:
            reasons = {"start or end is not an integer": ~(has_start & has_end),
                       "end before start": has_start & has_end & (e < s)}
        reasons["time out of range"] = has_start & has_end & (e >= s) & (
            (s <= -_MAX_TIME) | (s >= _MAX_TIME) | (e <= -_MAX_TIME) | (e >= _MAX_TIME))
        if nvtx:
            reasons["start or end is not an integer"] = ~has_start
        bad = np.zeros(n, bool)
        for reason, rows in reasons.items():
            count = int(rows.sum())
            if count:
                skipped[reason] = skipped.get(reason, 0) + count
                bad |= rows
        columns = {name: batch[name] for name in batch.schema.names if name not in ("text", "no_text")}
        columns["end"] = array(e, pa.int64(), ~has_end)
        if table.text:
            columns["text"] = _utf8(batch["text"])
            columns["text"] = pc.if_else(to_numpy(batch["no_text"].cast(pa.bool_()), fill=True),
                                                 pa.nulls(n, pa.string()), columns["text"])
        columns["slice_id"] = array(ids)
        out = pa.record_batch([c.cast(pa.int64()) if c.type == pa.null() else c for c in columns.values()],
                              names=list(columns))
        yield out.filter(array(~bad)) if bad.any() else out


def _load_thread_names(source, duck, tables, process: int) -> None:
    """The process's thread names (table `thread_names`: tid -> name; the last given for a tid, as nsys shows)."""
    duck.execute("CREATE OR REPLACE TABLE thread_names (tid BIGINT, name_id BIGINT, pos BIGINT)")
    if {"globalTid", "nameId"} <= tables.get("ThreadNames", set()):
        sql = ("SELECT CASE WHEN typeof(globalTid) = 'integer' THEN globalTid & 16777215 END AS tid, "
               "CASE WHEN typeof(nameId) = 'integer' THEN nameId END AS name_id, rowid AS pos FROM ThreadNames "
               f"WHERE (globalTid >> 24) = {process}")
        for batch in _batches(source, sql):
            _insert(duck, "thread_names", pa.record_batch([batch[c].cast(pa.int64()) for c in batch.schema.names],
                                                          names=["tid", "name_id", "pos"]))
    duck.execute("CREATE OR REPLACE TABLE thread_names AS SELECT t.tid, last(s.value ORDER BY t.pos) AS name "
                 "FROM thread_names t JOIN strings s ON s.id = t.name_id WHERE t.tid IS NOT NULL GROUP BY t.tid")


def _process_label(con, tables, process: int) -> str:
    row = con.execute("SELECT name FROM PROCESSES WHERE globalPid = ? AND name <> '' LIMIT 1",
                      (process << 24,)).fetchone() if {"globalPid", "name"} <= tables.get("PROCESSES", set()) else None
    return str(row[0])[:MAX_NAME_CHARS] if row else f"process {process & _PID_MASK}"


def _scalar(con, tables, table: str, column: str):
    if column not in tables.get(table, ()):
        return None
    row = con.execute(f'SELECT "{column}" FROM "{table}" LIMIT 1').fetchone()
    return row[0] if row else None


def _metadata(con, tables) -> dict:
    # the export's own description (product version, schema version, input file): META_DATA_EXPORT in newer
    # exports, EXPORT_META_DATA in older ones
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if {"name", "value"} <= tables.get(table, set()):
            rows = con.execute(f'SELECT name, value FROM "{table}" LIMIT {_METADATA_ROWS}').fetchall()
            return {"export": {str(k): _plain(v) for k, v in rows}}
    return {}


def _plain(value):
    """A value as JSON can hold it (SQLite may hand back bytes)."""
    return value.hex() if isinstance(value, bytes) else value


def _devices(con, tables) -> list[dict]:
    if "TARGET_INFO_GPU" not in tables:
        return []
    order = " ORDER BY id" if "id" in tables["TARGET_INFO_GPU"] else ""
    cursor = con.execute(f"SELECT * FROM TARGET_INFO_GPU{order} LIMIT {_METADATA_ROWS}")
    names = [d[0] for d in cursor.description]
    out = []
    for row in cursor.fetchall():
        p = {k: _plain(v) for k, v in zip(names, row)}
        major, minor = p.get("computeMajor"), p.get("computeMinor")
        device_id = p.get("id")
        out.append({
            "device_id": device_id if isinstance(device_id, int) and -2**31 <= device_id < 2**31 else None,
            "name": p.get("name"),
            "total_memory_bytes": p.get("totalMemory") if isinstance(p.get("totalMemory"), int) else None,
            "compute_capability": f"{major}.{minor}" if major is not None else None,
            "sm_count": p.get("smCount") if isinstance(p.get("smCount"), int) else None,
            "properties": p,
        })
    return out
