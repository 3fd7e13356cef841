"""torch_npu profiler exports as one SQLite database (`export_type=db`):
`<name>_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_<rank>.db`.

The same run as the text export (readers/ascend.py) in tables whose text columns are ids into STRING_IDS, times
integer ns (PYTORCH_API's as text), host threads `globalTid` = pid << 32 | tid. Read as the text export is:

- PYTORCH_API: framework ops (type op), torch_npu's task queue (queue: Enqueue / Dequeue), Python functions
  (trace), mstx ranges (mstx); an op's `connectionId` names, in CONNECTION_IDS, the device tasks it caused: a
  zero-length `torch_to_npu` runtime slice at the op's start launches them (the text export's torch_to_npu flows);
- CANN_API: CANN calls as runtime calls, category `cann_<level>`, correlation = connectionId (launching the
  tasks no op names);
- TASK: device tasks; a task COMPUTE_TASK_INFO describes is a kernel (named by it, its task type and shapes in
  args), a task of COMMUNICATION_TASK_INFO an HCCL operation's detail (`gpu_annotation`), a copy task a memcpy,
  any other a synchronisation;
- COMMUNICATION_OP: HCCL operations as communication kernels on their tasks' stream, with dtype and count;
- MEMORY_RECORD / OP_MEMORY / NPU_MODULE_MEM: `memory`, as the text export's memory files;
- NPU_INFO, RANK_DEVICE_MAP: the device's name and the rank.

Rows are read with Python's sqlite3 a query at a time and streamed to a memory-mapped scratch file.
"""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pyarrow as pa

from . import ascend
from .common import READER_SLICE_TYPES, RowBatches, TraceData, mapped_slices, read_sqlite, sqlite_int

FORMAT = "torch_npu_db"
SUFFIXES = (".db",)
_MAGIC = b"SQLite format 3\x00"
#: Tables every torch_npu database has
_TABLES = {"STRING_IDS", "TASK", "CANN_API", "PYTORCH_API"}
_API_KINDS = {"op": "cpu_op", "queue": "other", "trace": "python_function", "mstx": "user_annotation"}
_COPY_TASKS = {"MEMCPY_ASYNC", "PCIE_DMA_SQE", "SDMA_SQE", "MEMCPY", "SDMA"}


def tables(path: Path) -> set[str]:
    """The tables and views of an SQLite file (empty when it cannot be opened as one)."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        try:
            return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}
        finally:
            con.close()
    except sqlite3.Error:
        return set()


def detect(path: Path, head: bytes) -> bool:
    return head.startswith(_MAGIC) and _TABLES <= tables(path)


def is_companion(path: Path) -> bool:
    """analysis.db beside the export's database: torch_npu's own analyses of the same run."""
    return path.name == "analysis.db" and path.parent.name == "ASCEND_PROFILER_OUTPUT"


def _split_ids(global_tid):
    return (global_tid >> 32, global_tid & 0xFFFFFFFF) if _int(global_tid) is not None else (None, None)


_int = sqlite_int


def _span(start, end) -> tuple[int, int] | None:
    """(ts, dur) of a row's startNs / endNs, or None when they are no times."""
    start, end = _int(start), _int(end)
    return (start, end - start) if start is not None and end is not None and end >= start else None


def read(path: Path, threads: int | None = None) -> TraceData:
    return read_sqlite(path, "torch_npu database", lambda con: _read(path, con))


def _read(path: Path, con: sqlite3.Connection) -> TraceData:
    present = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    string = {i: None if v is None else str(v) for i, v in con.execute("SELECT id, value FROM STRING_IDS")}

    def enum(table: str) -> dict:
        return dict(con.execute(f"SELECT id, name FROM {table}")) if table in present else {}

    def select(table: str, columns: str, order: str = "") -> sqlite3.Cursor:
        """The columns of `table`, NULL for those this version of the schema lacks (COMMUNICATION_OP gained
        dataType and count, COMPUTE_TASK_INFO its shapes, in later CANN versions)."""
        have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
        listed = ", ".join(c if c in have else f"NULL AS {c}" for c in (c.strip() for c in columns.split(",")))
        return con.execute(f"SELECT {listed} FROM {table} {order}")

    api_type, data_type, module = enum("ENUM_API_TYPE"), enum("ENUM_HCCL_DATA_TYPE"), enum("ENUM_MODULE")
    rank = next(iter(con.execute("SELECT rankId FROM RANK_DEVICE_MAP")), (None,))[0] \
        if "RANK_DEVICE_MAP" in present else None
    npu = dict(con.execute("SELECT id, name FROM NPU_INFO")) if "NPU_INFO" in present else {}
    connections: dict[int, list[int]] = {}
    if "CONNECTION_IDS" in present:
        for id_, connection in con.execute("SELECT id, connectionId FROM CONNECTION_IDS"):
            connections.setdefault(id_, []).append(connection)
    devices: set[int] = set()
    skipped: dict[str, int] = {}

    def timed(start, end, what: str):
        span = _span(start, end)
        if span is None:
            skipped[f"{what} without a start and end"] = skipped.get(f"{what} without a start and end", 0) + 1
        return span

    def rows():
        # the framework's events, each op's launches right after it (numbered before the CANN calls: a task named
        # by both is launched by the op, as the text export's flow says)
        for start, end, gtid, connection, name, seq, dtypes, shapes, type_ in con.execute(
                "SELECT CAST(startNs AS INTEGER), CAST(endNs AS INTEGER), globalTid, connectionId, name, "
                "sequenceNumber, inputDtypes, inputShapes, type FROM PYTORCH_API ORDER BY 1, 2 DESC"):
            span = timed(start, end, "PYTORCH_API row")
            if span is None:
                continue
            pid, tid = _split_ids(gtid)
            text = string.get(name)
            kind_name = api_type.get(type_)
            kind = _API_KINDS.get(kind_name, "other")
            track = f"Python / Thread {tid}"
            args = {"Sequence number": seq}
            if shapes is not None:
                args["Input Dims"] = ascend.listed(string.get(shapes), numbers=True)
            if dtypes is not None:
                args["Input type"] = ascend.listed(string.get(dtypes), numbers=False)
            category = (text or "").lower() if kind_name == "queue" else kind
            yield dict(kind=kind, category=category, name=text, ts=span[0], dur=span[1], pid=pid, tid=tid,
                       track=track, args=ascend.json_args({k: v for k, v in args.items() if v is not None}))
            for launched in connections.get(connection, ()) if kind == "cpu_op" else ():
                yield dict(kind="runtime", category="async_npu", name="torch_to_npu", ts=span[0], dur=0, pid=pid,
                           tid=tid, track=track, correlation=_int(launched))
        for start, end, type_, gtid, connection, name in con.execute(
                "SELECT startNs, endNs, type, globalTid, connectionId, name FROM CANN_API ORDER BY 1"):
            span = timed(start, end, "CANN_API row")
            if span is None:
                continue
            pid, tid = _split_ids(gtid)
            yield dict(kind="runtime", category=f"cann_{api_type.get(type_) or 'api'}", name=string.get(name),
                       ts=span[0], dur=span[1], pid=pid, tid=tid, track=f"CANN / Thread {tid}",
                       correlation=_int(connection))
        compute = {}
        if "COMPUTE_TASK_INFO" in present:
            for task, name, type_, op_type, block, in_shapes, in_types, out_shapes, out_types in select(
                    "COMPUTE_TASK_INFO", "globalTaskId, name, taskType, opType, blockDim, inputShapes, "
                    "inputDataTypes, outputShapes, outputDataTypes"):
                compute[task] = (string.get(name), {
                    "Task Type": string.get(type_), "Type": string.get(op_type), "Block Dim": block,
                    "Input Shapes": string.get(in_shapes), "Input Data Types": string.get(in_types),
                    "Output Shapes": string.get(out_shapes), "Output Data Types": string.get(out_types)})
        comm_tasks = {}
        if "COMMUNICATION_TASK_INFO" in present:
            comm_tasks = {task: (string.get(name), op) for task, name, op in con.execute(
                "SELECT globalTaskId, name, opId FROM COMMUNICATION_TASK_INFO")}
        op_stream: dict[int, int] = {}
        for start, end, device, connection, task, type_, stream, task_id in con.execute(
                "SELECT startNs, endNs, deviceId, connectionId, globalTaskId, taskType, streamId, taskId FROM TASK "
                "ORDER BY 1"):
            span, device, stream = timed(start, end, "TASK row"), _int(device), _int(stream)
            if span is None:
                continue
            if device is not None and 0 <= device < 2**31:
                devices.add(device)
            else:
                device = None
            task_type = string.get(type_)
            args = {"Task Type": task_type, "Stream Id": stream, "Task Id": task_id}
            if task in compute:
                name, extra = compute[task]
                kind, category = "kernel", "ascend_hardware"
                args.update({k: v for k, v in extra.items() if v not in (None, "", "N/A")})
            elif task in comm_tasks:
                name, op = comm_tasks[task]
                kind, category = "gpu_annotation", "hccl_task"
                op_stream.setdefault(op, stream)
            else:
                name = task_type
                kind = "memcpy" if task_type in _COPY_TASKS else "sync"
                category = "ascend_hardware"
            yield dict(kind=kind, category=category, name=name, ts=span[0], dur=span[1], pid=None, tid=None,
                       device_id=device, stream=stream, track=f"NPU {device} / stream {stream}",
                       correlation=_int(connection), args=ascend.json_args(args))
        device = min(devices) if devices else None
        if "COMMUNICATION_OP" in present:
            for name, start, end, connection, group, op, dtype, count in select(
                    "COMMUNICATION_OP", "opName, startNs, endNs, connectionId, groupName, opId, dataType, count",
                    "ORDER BY 2"):
                span = timed(start, end, "COMMUNICATION_OP row")
                if span is None:
                    continue
                stream = op_stream.get(op, 10_000)
                text = string.get(name)
                yield dict(kind="kernel", category="hccl", name=text, ts=span[0], dur=span[1], device_id=device,
                           stream=stream, track=f"NPU {device} / HCCL", correlation=_int(connection),
                           args=ascend.json_args({"Collective name": text, "dtype": data_type.get(dtype),
                                                  "In msg nelems": count, "Out msg nelems": count,
                                                  "Process Group Name": string.get(group)}))
        yield from _memory(con, present, string, module)

    out = RowBatches(pa.schema(READER_SLICE_TYPES), numbered="slice_id")

    def batches():
        for row in rows():
            batch = out.add(row, len(row.get("name") or "") + len(row["track"]) + len(row.get("args") or ""))
            if batch is not None:
                yield batch
        yield out.take()

    with tempfile.TemporaryDirectory(prefix="tracesql-") as scratch:
        slices = mapped_slices(Path(scratch) / "slices.arrows", batches())
    return TraceData(
        format=FORMAT, slices=slices.table(), rank=rank if isinstance(rank, int) and rank >= 0 else None,
        backend="hccl" if "COMMUNICATION_OP" in present else None, event_count=out.rows, skipped=skipped,
        devices=[{"device_id": d, "name": None if npu.get(d) is None else str(npu[d]),
                  "properties": {"vendor": "Huawei", "type": "NPU", "source": "torch_npu"}} for d in sorted(devices)],
        mappings=[slices])


def _memory(con, present: set, string: dict, module: dict):
    """MEMORY_RECORD (each component's running totals; the database's sizes are bytes), OP_MEMORY (the op of
    each PTA record at which one allocated or freed) and NPU_MODULE_MEM: allocator slices as the text export's
    memory files give them."""
    ops = {}
    if "OP_MEMORY" in present:
        for name, size, allocated, released, device in con.execute(
                "SELECT name, size, allocationTime, releaseTime, deviceId FROM OP_MEMORY"):
            for ts, sign in ((allocated, 1), (released, -1)):
                if _int(ts) is not None and _int(size) is not None:
                    ops[(device, ts)] = (string.get(name), sign * size)
    rows = []
    if "MEMORY_RECORD" in present:
        for component, ts, allocated, reserved, device in con.execute(
                "SELECT component, timestamp, totalAllocated, totalReserved, deviceId FROM MEMORY_RECORD"):
            component, device = string.get(component), _int(device)
            if component in ascend.MEMORY_COMPONENTS and _int(ts) is not None and device is not None:
                op, size = ops.get((device, ts), (None, None)) if component == "PTA" else (None, None)
                rows.append(ascend.memory_row(device, ts, component, {
                    "Total Allocated": _int(allocated), "Total Reserved": _int(reserved), "Bytes": size,
                    "op_name": op}))
    if "NPU_MODULE_MEM" in present:
        samples = list(con.execute("SELECT moduleId, timestampNs, totalReserved, deviceId FROM NPU_MODULE_MEM"))
        held = {m for m, _, reserved, _ in samples if _int(reserved)}
        for m, ts, reserved, device in samples:
            if m in held and _int(ts) is not None and _int(device) is not None:
                rows.append(ascend.memory_row(device, ts, f"module {module.get(m, m)}",
                                              {"Total Reserved": _int(reserved)}))
    rows.sort(key=lambda row: row["ts"])
    return rows
