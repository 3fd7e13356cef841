"""rocprofv3 CSV output (`--output-format csv`, or `rocpd convert --output-format csv` of a database): one file
per domain in one folder, `<prefix>kernel_trace.csv`, `<prefix>memory_copy_trace.csv`, `<prefix>hip_api_trace.csv`,
`<prefix>hsa_api_trace.csv`, `<prefix>marker_api_trace.csv`, `<prefix>rccl_api_trace.csv`, with
`<prefix>agent_info.csv` describing the agents (the prefix is usually `<pid>_`).

The files of one prefix are one trace, read when any of them is given; in a folder, the first present in that
order is ingested and the others are its companions. Read as the JSON export is (readers/rocprof.py): kernels on
their queue, copies on their HIP stream (named by direction), API calls on their thread (markers named by their
message, as rocprofv3 writes them). Columns are found by name (ROCm 6.x files lack Stream_Id and call the sizes
Private/Group_Segment_Size; rocpd's converter adds a Guid column). Agents are "Agent <logical node id>" (rocprofv3's
default `--agent-index relative`), "GPU <n>" (`type-relative`) or, in ROCm 6.x, a bare node id: a GPU agent's
device id is its index among the GPU agents of agent_info.csv. Rows are streamed with Python's csv module.
"""

from __future__ import annotations

import csv
import json
import re
import tempfile
from pathlib import Path

import pyarrow as pa

from ..errors import TraceError
from .common import MAX_NAME_CHARS, READER_SLICE_TYPES, RowBatches, TraceData, mapped_slices
from . import rocprof
from .rocpd import api_kind

FORMAT = "rocprof_csv"
#: The trace files of one prefix, in the order the one a folder ingests is chosen
TRACE_FILES = ("kernel_trace.csv", "memory_copy_trace.csv", "hip_api_trace.csv", "hsa_api_trace.csv",
               "marker_api_trace.csv", "rccl_api_trace.csv")
AGENT_FILE = "agent_info.csv"
SUFFIXES = TRACE_FILES
_AGENT = re.compile(r"^\s*(?:(Agent|GPU|CPU)\s+)?(\d+)\s*$", re.IGNORECASE)


def _split(path: Path) -> tuple[str, str] | None:
    """(prefix, trace file kind) of a rocprofv3 CSV file name."""
    kind = next((k for k in TRACE_FILES if path.name.endswith(k)), None)
    return (path.name[:-len(kind)], kind) if kind else None


def detect(path: Path, head: bytes) -> bool:
    line = head.split(b"\n", 1)[0]
    return _split(path) is not None and b'"Start_Timestamp"' in line and b'"Correlation_Id"' in line


def is_companion(path: Path) -> bool:
    """agent_info.csv; a trace file of a prefix whose earlier file (in TRACE_FILES order) is there too; and every
    file of a prefix whose JSON export or database (`<prefix>results.json[.gz]`, `.db`) is beside them: that is
    read (the CSV files leave out a copy's thread and the external correlation ids)."""
    if path.name.endswith(AGENT_FILE):
        return True
    split = _split(path)
    if split is None:
        return False
    prefix, kind = split
    fuller = [f"{prefix}results{s}" for s in (*rocprof.SUFFIXES_OF_STEM, ".db")]
    return any((path.parent / name).exists()
               for name in fuller + [f"{prefix}{k}" for k in TRACE_FILES[:TRACE_FILES.index(kind)]])


def _int(text) -> int | None:
    try:
        value = int(text)
    except (TypeError, ValueError):
        return None
    return value if -2**62 < value < 2**62 else None


class _Agents:
    """Agent_Id text -> (device id, is a GPU) from agent_info.csv."""

    def __init__(self, path: Path | None):
        self.rows: list[dict] = []
        if path is not None and path.exists():
            with open(path, newline="", encoding="utf-8", errors="replace") as f:
                self.rows = [r for r in csv.DictReader(f)]
        gpus = sorted((r for r in self.rows if r.get("Agent_Type") == "GPU"),
                      key=lambda r: _int(r.get("Logical_Node_Id")) or 0)
        self.device = {id(r): i for i, r in enumerate(gpus)}
        self._by = {key: {_int(r.get(key)): r for r in self.rows} for key in ("Logical_Node_Id", "Node_Id")}
        self._found: dict[str, tuple[int, bool] | None] = {}

    def __call__(self, text: str) -> tuple[int, bool] | None:
        if text not in self._found:
            m = _AGENT.match(text or "")
            found = None
            if m and m.group(1) and m.group(1).upper() in ("GPU", "CPU"):
                found = (int(m.group(2)), m.group(1).upper() == "GPU")
            elif m:
                key = "Logical_Node_Id" if m.group(1) else "Node_Id"  # ROCm 6.x: the bare node id
                row = self._by[key].get(int(m.group(2)))
                found = (self.device[id(row)], True) if row is not None and id(row) in self.device else \
                    (None, False) if row is not None else (int(m.group(2)), True)  # no agent_info: its index
            self._found[text] = found
        return self._found[text]

    def devices(self) -> list[dict]:
        return [{"device_id": self.device[id(r)], "name": r.get("Product_Name") or None,
                 "compute_capability": r.get("Name") or None, "sm_count": _int(r.get("Cu_Count")), "properties": r}
                for r in self.rows if id(r) in self.device]


def read(path: Path, threads: int | None = None) -> TraceData:
    split = _split(path)
    if split is None:
        raise TraceError(path, "not a rocprofv3 CSV file (…kernel_trace.csv, …hip_api_trace.csv, ...)")
    prefix = split[0]
    files = [(path.parent / f"{prefix}{k}", k) for k in TRACE_FILES if (path.parent / f"{prefix}{k}").exists()]
    agent_file = path.parent / f"{prefix}{AGENT_FILE}"
    agents = _Agents(agent_file)
    pid = _int(prefix.rstrip("_")) if prefix.rstrip("_").isdigit() else None
    skipped: dict[str, int] = {}
    notes = [] if agent_file.exists() else [f"no {prefix}{AGENT_FILE}: device ids are rocprofv3's agent indices"]

    def skip(reason: str):
        skipped[reason] = skipped.get(reason, 0) + 1

    def rows():
        for file, kind in files:
            with open(file, newline="", encoding="utf-8", errors="replace") as f:
                reader = csv.reader(f)
                header = next(reader, None) or []
                column = {name.lower(): i for i, name in enumerate(header)}
                if "start_timestamp" not in column or "end_timestamp" not in column:
                    raise TraceError(file, "not a rocprofv3 CSV trace: no Start_Timestamp and End_Timestamp columns")

                def get(row, name, default=None):
                    i = column.get(name.lower())
                    return row[i] if i is not None and i < len(row) else default

                for row in reader:
                    start, end = _int(get(row, "Start_Timestamp")), _int(get(row, "End_Timestamp"))
                    if start is None or end is None or end < start:
                        skip(f"{kind} row without a start and end")
                        continue
                    common = dict(ts=start, dur=end - start, correlation=_int(get(row, "Correlation_Id")) or 0)
                    if kind == "kernel_trace.csv":
                        agent = agents(get(row, "Agent_Id"))
                        if agent is None or not agent[1]:
                            skip("kernel dispatch on an unknown agent")
                            continue
                        queue, stream = _int(get(row, "Queue_Id")), _int(get(row, "Stream_Id"))
                        # ROCm 7: Scratch_Size (the dispatch's) and LDS_Block_Size (the kernel's static LDS in
                        # 512-byte blocks); ROCm 6: the dispatch's Private_ and Group_Segment_Size
                        sizes = {k: _int(get(row, c)) for k, c in (
                            ("private_segment_size", "Scratch_Size"), ("lds_block_size", "LDS_Block_Size"),
                            ("group_segment_size", "Group_Segment_Size"), ("sgpr_count", "SGPR_Count"),
                            ("arch_vgpr_count", "VGPR_Count"), ("accum_vgpr_count", "Accum_VGPR_Count"))}
                        if sizes["private_segment_size"] is None:
                            sizes["private_segment_size"] = _int(get(row, "Private_Segment_Size"))
                        sizes = {k: v for k, v in sizes.items() if v is not None}
                        args = {"dispatch_id": _int(get(row, "Dispatch_Id")), "kernel_id": _int(get(row, "Kernel_Id")),
                                "queue": queue, "hip_stream": stream,
                                "grid_size": [_int(get(row, f"Grid_Size_{a}")) for a in "XYZ"],
                                "workgroup_size": [_int(get(row, f"Workgroup_Size_{a}")) for a in "XYZ"], **sizes}
                        yield dict(kind="kernel", category=get(row, "Kind"),
                                   name=(get(row, "Kernel_Name") or "")[:MAX_NAME_CHARS], pid=pid,
                                   tid=_int(get(row, "Thread_Id")), device_id=agent[0], stream=queue,
                                   track=f"device {agent[0]} / stream {queue}",
                                   args=json.dumps(args, separators=(",", ":")), **common)
                    elif kind == "memory_copy_trace.csv":
                        src, dst = agents(get(row, "Source_Agent_Id")), agents(get(row, "Destination_Agent_Id"))
                        device = next((a[0] for a in (dst, src) if a is not None and a[1]), None)
                        if device is None:
                            skip("memory copy between no GPUs")
                            continue
                        stream = _int(get(row, "Stream_Id"))
                        stream = -1 if stream is None else stream
                        yield dict(kind="memcpy", category=get(row, "Kind"), name=get(row, "Direction"), pid=pid,
                                   tid=_int(get(row, "Thread_Id")), device_id=device, stream=stream,
                                   track=f"device {device} / stream {stream}", **common)
                    else:
                        domain = get(row, "Domain")
                        api = api_kind(domain)
                        if api is None:
                            skip(f"{kind} row of another domain")
                            continue
                        row_pid, tid = _int(get(row, "Process_Id")), _int(get(row, "Thread_Id"))
                        yield dict(kind=api, category=domain, name=(get(row, "Function") or domain)[:MAX_NAME_CHARS],
                                   pid=row_pid, tid=tid, track=f"process {row_pid} / thread {tid}", **common)

    out = RowBatches(pa.schema(READER_SLICE_TYPES), numbered="slice_id")

    def batches():
        for row in rows():
            batch = out.add(row, len(row["name"] or "") + len(row["track"]) + len(row.get("args") or ""))
            if batch is not None:
                yield batch
        yield out.take()

    try:
        with tempfile.TemporaryDirectory(prefix="tracesql-") as scratch:
            slices = mapped_slices(Path(scratch) / "slices.arrows", batches())
    except (csv.Error, UnicodeDecodeError) as e:
        raise TraceError(path, f"unreadable CSV: {e}") from None
    if not out.rows:
        raise TraceError(path, "no timed records (no kernel dispatch, memory copy or API call)")
    return TraceData(format=FORMAT, slices=slices.table(), event_count=out.rows + sum(skipped.values()),
                     skipped=skipped, notes=notes, metadata={"files": [f.name for f, _ in files]},
                     devices=agents.devices(), mappings=[slices])
