"""Nsight Systems SQLite exports (`nsys export --type sqlite`): CUDA kernels, copies, memsets, synchronizations,
runtime/driver calls and NVTX ranges of one process.

Times in the export are ns since the session start; TARGET_INFO_SESSION_START_TIME.utcEpochNs (when recorded)
makes them absolute. Host threads come from globalTid, which packs the pid in bits 24-47 and the tid in bits 0-23.

CUPTI_ACTIVITY_KIND_RUNTIME holds CUDA runtime calls (eventClass 0), driver calls (1) and, when backtraces were
collected, a second record of the same call (67, 'CUDA backtrace', same correlationId): only 0 and 1 are calls.

An export of one process is one rank (named by the file name when it names one, as for every format). An export of several processes with CUDA activity (`nsys profile mpirun ...`) gives one
rank per process: ranks 0, 1, ... in pid order (the export does not record MPI ranks), said in a note.

Read with Python's sqlite3 (DuckDB's sqlite extension needs a download): one query per table, its rows transposed
into Arrow columns.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import TraceError

FORMAT = "nsys"
SUFFIXES = (".sqlite", ".nsys.sqlite")

_MAGIC = b"SQLite format 3\x00"
_PROCESS = "(({col}) >> 24)"  # vm id + pid: the process part of globalTid / globalPid
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


def detect(path: Path, head: bytes) -> bool:
    # a damaged file that is named like an export gets this reader's message, not "unknown format"
    return head.startswith(_MAGIC) or path.name.endswith(SUFFIXES)


def _case(expr: str, names: dict[int, str], default: str) -> str:
    whens = " ".join(f"WHEN {k} THEN '{v}'" for k, v in names.items())
    return f"CASE {expr} {whens} ELSE {default} END"


def _memory_kind(expr: str) -> str:
    return _case(expr, _MEMORY_KINDS, _UNKNOWN)


def _device(table: str, kind: str, name: str, args: str) -> str:
    # device rows put the device in pid and the stream in tid, as schema.slices (and Kineto) do
    stream = f"CASE WHEN t.streamId = {_NO_STREAM} THEN -1 ELSE t.streamId END"
    return f"""
    SELECT '{kind}', '{table}', {name}, t.start, t."end" - t.start, t.deviceId, {stream}, t.deviceId, {stream},
        'device ' || t.deviceId || ' / stream ' || ({stream}), t.correlationId, {args}
    FROM "{table}" t WHERE {_PROCESS.format(col='t.globalPid')} = :process"""


def _queries(tables: dict[str, set[str]]) -> list[str]:
    """One SELECT per table the export has: kind, category, name, start, dur, pid, tid, device, stream, track,
    correlation, args. `:process` selects the process."""
    out = []
    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        out.append(_device(
            "CUPTI_ACTIVITY_KIND_KERNEL", "kernel",
            "COALESCE((SELECT value FROM StringIds WHERE id = t.demangledName),"
            " (SELECT value FROM StringIds WHERE id = t.shortName))",
            "json_object('grid', json_array(t.gridX, t.gridY, t.gridZ), 'block', json_array(t.blockX, t.blockY,"
            " t.blockZ), 'registers per thread', t.registersPerThread, 'shared memory', t.staticSharedMemory"
            " + t.dynamicSharedMemory, 'context', t.contextId,"
            " 'short name', (SELECT value FROM StringIds WHERE id = t.shortName))"))
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        out.append(_device(
            "CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy",
            f"'Memcpy ' || {_case('t.copyKind', _COPY_KINDS, _UNKNOWN)} || ' (' || {_memory_kind('t.srcKind')}"
            f" || ' -> ' || {_memory_kind('t.dstKind')} || ')'",
            "json_object('bytes', t.bytes, 'context', t.contextId)"))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        out.append(_device(
            "CUPTI_ACTIVITY_KIND_MEMSET", "memset",
            f"'Memset (' || {_memory_kind('t.memKind')} || ')'",
            "json_object('bytes', t.bytes, 'value', t.value, 'context', t.contextId)"))
    if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" in tables:
        out.append(_device(
            "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "sync",
            _case("t.syncType", _SYNC_KINDS, "'Sync'"), "json_object('context', t.contextId)"))
    # host track: NULL here, labelled per thread afterwards (a lookup per row would scan PROCESSES each time)
    host = f"{_PROCESS.format(col='t.globalTid')} & 16777215, t.globalTid & 16777215, NULL, NULL, NULL"
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        out.append(f"""
    SELECT CASE t.eventClass WHEN 1 THEN 'driver' ELSE 'runtime' END, 'CUPTI_ACTIVITY_KIND_RUNTIME',
        (SELECT value FROM StringIds WHERE id = t.nameId), t.start, t."end" - t.start, {host}, t.correlationId,
        json_object('return value', t.returnValue)
    FROM CUPTI_ACTIVITY_KIND_RUNTIME t
    WHERE t.eventClass IN (0, 1) AND {_PROCESS.format(col='t.globalTid')} = :process""")
    if "NVTX_EVENTS" in tables:
        out.append(f"""
    SELECT CASE WHEN t.eventType = {_NVTX_MARK} THEN 'instant' ELSE 'user_annotation' END, 'NVTX_EVENTS',
        COALESCE(t.text, (SELECT value FROM StringIds WHERE id = t.textId)), t.start,
        CASE WHEN t.eventType = {_NVTX_MARK} THEN 0 ELSE t."end" - t.start END, {host}, NULL,
        json_object('domain', t.domainId)
    FROM NVTX_EVENTS t
    WHERE {_PROCESS.format(col='t.globalTid')} = :process
      AND (t.eventType = {_NVTX_MARK} OR (t.eventType IN {_NVTX_RANGES} AND t."end" >= t.start))""")
    return out


_ACTIVITY = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def _processes(con, tables) -> list[int]:
    """The processes (vm id + pid) with CUDA activity, in order."""
    parts = [f'SELECT {_PROCESS.format(col="globalPid")} AS p FROM "{t}"' for t in _ACTIVITY if t in tables]
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        parts.append(f"SELECT {_PROCESS.format(col='globalTid')} FROM CUPTI_ACTIVITY_KIND_RUNTIME"
                     " WHERE eventClass IN (0, 1)")
    return [p for (p,) in con.execute(f"SELECT DISTINCT p FROM ({' UNION ALL '.join(parts)}) ORDER BY p")]


_COLUMNS = [("kind", pa.string()), ("category", pa.string()), ("name", pa.string()), ("ts", pa.int64()),
            ("dur", pa.int64()), ("pid", pa.int64()), ("tid", pa.int64()), ("device_id", pa.int32()),
            ("stream", pa.int64()), ("track", pa.string()), ("correlation", pa.int64()), ("args", pa.string())]


def _open(path: Path):
    try:
        with open(path, "rb") as f:
            magic = f.read(len(_MAGIC))
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if magic != _MAGIC:
        raise TraceError(path, "not an SQLite database")
    # immutable: no lock or journal files next to a trace that may sit on a read-only share
    return sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)


def read(path: Path, threads: int | None = None):
    con = _open(path)
    try:
        return _read(path, con)
    except sqlite3.DatabaseError as e:  # a truncated or damaged file fails on the first page it lacks
        raise TraceError(path, f"damaged or unsupported SQLite export ({e})") from None
    finally:
        con.close()


def _read(path: Path, con):
    tables = {name: {c[1] for c in con.execute(f'PRAGMA table_info("{name}")')}
              for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables and "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        raise TraceError(path, "not an Nsight Systems export: no CUPTI_ACTIVITY_KIND_KERNEL table")
    processes = _processes(con, tables)
    if not processes:
        raise TraceError(path, "no CUDA activity: the export's kernel, copy and runtime tables are empty")
    if len(processes) == 1:
        return _read_process(path, con, tables, processes[0], None, [])
    note = (f"{len(processes)} processes with CUDA activity: ranks 0-{len(processes) - 1} in pid order "
            f"(pids {', '.join(str(p & 0xFFFFFF) for p in processes)})")
    return [_read_process(path, con, tables, process, rank, [note]) for rank, process in enumerate(processes)]


def _read_process(path: Path, con, tables: dict, process: int, rank: int | None, notes: list[str]):
    from . import TraceData

    params = {"process": process}
    rows = con.execute(" UNION ALL ".join(_queries(tables)), params).fetchall()
    skipped = {}
    if "NVTX_EVENTS" in tables:
        open_ranges = con.execute(
            f'SELECT count(*) FROM NVTX_EVENTS t WHERE {_PROCESS.format(col="t.globalTid")} = :process'
            f' AND t.eventType IN {_NVTX_RANGES} AND (t."end" IS NULL OR t."end" < t.start)', params).fetchone()[0]
        if open_ranges:
            skipped["NVTX range without an end"] = open_ranges
    columns = list(zip(*rows)) if rows else [()] * len(_COLUMNS)
    del rows
    base = _scalar(con, tables, "TARGET_INFO_SESSION_START_TIME", "utcEpochNs") or 0
    slices = {"slice_id": pa.array(range(len(columns[0])), pa.int64())}
    for (name, type_), values in zip(_COLUMNS, columns):
        slices[name] = pa.array(values, type_)
    slices["ts"] = pc.add(slices["ts"], base)
    # nsys names runtime entry points with their ABI version ('cudaLaunchKernel_v7000'): the API name is the call
    slices["name"] = pc.replace_substring_regex(slices["name"], r"_v\d+$", "")
    slices["track"] = pc.coalesce(slices["track"], _thread_tracks(con, process, slices["tid"]))
    slices["external_id"] = pa.nulls(len(slices["ts"]), pa.int64())
    slices = pa.table(slices)

    return TraceData(
        format=FORMAT,
        slices=slices,
        rank=rank,
        base_time_ns=base,
        event_count=slices.num_rows + sum(skipped.values()),
        skipped=skipped,
        notes=notes,
        metadata={**_metadata(con, tables), "pid": process & 0xFFFFFF},
        devices=_devices(con, tables),
    )


def _thread_tracks(con, process: int, tid: pa.Array) -> pa.Array:
    """'process name / thread name (tid)' for each row's tid (the host lane label)."""
    pid = process & 0xFFFFFF
    row = con.execute("SELECT name FROM PROCESSES WHERE globalPid = ? AND name <> '' LIMIT 1",
                      (process << 24,)).fetchone() if _has(con, "PROCESSES") else None
    process_label = row[0] if row else f"process {pid}"
    thread_names = dict(con.execute(
        "SELECT t.globalTid & 16777215, s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId"
        " WHERE t.globalTid >> 24 = ?", (process,)).fetchall()) if _has(con, "ThreadNames") else {}
    tids = pc.unique(tid)
    labels = pa.array([f"{process_label} / {thread_names[t]} ({t})" if t in thread_names
                       else f"{process_label} / thread {t}" for t in tids.to_pylist()], pa.string())
    return labels.take(pc.index_in(tid, value_set=tids))


def _has(con, table: str) -> bool:
    return con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone() is not None


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
            return {"export": dict(con.execute(f'SELECT name, value FROM "{table}"').fetchall())}
    return {}


def _devices(con, tables) -> list[dict]:
    if "TARGET_INFO_GPU" not in tables:
        return []
    cursor = con.execute("SELECT * FROM TARGET_INFO_GPU ORDER BY id")
    names = [d[0] for d in cursor.description]
    out = []
    for row in cursor.fetchall():
        p = dict(zip(names, row))
        major, minor = p.get("computeMajor"), p.get("computeMinor")
        out.append({
            "device_id": p.get("id"),
            "name": p.get("name"),
            "total_memory_bytes": p.get("totalMemory"),
            "compute_capability": f"{major}.{minor}" if major is not None else None,
            "sm_count": p.get("smCount"),
            "properties": p,
        })
    return out
