"""rocprofv3's default output since ROCm 7.0: the rocpd SQLite database `<pid>_results.db` (also written by
rocprof-sys with ROCPROFSYS_USE_ROCPD).

Every table carries its writer's uuid as a suffix (`rocpd_kernel_dispatch_<uuid>`) and a `guid` column; views
without the suffix (`rocpd_kernel_dispatch`, ...) show them, and are what this reader queries (rows join on id and
guid, as the SDK's own views do). Read as the JSON export is (readers/rocprof.py), with the same slice columns:

- rocpd_kernel_dispatch: kernels on their queue (`stream`), named by the kernel symbol's display name;
- rocpd_memory_copy: copies on their HIP stream, named by the copy's direction, on the GPU agent they touch;
- rocpd_region: API calls with a duration (HIP as runtime, HSA as driver, RCCL as cpu_op, markers as
  user_annotation, a roctx range named by its message); rocpd_sample: those without one (a roctxMark);
- rocpd_event: each record's correlation ids (`stack_id` the internal one, `correlation_id` the external one);
- rocpd_info_agent: the devices (the GPU agents; their `extdata` is the agent as the JSON export holds it).

Memory allocations and counter values have no table here yet: counted in a note. Rows are read with Python's
sqlite3 a query at a time and streamed to a memory-mapped scratch file.
"""

from __future__ import annotations

import json
import sqlite3
import tempfile
from pathlib import Path

import pyarrow as pa

from ..errors import TraceError
from . import rocprof
from .common import MAX_NAME_CHARS, READER_SLICE_TYPES, RowBatches, TraceData, mapped_slices, read_sqlite
from .common import sqlite_int as _int

FORMAT = "rocpd"
SUFFIXES = ("_results.db",)
_MAGIC = b"SQLite format 3\x00"
#: Views every rocpd database has
_VIEWS = {"rocpd_kernel_dispatch", "rocpd_info_agent", "rocpd_event", "rocpd_string", "rocpd_region"}
#: API categories (rocpd_event.category_id) by prefix -> slices.kind, as the JSON reader's domains
_API_KINDS = {"HIP_": "runtime", "HSA_": "driver", "MARKER_": "user_annotation", "RCCL_": "cpu_op"}


def detect(path: Path, head: bytes) -> bool:
    from .ascend_db import tables

    return head.startswith(_MAGIC) and _VIEWS <= tables(path)


def is_companion(path: Path) -> bool:
    """A database beside the JSON export of the same process (`--output-format rocpd json`): the JSON is read (it
    keeps what the database drops: the name of a call without a duration)."""
    stem = path.name[:-len(".db")] if path.name.endswith(SUFFIXES) else None
    return stem is not None and any((path.parent / f"{stem}{s}").exists() for s in rocprof.SUFFIXES_OF_STEM)


def api_kind(category: str | None) -> str | None:
    return next((kind for prefix, kind in _API_KINDS.items() if (category or "").startswith(prefix)), None)


def read(path: Path, threads: int | None = None) -> TraceData:
    return read_sqlite(path, "rocpd database", lambda con: _read(path, con))


def _extdata(text) -> dict:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# Each record's process (pid), thread (tid), event (correlation ids, category) by id and guid.
_JOINS = """
    LEFT JOIN rocpd_info_process P ON P.id = X.pid AND P.guid = X.guid
    LEFT JOIN rocpd_info_thread T ON T.id = X.tid AND T.guid = X.guid
    LEFT JOIN rocpd_event E ON E.id = X.event_id AND E.guid = X.guid
    LEFT JOIN rocpd_string C ON C.id = E.category_id AND C.guid = E.guid"""
_COMMON = "X.start, X.\"end\", COALESCE(P.pid, X.pid), COALESCE(T.tid, X.tid), C.string, E.stack_id, E.correlation_id"
_KERNELS = f"""
SELECT {_COMMON}, X.guid, X.agent_id, X.queue_id, X.stream_id, S.display_name, S.kernel_name, X.dispatch_id,
    X.kernel_id, X.grid_size_x, X.grid_size_y, X.grid_size_z, X.workgroup_size_x, X.workgroup_size_y,
    X.workgroup_size_z, X.private_segment_size, X.group_segment_size, S.sgpr_count, S.arch_vgpr_count,
    S.accum_vgpr_count
FROM rocpd_kernel_dispatch X {_JOINS}
    LEFT JOIN rocpd_info_kernel_symbol S ON S.id = X.kernel_id AND S.guid = X.guid"""
_COPIES = f"""
SELECT {_COMMON}, X.guid, N.string, X.size, X.src_agent_id, X.dst_agent_id, X.stream_id
FROM rocpd_memory_copy X {_JOINS}
    LEFT JOIN rocpd_string N ON N.id = X.name_id AND N.guid = X.guid"""
_REGIONS = f"""
SELECT {_COMMON}, N.string, E.extdata
FROM rocpd_region X {_JOINS}
    LEFT JOIN rocpd_string N ON N.id = X.name_id AND N.guid = X.guid"""
# a sample is an instant on its track (the thread and category of a call without a duration)
_SAMPLES = """
SELECT X.timestamp, X.timestamp, COALESCE(P.pid, K.pid), COALESCE(T.tid, K.tid), C.string, E.stack_id,
    E.correlation_id, NULL, E.extdata
FROM rocpd_sample X JOIN rocpd_track K ON K.id = X.track_id AND K.guid = X.guid
    LEFT JOIN rocpd_info_process P ON P.id = K.pid AND P.guid = K.guid
    LEFT JOIN rocpd_info_thread T ON T.id = K.tid AND T.guid = K.guid
    LEFT JOIN rocpd_event E ON E.id = X.event_id AND E.guid = X.guid
    LEFT JOIN rocpd_string C ON C.id = E.category_id AND C.guid = E.guid"""


def _read(path: Path, con: sqlite3.Connection) -> TraceData:
    from .ascend_db import tables

    present = tables(path)
    gpus: dict[tuple, int] = {}  # (guid, agent id) -> device id
    devices: dict[int, dict] = {}
    for guid, id_, type_, type_index, name, product, extdata in con.execute(
            "SELECT guid, id, type, type_index, name, product_name, extdata FROM rocpd_info_agent"):
        agent = _extdata(extdata) or {"logical_node_type_id": type_index, "node_id": id_, "name": name,
                                      "product_name": product}
        if type_ == "GPU":
            device = rocprof.agent_device_id(agent)
            gpus[(guid, id_)] = device
            devices.setdefault(device, rocprof.agent_device(device, agent))
    skipped: dict[str, int] = {}
    unread: dict[str, int] = {}

    def span(start, end, what: str):
        start, end = _int(start), _int(end)
        if start is None or end is None or end < start:
            skipped[f"{what} without a start and end"] = skipped.get(f"{what} without a start and end", 0) + 1
            return None
        return start, end - start

    def rows():
        for (start, end, pid, tid, category, internal, external, guid, agent, queue, stream, display, symbol,
             dispatch, kernel, *sizes) in con.execute(_KERNELS):
            times, device = span(start, end, "kernel dispatch"), gpus.get((guid, agent))
            if times is None:
                continue
            if device is None:
                skipped["kernel dispatch on an unknown agent"] = skipped.get("kernel dispatch on an unknown agent",
                                                                              0) + 1
                continue
            grid, workgroup, (private, group, sgpr, arch_vgpr, accum_vgpr) = sizes[:3], sizes[3:6], sizes[6:]
            name = (display or symbol or f"kernel {kernel}")[:MAX_NAME_CHARS]
            yield dict(kind="kernel", category=category, name=name,
                       ts=times[0], dur=times[1], pid=_int(pid), tid=_int(tid), device_id=device, stream=_int(queue),
                       track=f"device {device} / stream {queue}", correlation=_int(internal) or 0,
                       external_id=_int(external) or None,
                       args=json.dumps({"dispatch_id": dispatch, "kernel_id": kernel, "queue": queue,
                                        "hip_stream": stream, "grid_size": grid, "workgroup_size": workgroup,
                                        "private_segment_size": private, "group_segment_size": group,
                                        "sgpr_count": sgpr, "arch_vgpr_count": arch_vgpr,
                                        "accum_vgpr_count": accum_vgpr}, separators=(",", ":")))
        if "rocpd_memory_copy" in present:
            for (start, end, pid, tid, category, internal, external, guid, name, size, src, dst,
                 stream) in con.execute(_COPIES):
                times = span(start, end, "memory copy")
                device = gpus.get((guid, dst), gpus.get((guid, src)))
                if times is None or device is None:
                    if times is not None:
                        skipped["memory copy between no GPUs"] = skipped.get("memory copy between no GPUs", 0) + 1
                    continue
                stream = -1 if _int(stream) is None else stream
                yield dict(kind="memcpy", category=category, name=name, ts=times[0], dur=times[1], pid=_int(pid),
                           tid=_int(tid), device_id=device, stream=stream, track=f"device {device} / stream {stream}",
                           correlation=_int(internal) or 0, external_id=_int(external) or None,
                           args=json.dumps({"bytes": size, "src_agent": src, "dst_agent": dst}, separators=(",", ":")))
        for query, table in ((_REGIONS, "rocpd_region"), (_SAMPLES, "rocpd_sample")):
            if table not in present:
                continue
            for start, end, pid, tid, category, internal, external, name, extdata in con.execute(query):
                kind = api_kind(category)
                if kind is None:
                    unread[category or "unnamed"] = unread.get(category or "unnamed", 0) + 1
                    continue
                times = span(start, end, "API call")
                if times is None:
                    continue
                message = _extdata(extdata).get("message") if kind == "user_annotation" else None
                yield dict(kind=kind, category=category,
                           name=str(message or name or category)[:MAX_NAME_CHARS], ts=times[0], dur=times[1],
                           pid=_int(pid), tid=_int(tid), track=f"process {pid} / thread {tid}",
                           correlation=_int(internal) or 0, external_id=_int(external) or None)

    out = RowBatches(pa.schema(READER_SLICE_TYPES), numbered="slice_id")

    def batches():
        for row in rows():
            batch = out.add(row, len(row["name"]) + len(row["track"]) + len(row.get("args") or ""))
            if batch is not None:
                yield batch
        yield out.take()

    with tempfile.TemporaryDirectory(prefix="tracesql-") as scratch:
        slices = mapped_slices(Path(scratch) / "slices.arrows", batches())
    if not out.rows:
        raise TraceError(path, "no timed records (no kernel dispatch, memory copy or API call)")
    for table, what in (("rocpd_memory_allocate", "memory allocation"), ("rocpd_pmc_event", "counter value")):
        if table in present:
            count = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
            if count:
                unread[what] = count
    processes = [{"pid": pid, "command": command, "init_time": init, "fini_time": fini}
                 for pid, command, init, fini in con.execute("SELECT pid, command, init, fini FROM rocpd_info_process")]
    host = next(iter(con.execute("SELECT hostname FROM rocpd_info_node")), (None,))[0] \
        if "rocpd_info_node" in present else None
    return TraceData(
        format=FORMAT, slices=slices.table(), host_name=host,
        event_count=out.rows + sum(skipped.values()) + sum(unread.values()), skipped=skipped,
        notes=[f"{n} {what} records not kept (no table for them yet)" for what, n in unread.items()],
        metadata={"processes": processes},
        devices=sorted(devices.values(), key=lambda d: d["device_id"]), mappings=[slices])
