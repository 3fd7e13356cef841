"""torch_npu (Ascend NPU) profiler exports: `<name>_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json`.

`torch_npu.profiler.profile(..., on_trace_ready=tensorboard_trace_handler(dir))` writes, per rank, a folder
`*_ascend_pt` holding `profiler_info_<rank>.json` and ASCEND_PROFILER_OUTPUT/ with the Chrome-trace timeline
`trace_view.json` and, depending on the profiler level, `kernel_details.csv`, `communication.json`,
`communication_matrix.json`, `step_trace_time.csv` and more. trace_view.json's processes (named by `process_name`
metadata; a device process's pid is `host pid << 10 | sort index << 5 | device id`):

- Python: the framework's cpu_op / python_function / Enqueue / Dequeue events (Kineto's argument names, lists
  written as ';\\r\\n'-separated text), and `torch_to_npu` flows from an op to the device task it caused;
- CANN: AscendCL / Node / Hccl / Runtime calls of the CANN stack per host thread, each with a `connection_id`;
- Ascend Hardware: the device tasks per stream (`Task Type` AI_CORE, AI_VECTOR_CORE, MIX_AIC/AIV, AI_CPU,
  DSA_SQE: computing; PCIE_DMA_SQE, SDMA_SQE, MEMCPY_ASYNC: copies; EVENT/NOTIFY/PLACE_HOLDER: synchronisation),
  with the `connection_id` of the CANN call that launched them;
- HCCL: per communication group the collective operations (`hcom_allReduce__586_0_1`, thread 'Group N
  Communication') and their tasks on planes (transfers, notifies: the detail of the operation);
- Overlap Analysis: torch_npu's own Computing / Communication / Communication(Not Overlapped) / Free lanes;
- counters (HBM, LLC, NPU MEM, AI Core Freq, ...).

Read as: framework events as Kineto's; CANN calls as runtime calls (correlation = connection_id); device tasks as
kernels, copies or syncs on the NPU (device id from the pid), launched by the framework op their torch_to_npu flow
comes from (a zero-length `torch_to_npu` runtime slice at the flow's start, inside the op: ops, steps and
collective calls get their device time) or, without a flow, by their CANN call; HCCL operations as communication
kernels on the HCCL stream (their hardware and plane tasks as `gpu_annotation`: detail, not counted twice), with
the group, size and dtype from communication.json; Overlap Analysis lanes as kind 'other' (kept to compare with,
not device work). `kernel_details.csv` adds each task's shapes, formats and core type to its args;
`step_trace_time.csv` is kept in `ranks.metadata` (torch_npu's own per-step overlap figures).
"""

from __future__ import annotations

import csv
import json
import math
import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

from ..errors import TraceError

FORMAT = "torch_npu"
SUFFIXES = ("trace_view.json", "trace_view.json.gz")
#: Files of a torch_npu export that are not traces of their own (skipped when a folder is ingested)
COMPANIONS = re.compile(r"^(communication(_matrix)?|profiler_info(_\d+)?|profiler_metadata|cluster_communication"
                        r"(_matrix)?)\.json$")

_COMPUTE_TASKS = {"AI_CORE", "AI_VECTOR_CORE", "AIV", "AIC", "MIX_AIC", "MIX_AIV", "AI_CPU", "DSA_SQE",
                  "FFTS_PLUS", "AIV_SQE", "AIC_SQE", "AI_CPU_SQE"}
_COPY_TASKS = {"PCIE_DMA_SQE", "SDMA_SQE", "MEMCPY_ASYNC", "MEMCPY", "SDMA"}
_KINDS = {"cpu_op": "cpu_op", "python_function": "python_function", "user_annotation": "user_annotation",
          "gpu_user_annotation": "gpu_annotation", "enqueue": "other", "dequeue": "other"}
_DEVICE_PROCESSES = ("Ascend Hardware", "HCCL")
MAX_NS = 2**61  # times (ns) beyond this cannot be summed safely (readers.MAX_TS_NS / MAX_DUR_NS)
MAX_ID = 2**63 - 1


def detect(path: Path, head: bytes) -> bool:
    if not path.name.endswith(SUFFIXES):
        return False
    text = head.lstrip()
    return text[:1] in (b"[", b"{") and (path.parent.name == "ASCEND_PROFILER_OUTPUT" or any(
        k in head for k in (b'"Ascend Hardware"', b"AscendCL@", b'"torch_to_npu"', b'"CANN"')))


def is_companion(path: Path) -> bool:
    """A file of the export that only completes trace_view.json (read with it, never on its own): anything in a
    `*_ascend_pt` folder but its trace_view.json (the raw PROF_* data, msprof's own JSON timeline of the same
    events, FRAMEWORK/ files), and the companions of a trace_view.json in ASCEND_PROFILER_OUTPUT/."""
    if path.name.endswith(SUFFIXES):
        return False
    return any(p.name.endswith("_ascend_pt") for p in path.parents) or (
        bool(COMPANIONS.match(path.name)) and path.parent.name == "ASCEND_PROFILER_OUTPUT")


def _ns(value) -> int | None:
    """µs as written (a number, or text with ns digits) -> integer ns, exactly."""
    if value is None:
        return None
    try:
        return int((Decimal(value if isinstance(value, str) else repr(value)) * 1000).to_integral_value())
    except (InvalidOperation, ValueError):
        return None


def _listed(text, numbers: bool):
    """torch_npu's 'a;\\r\\nb' argument lists -> JSON lists (dims: lists of ints) as Kineto writes them."""
    if not isinstance(text, str):
        return text
    parts = [p.strip() for p in text.split(";")]
    if numbers:
        return [[int(d) for d in p.split(",") if d.strip().lstrip("-").isdigit()] for p in parts]
    return parts


#: What holding a trace_view.json's events takes, at most, per byte of JSON: json.loads' objects, each event
#: cleaned in place, the lists and dictionaries built over them (measured: 7-11x for real events, up to 33x for
#: a document of minimal events `{"ph":"X"}`). The files read whole share --memory-limit / HELD_RATIO bytes.
HELD_RATIO = 36


def _reader(path: Path):
    """A function reading a file of the export whole (the trace, then its companions): together they may hold at
    most whole_read_bytes(HELD_RATIO) bytes of content; what goes beyond is refused in one line."""
    from .common import read_bytes, whole_read_bytes

    left = whole_read_bytes(HELD_RATIO)

    def read(file: Path) -> bytes:
        nonlocal left
        data = read_bytes(file, max(left, 0), "the trace" if file == path else f"with its companion {file.name}, the"
                                                                               " export")
        left -= len(data)
        return data

    return read


def _read_json(path: Path, read_bytes):
    try:
        return json.loads(read_bytes(path))
    except (ValueError, UnicodeDecodeError) as e:
        raise TraceError(path, f"not valid JSON: {e}") from None


def _companion(output: Path, *names: str) -> Path | None:
    for name in names:
        for p in (output / name, output / (name + ".gz")):
            if p.is_file():
                return p
    return None


def read(path: Path, threads: int | None = None):
    from .common import SliceColumns, TraceData, counters_from_columns

    read_bytes = _reader(path)
    doc = _read_json(path, read_bytes)
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    del doc
    if not isinstance(events, list):
        raise TraceError(path, "not a torch_npu trace_view.json: no list of events")
    readable = [_clean(e) for e in events]
    malformed = [e for e, ok in zip(events, readable) if not ok]
    events = [e for e, ok in zip(events, readable) if ok] if malformed else events
    del readable
    output = path.parent
    root = output.parent if output.name == "ASCEND_PROFILER_OUTPUT" else output
    info = _profiler_info(root, read_bytes)
    groups, op_groups = _communication(output, read_bytes)
    details = _kernel_details(output, read_bytes)

    process, threads_, process_label = {}, {}, {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M":
            args = e.get("args") or {}
            if e.get("name") == "process_name":
                process[e.get("pid")] = args.get("name")
            elif e.get("name") == "thread_name":
                threads_[(e.get("pid"), e.get("tid"))] = args.get("name")
            elif e.get("name") == "process_labels":
                process_label[e.get("pid")] = args.get("labels")
    hccl_streams = {(e["pid"], _int(e["args"].get("stream id"))) for e in events
                    if e["ph"] == "X" and process.get(e["pid"]) == "HCCL" and _int(e["args"].get("stream id")) is not None}
    hccl_stream_of = {}
    for pid, stream in hccl_streams:
        hccl_stream_of.setdefault(pid, set()).add(stream)
    comm_streams = {(pid & 31, s) for pid, s in hccl_streams}

    # torch_to_npu flows: the device task (by process, thread, start) -> the flow id, and where each flow starts
    flow_end, flow_start = {}, {}
    for e in events:
        ts = _ns(e.get("ts")) if e.get("cat") == "async_npu" and e["ph"] in ("s", "f") else None
        if ts is not None and abs(ts) < MAX_NS and _int(e.get("id")) is not None:
            key = (e["pid"], e["tid"], ts)
            if e["ph"] == "f":
                flow_end[key] = _int(e["id"])
            else:
                flow_start[_int(e["id"])] = key

    out = SliceColumns()
    counters = {"name": [], "series": [], "track": [], "device_id": [], "ts": [], "value": []}
    skipped: dict[str, int] = {}
    examples: dict[str, str] = {}
    devices: set[int] = set()
    launched_flows = set()

    def skip(reason, e):
        skipped[reason] = skipped.get(reason, 0) + 1
        examples.setdefault(reason, repr(e)[:300])

    for e in malformed:
        skip("malformed event", e)

    def label(pid, tid):
        return f"{process.get(pid) or pid} / {threads_.get((pid, tid)) or f'thread {tid}'}"

    for e in events:
        ph = e["ph"]
        if ph in ("M", "s", "f", "t"):
            continue
        pid, tid, name = e.get("pid"), e.get("tid"), e.get("name")
        ts = _ns(e.get("ts"))
        if ts is None:
            skip("missing or non-numeric ts", e)
            continue
        if abs(ts) >= MAX_NS:
            skip("time out of range", e)
            continue
        proc = process.get(pid)
        args = e.get("args") or {}
        if ph == "C":
            device = pid & 31 if isinstance(pid, int) and process_label.get(pid) == "NPU" else None
            for series, value in args.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    counters["name"].append(name)
                    counters["series"].append(series)
                    counters["track"].append(proc or str(pid))
                    counters["device_id"].append(device)
                    counters["ts"].append(ts)
                    counters["value"].append(float(value))
            continue
        if ph != "X":
            skip("unsupported phase", e)
            continue
        dur = _ns(e.get("dur"))
        if dur is None or dur < 0:
            skip("missing dur" if dur is None else "end before start", e)
            continue
        if dur >= MAX_NS:
            skip("time out of range", e)
            continue
        row = dict(name=name, ts=ts, dur=dur, pid=pid, tid=tid, track=label(pid, tid))
        if proc in _DEVICE_PROCESSES:
            device = pid & 31
            devices.add(device)
            row.update(device_id=device)
            flow = flow_end.get((pid, tid, ts))
            if flow is not None and flow in flow_start:
                launched_flows.add(flow)
            link = flow if flow is not None and flow in flow_start else args.get("connection_id")
            thread = str(threads_.get((pid, tid)) or "")
            if proc == "Ascend Hardware":
                task = args.get("Task Type")
                stream = _int(args.get("Physic Stream Id"))
                stream = tid if stream is None else stream
                if (device, stream) in comm_streams:  # the hardware tasks of an HCCL operation: its detail
                    kind, category = "gpu_annotation", "hccl_task"
                elif task in _COMPUTE_TASKS:
                    kind, category = "kernel", "ascend_hardware"
                elif task in _COPY_TASKS or name in _COPY_TASKS:
                    kind, category = "memcpy", "ascend_hardware"
                else:
                    kind, category = "sync", "ascend_hardware"
                extra = details.get((stream, args.get("Task Id"), ts))
                if extra:
                    args = {**args, **extra}
                row.update(kind=kind, category=category, stream=stream, correlation=_int(link),
                           track=f"NPU {device} / stream {stream}")
            elif thread.endswith("Communication") or args.get("alg_type") is not None:  # an HCCL operation
                streams = hccl_stream_of.get(pid, set())
                stream = next(iter(streams)) if len(streams) == 1 else 10_000 + tid
                group = op_groups.get(name)
                args = {**args, "Collective name": name, "dtype": args.get("data_type"),
                        "In msg nelems": args.get("count"), "Out msg nelems": args.get("count")}
                if group:
                    args.update({"Process Group Name": group, "Group size": groups[group]["group_size"]})
                row.update(kind="kernel", category="hccl", stream=stream, correlation=_int(link),
                           track=f"NPU {device} / {thread or 'HCCL'}")
            else:  # an HCCL plane task: detail of the operation above it
                stream = _int(args.get("stream id"))
                stream = 10_000 + tid if stream is None else stream
                row.update(kind="gpu_annotation", category="hccl_task", stream=stream,
                           track=f"NPU {device} / HCCL {thread or tid}")
        elif proc == "CANN":
            row.update(kind="runtime", category=f"cann_{args.get('level') or 'api'}",
                       correlation=_int(args.get("connection_id")))
        elif proc == "Overlap Analysis":
            row.update(kind="other", category="overlap_analysis")
        else:
            cat = e.get("cat")
            row.update(kind=_KINDS.get(cat, "other" if cat else "user_annotation"), category=cat)
            if "Input Dims" in args or "Input type" in args:
                args = dict(args)
                if "Input Dims" in args:
                    args["Input Dims"] = _listed(args["Input Dims"], numbers=True)
                if "Input type" in args:
                    args["Input type"] = _listed(args["Input type"], numbers=False)
        row["args"] = _json(args)
        out.add(**row)

    # the framework op each task came from: a zero-length launch where its torch_to_npu flow starts
    for flow in sorted(launched_flows, key=lambda f: flow_start[f][2]):
        pid, tid, ts = flow_start[flow]
        out.add(kind="runtime", category="async_npu", name="torch_to_npu", ts=ts, dur=0, pid=pid, tid=tid,
                track=label(pid, tid), correlation=_int(flow))

    rank = info.get("rank_id")
    metadata = {"profiler_info": info.get("config"), "step_trace_time": _step_trace_time(output, read_bytes)}
    return TraceData(
        format=FORMAT, slices=out.table(), rank=rank if isinstance(rank, int) and rank >= 0 else None,
        backend="hccl" if groups or any(p == "HCCL" for p in process.values()) else None,
        event_count=len(events), skipped=skipped, examples=examples, metadata=metadata,
        devices=[{"device_id": d, "properties": {"vendor": "Huawei", "type": "NPU", "source": "torch_npu"}}
                 for d in sorted(devices)],
        process_groups=[{"pg_name": g, "pg_desc": None, "backend": "hccl", **v} for g, v in sorted(groups.items())],
        counters=counters_from_columns(counters) if counters["ts"] else None,
    )


def _int(value) -> int | None:
    """An id as a BIGINT, or None (text, floats, out of range)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    return value if isinstance(value, int) and -MAX_ID <= value <= MAX_ID else None


def _clean(e) -> bool:
    """Whether the event can be read: then it is made so in place (pid and tid integers, name text or None, args
    an object); a malformed event is left as it is. Idempotent: a cleaned event stays so."""
    if not isinstance(e, dict) or not isinstance(e.get("ph"), str):
        return False
    pid, tid = _int(e.get("pid", 0)), _int(e.get("tid", 0))
    if pid is None or tid is None:
        return False
    name = e.get("name")
    args = e.get("args")
    e.update(pid=pid, tid=tid, name=name if isinstance(name, str) or name is None else str(name),
             args=args if isinstance(args, dict) else {})
    return True


def _json(args: dict) -> str | None:
    """args as JSON text (non-finite numbers, which JSON has no word for, as null)."""
    if not args:
        return None
    try:
        return json.dumps(args, allow_nan=False, default=str)
    except ValueError:
        return json.dumps(_finite(args), default=str)


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _profiler_info(root: Path, read_bytes) -> dict:
    """profiler_info_<rank>.json: the rank and the profiler's configuration (none when it cannot be read)."""
    from .common import TooLarge

    for p in sorted(root.glob("profiler_info*.json")):
        try:
            return json.loads(read_bytes(p))
        except TooLarge:
            raise
        except (TraceError, ValueError):
            return {}
    return {}


def _step_ops(path: Path | None, read_bytes):
    """(op key, its value) of each operation of each kind of each step of communication(_matrix).json."""
    if not path:
        return
    try:
        doc = json.loads(read_bytes(path))
    except ValueError:
        return
    for step in doc.values() if isinstance(doc, dict) else ():
        for kind in step.values() if isinstance(step, dict) else ():
            yield from kind.items() if isinstance(kind, dict) else ()


def _communication(output: Path, read_bytes) -> tuple[dict, dict]:
    """From communication_matrix.json / communication.json: each group (name -> group_size, group_ranks from the
    ranks its links name) and each HCCL operation's group (op name -> group name)."""
    groups: dict[str, set] = {}
    op_groups: dict[str, str] = {}
    for op, links in _step_ops(_companion(output, "communication_matrix.json"), read_bytes):
        group = op.rpartition("@")[2]
        for link, detail in links.items() if isinstance(links, dict) else ():
            ranks = [int(r) for r in link.split("-") if r.isdigit()]
            groups.setdefault(group, set()).update(ranks)
            if isinstance(detail, dict) and detail.get("Op Name"):
                op_groups[detail["Op Name"]] = group
    for op, _ in _step_ops(_companion(output, "communication.json"), read_bytes):
        name, _, group = op.rpartition("@")
        if name and group:
            op_groups[name] = group
            groups.setdefault(group, set())
    return ({g: {"group_size": len(r) or None, "group_ranks": sorted(r) or None} for g, r in groups.items()},
            op_groups)


def _kernel_details(output: Path, read_bytes) -> dict:
    """kernel_details.csv: (stream, task id, start ns) -> the task's shapes, formats, core type (its args)."""
    path = _companion(output, "kernel_details.csv")
    if not path:
        return {}
    out = {}
    keep = ("Type", "Accelerator Core", "Block Dim", "Input Shapes", "Input Data Types", "Input Formats",
            "Output Shapes", "Output Data Types", "Output Formats", "Step Id")
    try:
        rows = csv.DictReader(read_bytes(path).decode("utf-8", "replace").splitlines())
        for r in rows:
            stream, task, start = _int(r.get("Stream ID")), _int(r.get("Task ID")), _ns((r.get("Start Time(us)") or "").strip())
            if start is not None:
                out[(stream, task, start)] = {k: (r.get(k) or "").strip('"') for k in keep if r.get(k) not in (None, "N/A")}
    except csv.Error:
        return {}
    return out


def _step_trace_time(output: Path, read_bytes) -> list[dict] | None:
    """step_trace_time.csv: torch_npu's per-step Computing / Communication / Overlapped / Free (µs)."""
    path = _companion(output, "step_trace_time.csv")
    if not path:
        return None
    try:
        return [dict(r) for r in csv.DictReader(read_bytes(path).decode("utf-8", "replace").splitlines())]
    except csv.Error:
        return None
