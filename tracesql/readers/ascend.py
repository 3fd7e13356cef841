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
  DSA_SQE: computing; PCIE_DMA_SQE, SDMA_SQE, MEMCPY_ASYNC: copies; EVENT/NOTIFY/PLACE_HOLDER: synchronisation;
  in exports of early 2024 every task is `Other`: an operator's name is computing, a name in capitals such as
  MEMCPY_ASYNC a runtime task), with the `connection_id` of the CANN call that launched them;
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

trace_view.json is streamed (`read`): memory does not grow with its size, only with what is held for the whole
file (names, flows, companions), which is charged against --memory-limit.
"""

from __future__ import annotations

import codecs
import csv
import json
import math
import re
import tempfile
from decimal import Decimal
from pathlib import Path

import pyarrow as pa

from ..errors import TraceError
from .common import (LONE_SURROGATE, READER_COUNTER_TYPES, READER_SLICE_TYPES, Budget, FileMapping, RowBatches,
                     TooLarge, TraceData, mapped_content, mapped_slices, read_bytes)

FORMAT = "torch_npu"
SUFFIXES = ("trace_view.json", "trace_view.json.gz")
#: Files of a torch_npu export that are not traces of their own (skipped when a folder is ingested)
COMPANIONS = re.compile(r"^(communication(_matrix)?|profiler_info(_\d+)?|profiler_metadata|cluster_communication"
                        r"(_matrix)?)\.json$")

#: torch_npu's export as one SQLite database (export_type=db; readers/ascend_db.py)
DATABASE = re.compile(r"^ascend_pytorch_profiler(_\d+)?\.db$")
_COMPUTE_TASKS = {"AI_CORE", "AI_VECTOR_CORE", "AIV", "AIC", "MIX_AIC", "MIX_AIV", "AI_CPU", "DSA_SQE",
                  "FFTS_PLUS", "AIV_SQE", "AIC_SQE", "AI_CPU_SQE",
                  # msprof's names in the .db export (and CANN 8's timeline): KERNEL_AICORE, KERNEL_AIVEC, ...
                  "KERNEL_AICORE", "KERNEL_AIVEC", "KERNEL_MIX_AIC", "KERNEL_MIX_AIV", "KERNEL_AICPU"}
#: Task Type of every task in exports of early 2024 (torch_npu 2.1 with CANN 7): an operator's task then carries the
#: operator's name (aclnnAdd_AddAiCore_Add, Conv2D1), a runtime task its type in capitals (MEMCPY_ASYNC,
#: EVENT_RECORD), which is how torch_npu's own Overlap Analysis "Computing" lane of such an export tells them apart
_UNTYPED_TASK = "Other"
_RUNTIME_TASK_NAME = re.compile(r"[A-Z][A-Z0-9_]*")
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
    events, FRAMEWORK/ files) or its .db export (unless trace_view.json, the same run, is beside it), and the
    companions of a trace_view.json in ASCEND_PROFILER_OUTPUT/."""
    if path.name.endswith(SUFFIXES):
        return False
    if DATABASE.match(path.name):  # the .db export, read unless the text export of the same run is beside it
        return any((path.parent / name).is_file() for name in SUFFIXES)
    return any(p.name.endswith("_ascend_pt") for p in path.parents) or (
        bool(COMPANIONS.match(path.name)) and path.parent.name == "ASCEND_PROFILER_OUTPUT")


def _ns(value) -> int | None:
    """µs as written (a number, or text with ns digits) -> integer ns, exactly."""
    if value is None:
        return None
    try:
        ns = Decimal(value if isinstance(value, str) else repr(value)) * 1000
        if ns.is_nan():
            return None
        if abs(ns) >= MAX_NS:  # out of range (Infinity too): no integer of a million digits is built from "1e999999"
            return MAX_NS if ns > 0 else -MAX_NS
        return int(ns.to_integral_value())
    except (ArithmeticError, ValueError):  # not a number; an exponent beyond Decimal's
        return None


def listed(text, numbers: bool):
    """torch_npu's 'a;\\r\\nb' argument lists -> JSON lists (dims: lists of ints) as Kineto writes them."""
    if not isinstance(text, str):
        return text
    parts = [p.strip() for p in text.split(";")]
    if numbers:
        return [[int(d) for d in p.split(",") if d.strip().lstrip("-").isdigit()] for p in parts]
    return parts


#: What an element of trace_view.json takes to hold, at most, per character of JSON while it is parsed and read
#: (json's objects; measured up to 33x for minimal events `{"ph":"X"}`, 7-11x for real ones): one event, and the
#: other members of a `{"traceEvents": ...}` document, are held whole; beyond --memory-limit the file is refused.
#: Also what a companion file (read whole) is charged per byte.
HELD_RATIO = 36
#: Bytes of content decoded to text at a time; what is parsed is dropped, so the text held is about this much.
CHUNK_BYTES = 1 << 20
#: What a torch_to_npu flow's start or end, or an HCCL (process, stream), takes in the reader's maps (measured:
#: ~480 bytes for a flow's start, its end and its launch, dictionaries grown).
ENTRY_BYTES = 256
#: What the reader holds for the whole file is charged every CHARGE_EVENTS events (and for each metadata event).
CHARGE_EVENTS = 4096
#: An error this far before the end of the text read so far is not the text ending mid-value (a literal, a
#: number or an escape cut by the chunk's end): the document is not valid JSON.
_LOOKAHEAD = 64
_WS = re.compile(r"[ \t\n\r]*")
_COMMA = re.compile(r"[ \t\n\r]*,[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_HELD = "what the torch_npu reader holds for the whole file (process and thread names, torch_to_npu flows, " \
        "HCCL streams, companion files)"


class _Document:
    """trace_view.json (its content, memory-mapped) read as text CHUNK_BYTES at a time, and the elements of its list
    of events parsed one at a time with json's own decoder (the values json.loads gives, in its encodings; an
    element is held whole, charged to `budget`): the list at the top, or an object's "traceEvents" list (the last
    one, as json.loads keeps the last of a repeated key). Walking it again gives the same elements."""

    def __init__(self, path: Path, buf, budget):
        self.path, self.buf, self.budget = path, buf, budget
        self._decoder = codecs.getincrementaldecoder(json.detect_encoding(buf[:4]))("surrogatepass")
        self.s, self.pos, self.read = "", 0, 0  # the text held, where parsing is in it, bytes of content decoded
        self.start, self.lines, self.newline = 0, 0, -1  # before s: characters, newlines, where the last one is
        self.lists = 0  # "traceEvents" lists begun
        self.listed = False  # whether the document's list of events (the last "traceEvents") is a list
        self.size = 0  # characters of the last value parsed

    def elements(self):
        """Each element of each list of events; at the end, the whole document has been checked as JSON."""
        c = self._ws()
        if c == "[":
            self.lists, self.listed = 1, True
            yield from self._list()
        elif c == "{":
            self.pos += 1
            c = self._ws()
            while c != "}":
                if c != '"':
                    raise self._invalid("Expecting property name enclosed in double quotes", self.pos)
                key = self._value()
                if self._ws() != ":":
                    raise self._invalid("Expecting ':' delimiter", self.pos)
                self.pos += 1
                c = self._ws()
                if key == "traceEvents":
                    self.listed = c == "["
                if key == "traceEvents" and self.listed:
                    self.lists += 1
                    yield from self._list()
                else:
                    self._value()
                c = self._ws()
                if c == ",":
                    self.pos += 1
                    c = self._ws()
                    if c == "}":
                        raise self._invalid("Expecting property name enclosed in double quotes", self.pos)
                elif c != "}":
                    raise self._invalid("Expecting ',' delimiter", self.pos)
            self.pos += 1
        else:
            self._value()
        if self._ws():
            raise self._invalid("Extra data", self.pos)

    def _list(self):
        self.pos += 1
        if self._ws() == "]":
            self.pos += 1
            return
        comma = _COMMA.match
        while True:
            yield self._value()
            m = comma(self.s, self.pos)
            if m and m.end() < len(self.s):  # the usual case: `, ` and the next element's start in the text held
                self.pos = m.end()
                continue
            c = self._ws()
            if c == "]":
                self.pos += 1
                return
            if c != ",":
                raise self._invalid("Expecting ',' delimiter", self.pos)
            self.pos += 1
            self._ws()

    def _value(self):
        """The JSON value at pos, whole (pos after it); what is held to parse it is charged to the budget."""
        while True:
            s = self.s
            try:
                value, end = _DECODER.raw_decode(s, self.pos)
                if end < len(s) or self.read == len(self.buf):  # a value at the text's end may go on after it
                    self.size, self.pos = end - self.pos, end
                    return value
            except json.JSONDecodeError as e:
                if self.read == len(self.buf) or (not e.msg.startswith("Unterminated string")
                                                  and e.pos < len(s) - _LOOKAHEAD):
                    raise self._invalid(e.msg, e.pos) from None
            held = len(s) - self.pos
            self.budget.check(2 * held * HELD_RATIO, f"one event of the trace, with {_HELD},")
            while len(self.s) - self.pos < 2 * held and self._more():  # doubling: each value parsed O(1) times
                pass

    def _ws(self) -> str:
        """The next character that is not whitespace ('' at the end), pos at it."""
        while True:
            self.pos = _WS.match(self.s, self.pos).end()
            if self.pos < len(self.s):
                return self.s[self.pos]
            if not self._more():
                return ""

    def _more(self) -> bool:
        """The text before pos dropped, the next CHUNK_BYTES of content added to it; False at the end."""
        if self.read == len(self.buf):
            return False
        s, pos = self.s, self.pos
        newlines = s.count("\n", 0, pos)
        if newlines:
            self.lines += newlines
            self.newline = self.start + s.rfind("\n", 0, pos)
        self.start += pos
        chunk = self.buf[self.read:self.read + CHUNK_BYTES]
        pending = len(getattr(self._decoder, "buffer", b""))
        try:
            text = self._decoder.decode(chunk, final=self.read + len(chunk) == len(self.buf))
        except UnicodeDecodeError as e:  # json.loads' message, at the position in the whole content
            at, bad = self.read - pending + e.start, e.object[e.start:e.end]
            where = f"byte 0x{bad[0]:02x} in position {at}" if len(bad) == 1 else \
                f"bytes in position {at}-{at + len(bad) - 1}"
            raise TraceError(self.path, f"not valid JSON: '{e.encoding}' codec can't decode {where}: {e.reason}") \
                from None
        self.read += len(chunk)
        self.s, self.pos = s[pos:] + text, 0
        return True

    def _invalid(self, message: str, pos: int) -> TraceError:
        """json.loads' message for an error at `pos` of the text held, placed in the whole document."""
        at, newlines = self.start + pos, self.s.count("\n", 0, pos)
        newline = self.start + self.s.rfind("\n", 0, pos) if newlines else self.newline
        return TraceError(self.path, f"not valid JSON: {message}: line {self.lines + newlines + 1} column "
                                     f"{at - newline} (char {at})")


class _Scan:
    """What the first walk gathers from a list of events for the second: process and thread names and labels,
    the (process, stream id) of the events that have one (HCCL's, once the process names are known), the
    torch_to_npu flows, the events counted and the malformed ones. Charged to the budget as it grows."""

    def __init__(self, budget):
        self.budget, self.charged = budget, 0
        self.process, self.threads, self.process_label = {}, {}, {}
        self.streams: set[tuple] = set()
        self.flow_end, self.flow_start = {}, {}  # the device task (process, thread, start) -> the flow id; its start
        self.events = self.malformed = 0
        self.example = None

    def add(self, e, size: int) -> None:
        """One element, `size` characters of JSON."""
        if not _clean(e):
            self.malformed += 1
            self.example = self.example or repr(e)[:300]
            return
        self.events += 1
        ph = e["ph"]
        if ph == "M":
            self.budget.take(size * HELD_RATIO)
            args = e.get("args") or {}
            if e.get("name") == "process_name":
                self.process[e.get("pid")] = args.get("name")
            elif e.get("name") == "thread_name":
                self.threads[(e.get("pid"), e.get("tid"))] = args.get("name")
            elif e.get("name") == "process_labels":
                self.process_label[e.get("pid")] = args.get("labels")
        elif ph == "X":
            stream = _int(e["args"].get("stream id"))
            if stream is not None:
                self.streams.add((e["pid"], stream))
        elif ph in ("s", "f") and e.get("cat") == "async_npu":
            ts = _ns(e.get("ts"))
            if ts is not None and abs(ts) < MAX_NS and _int(e.get("id")) is not None:
                key = (e["pid"], e["tid"], ts)
                if ph == "f":
                    self.flow_end[key] = _int(e["id"])
                else:
                    self.flow_start[_int(e["id"])] = key
        if self.events % CHARGE_EVENTS == 0:
            self.charge()

    def charge(self) -> None:
        held = (len(self.streams) + len(self.flow_end) + len(self.flow_start)) * ENTRY_BYTES
        self.budget.take(held - self.charged)
        self.charged = held


class _Rows:
    """The second walk: each event's slice row or counter samples, with what the first gathered."""

    def __init__(self, scan: _Scan, groups: dict, op_groups: dict, details: dict, memory: list[dict]):
        self.scan, self.groups, self.op_groups, self.details, self.memory = scan, groups, op_groups, details, memory
        hccl_streams = {(pid, stream) for pid, stream in scan.streams if scan.process.get(pid) == "HCCL"}
        self.hccl_stream_of: dict[int, set] = {}
        for pid, stream in hccl_streams:
            self.hccl_stream_of.setdefault(pid, set()).add(stream)
        self.comm_streams = {(pid & 31, s) for pid, s in hccl_streams}
        self.skipped: dict[str, int] = {"malformed event": scan.malformed} if scan.malformed else {}
        self.examples: dict[str, str] = {"malformed event": scan.example} if scan.malformed else {}
        self.devices: set[int] = set()
        self.launched: set[int] = set()  # the flows whose device task was read (held: ENTRY_BYTES covers them)

    def skip(self, reason: str, e) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.examples.setdefault(reason, repr(e)[:300])

    def label(self, pid, tid) -> str:
        return f"{self.scan.process.get(pid) or pid} / {self.scan.threads.get((pid, tid)) or f'thread {tid}'}"

    def batches(self, doc: _Document, lists: int, out, counters, counters_out):
        """The slices of list `lists` of `doc`, as record batches of `out` (RowBatches); counter samples go to
        `counters`, their batches written to `counters_out`."""
        scan, details, skip = self.scan, self.details, self.skip
        process, threads_, process_label = scan.process, scan.threads, scan.process_label
        flow_end, flow_start = scan.flow_end, scan.flow_start
        for e in doc.elements():
            if doc.lists != lists or not _clean(e):  # malformed events were counted by the first walk
                continue
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
                        track = proc or str(pid)
                        batch = counters.add(dict(name=name, series=series, track=track, device_id=device, ts=ts,
                                                  value=float(value)), len(name or "") + len(series) + len(track))
                        if batch is not None:
                            counters_out.write_batch(batch)
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
            row = dict(name=name, ts=ts, dur=dur, pid=pid, tid=tid, track=self.label(pid, tid))
            if proc in _DEVICE_PROCESSES:
                device = pid & 31
                self.devices.add(device)
                row.update(device_id=device)
                flow = flow_end.get((pid, tid, ts))
                if flow is not None and flow in flow_start:
                    self.launched.add(flow)
                link = flow if flow is not None and flow in flow_start else args.get("connection_id")
                thread = str(threads_.get((pid, tid)) or "")
                if proc == "Ascend Hardware":
                    task = args.get("Task Type")
                    stream = _int(args.get("Physic Stream Id"))
                    stream = tid if stream is None else stream
                    if (device, stream) in self.comm_streams:  # the hardware tasks of an HCCL operation: its detail
                        kind, category = "gpu_annotation", "hccl_task"
                    elif task in _COMPUTE_TASKS or (task == _UNTYPED_TASK
                                                    and not _RUNTIME_TASK_NAME.fullmatch(name or "")):
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
                    streams = self.hccl_stream_of.get(pid, set())
                    stream = next(iter(streams)) if len(streams) == 1 else 10_000 + tid
                    group = self.op_groups.get(name)
                    args = {**args, "Collective name": name, "dtype": args.get("data_type"),
                            "In msg nelems": args.get("count"), "Out msg nelems": args.get("count")}
                    if group:
                        args.update({"Process Group Name": group, "Group size": self.groups[group]["group_size"]})
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
                cat = cat if cat is None or isinstance(cat, str) else str(cat)
                row.update(kind=_KINDS.get(cat, "other" if cat else "user_annotation"), category=cat)
                if "Input Dims" in args or "Input type" in args:
                    args = dict(args)
                    if "Input Dims" in args:
                        args["Input Dims"] = listed(args["Input Dims"], numbers=True)
                    if "Input type" in args:
                        args["Input type"] = listed(args["Input type"], numbers=False)
            row["args"] = text = json_args(args)
            batch = out.add(row, len(name or "") + len(row["track"]) + len(text or ""))
            if batch is not None:
                yield batch

        for row in self.memory:
            self.devices.add(row["device_id"])
            batch = out.add(row, len(row["track"]) + len(row["args"]))
            if batch is not None:
                yield batch
        # the framework op each task came from: a zero-length launch where its torch_to_npu flow starts
        for flow in sorted(self.launched, key=lambda f: flow_start[f][2]):
            pid, tid, ts = flow_start[flow]
            track = self.label(pid, tid)
            batch = out.add(dict(kind="runtime", category="async_npu", name="torch_to_npu", ts=ts, dur=0, pid=pid,
                                 tid=tid, track=track, correlation=_int(flow)), len(track))
            if batch is not None:
                yield batch
        yield out.take()
        counters_out.write_batch(counters.take())


def _companion(output: Path, *names: str) -> Path | None:
    for name in names:
        for p in (output / name, output / (name + ".gz")):
            if p.is_file():
                return p
    return None


def read(path: Path, threads: int | None = None):
    """Two walks of trace_view.json, an event at a time: the first gathers what every event's row needs (names,
    flows, HCCL streams), the second writes the rows, a batch at a time, to memory-mapped scratch files."""
    budget = Budget(path, _HELD)

    def read_whole(file: Path) -> bytes:  # a companion: held whole, charged HELD_RATIO a byte
        data = read_bytes(file, max(budget.left // HELD_RATIO, 0), f"with its companion {file.name}, the export")
        budget.take(len(data) * HELD_RATIO)
        return data

    with tempfile.TemporaryDirectory(prefix="tracesql-") as scratch, mapped_content(path, Path(scratch)) as buf:
        doc, scan, lists = _Document(path, buf, budget), None, 0
        for e in doc.elements():
            if doc.lists != lists:  # a later "traceEvents" list replaces an earlier one
                scan, lists = _Scan(budget), doc.lists
            scan.add(e, doc.size)
        if not doc.listed:
            raise TraceError(path, "not a torch_npu trace_view.json: no list of events")
        if doc.lists != lists:  # the list is empty
            scan, lists = _Scan(budget), doc.lists
        scan.charge()
        output = path.parent
        root = output.parent if output.name == "ASCEND_PROFILER_OUTPUT" else output
        info = _profiler_info(root, read_whole)
        groups, op_groups = _communication(output, read_whole)
        details = _kernel_details(output, read_whole)

        rows = _Rows(scan, groups, op_groups, details, _memory(output, read_whole))
        counters = RowBatches(pa.schema(READER_COUNTER_TYPES))
        with pa.ipc.new_stream(str(Path(scratch) / "counters.arrows"), counters.schema) as counters_out:
            # the slices go to a memory-mapped scratch file a batch at a time (it stays mapped once the folder is
            # gone), the counter samples to another as they come
            slices = mapped_slices(Path(scratch) / "slices.arrows", rows.batches(
                _Document(path, buf, budget), lists, RowBatches(pa.schema(READER_SLICE_TYPES), numbered="slice_id"),
                counters, counters_out))
        mappings = [slices] + ([FileMapping(Path(scratch) / "counters.arrows")] if counters.rows else [])

    rank = info.get("rank_id")
    metadata = {"profiler_info": info.get("config"), "step_trace_time": _step_trace_time(output, read_whole)}
    return TraceData(
        format=FORMAT, slices=slices.table(), rank=rank if isinstance(rank, int) and rank >= 0 else None,
        backend="hccl" if groups or any(p == "HCCL" for p in scan.process.values()) else None,
        event_count=scan.events, skipped=rows.skipped, examples=rows.examples, metadata=metadata,
        devices=[{"device_id": d, "properties": {"vendor": "Huawei", "type": "NPU", "source": "torch_npu"}}
                 for d in sorted(rows.devices)],
        process_groups=[{"pg_name": g, "pg_desc": None, "backend": "hccl", **v} for g, v in sorted(groups.items())],
        counters=mappings[1].table() if len(mappings) > 1 else None, mappings=mappings,
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


def json_args(args: dict) -> str | None:
    """args as JSON text (non-finite numbers, which JSON has no word for, as null; a lone UTF-16 surrogate, which
    JSON may escape but no reader of it accepts, as U+FFFD)."""
    if not args:
        return None
    try:
        text = json.dumps(args, allow_nan=False, default=str)
    except ValueError:
        text = None
    if text is None or "\\ud" in text and _ESCAPED_SURROGATE.search(text):
        return json.dumps(_finite(args), default=str)
    return text


#: json.dumps' escape of a lone surrogate: a high one not followed by a low one, a low one not after a high one
_ESCAPED_SURROGATE = re.compile(r"\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2}")


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_finite(k) if isinstance(k, str) else k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value



def _profiler_info(root: Path, read_bytes) -> dict:
    """profiler_info_<rank>.json: the rank and the profiler's configuration (none when it cannot be read)."""
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


#: memory_record.csv's components read into `memory`: PTA (torch_npu's caching allocator: Total Allocated is what
#: tensors hold, Total Reserved what it holds from the device), GE (the graph engine's), APP (the process's whole
#: reservation on the device, Total Reserved only). PTA+GE is their sum at each record, which these rows give.
MEMORY_COMPONENTS = ("PTA", "GE", "APP")
_MIB = 1 << 20


def _csv_rows(path: Path | None, read_bytes) -> list[dict]:
    if not path:
        return []
    try:
        return list(csv.DictReader(read_bytes(path).decode("utf-8", "replace").splitlines()))
    except csv.Error:
        return []


def _size(value, unit: int = _MIB) -> int | None:
    """A size as torch_npu writes them (MB: MiB, KB: KiB) -> bytes, exactly; None when blank."""
    try:
        return int((Decimal((value or "").strip()) * unit).to_integral_value())
    except ArithmeticError:  # blank or not a number
        return None


def _npu(device) -> int | None:
    """'NPU:3' -> 3."""
    kind, _, index = (device or "").strip().partition(":")
    return int(index) if kind == "NPU" and index.isdigit() else None


def memory_row(device: int, ts: int, allocator: str, args: dict) -> dict:
    """An allocator slice of torch_npu's memory data (normalize's MEMORY_SQL reads its args): the running totals
    of `allocator` (a component, 'module <NAME>') on NPU `device` at `ts`."""
    return dict(kind="memory", category="npu_memory", name="[memory]", ts=ts, dur=0, device_id=device,
                track=f"NPU {device} memory / {allocator}",
                args=json_args({"Device Type": "NPU", "Device Id": device, "allocator_name": allocator,
                            **{k: v for k, v in args.items() if v is not None}}))


def _memory(output: Path, read_bytes) -> list[dict]:
    """The export's memory files (profile_memory=True) as allocator slices (kind 'memory'): memory_record.csv's
    running totals of each component, each PTA record at which operator_memory.csv says an op allocated or freed
    a block with that op and the block's size, and npu_module_mem.csv's samples of what each CANN module holds
    (allocator 'module <NAME>'; modules that never held anything left out)."""
    ops = {}
    for r in _csv_rows(_companion(output, "operator_memory.csv"), read_bytes):
        size = _size(r.get("Size(KB)"), 1 << 10)
        for when, sign in (("Allocation Time(us)", 1), ("Release Time(us)", -1)):
            ts = _ns((r.get(when) or "").strip() or None)
            if ts is not None and size is not None:
                ops[(_npu(r.get("Device Type")), ts)] = (r.get("Name"), sign * size)
    rows = []

    def add(device, ts, allocator, args):
        if device is not None and ts is not None and abs(ts) < MAX_NS:
            rows.append(memory_row(device, ts, allocator, args))

    for r in _csv_rows(_companion(output, "memory_record.csv"), read_bytes):
        component = r.get("Component")
        if component in MEMORY_COMPONENTS:
            device, ts = _npu(r.get("Device Type")), _ns((r.get("Timestamp(us)") or "").strip() or None)
            op, size = ops.get((device, ts), (None, None)) if component == "PTA" else (None, None)
            add(device, ts, component, {"Total Allocated": _size(r.get("Total Allocated(MB)")),
                                        "Total Reserved": _size(r.get("Total Reserved(MB)")), "Bytes": size,
                                        "op_name": op})
    modules = _csv_rows(_companion(output, "npu_module_mem.csv"), read_bytes)
    held = {r.get("Component") for r in modules if _size(r.get("Total Reserved(MB)"))}
    for r in modules:
        if r.get("Component") in held:
            add(_npu(r.get("Device")), _ns((r.get("Timestamp(us)") or "").strip() or None),
                f"module {r['Component']}", {"Total Reserved": _size(r.get("Total Reserved(MB)"))})
    return sorted(rows, key=lambda row: row["ts"])


def _step_trace_time(output: Path, read_bytes) -> list[dict] | None:
    """step_trace_time.csv: torch_npu's per-step Computing / Communication / Overlapped / Free (µs)."""
    path = _companion(output, "step_trace_time.csv")
    if not path:
        return None
    try:
        return [dict(r) for r in csv.DictReader(read_bytes(path).decode("utf-8", "replace").splitlines())]
    except csv.Error:
        return None
