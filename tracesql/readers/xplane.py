"""XPlane protobuf traces (`*.xplane.pb`): what the JAX / TensorFlow / XLA profiler (TSL, xprof) writes.

An XSpace holds planes: one per accelerator ('/device:GPU:N', '/device:TPU:N') whose lines are CUDA/ROCm streams
('Stream #N(Kernel)') or derived timelines ('XLA Ops', 'XLA Modules', 'Steps'), and '/host:CPU', whose lines are
host threads (TraceMe annotations, TensorFlow's ops, runtime launch calls, XLA CPU thunks) and the Python tracer
('python'). TensorFlow's op events ('<node>:<Type>', `is_tf_op`) are `cpu_op` slices, framework ops as PyTorch's are:
the kernels launched inside one are its device time; the device's 'TensorFlow Ops' line, which XProf derives from
those kernels, stays an annotation.
Events name their metadata (name, constant stats) by id and carry their own stats; every stat is kept in `args`.

The messages are OpenXLA's own (`proto.messages()`: the descriptors TensorFlow ships); the HLO modules of the
'/host:metadata' plane become the `xla_ops` table (`hlo.op_rows`), and every event that ran an XLA op names it
in `args` (`hlo_op`, `program_id`) and takes its category from it.

Device clock. A TPU's XLA op event carries two clocks: its place on the
timeline (`offset_ps`/`duration_ps`, aligned to the host's clock) and the device's own measurement
(`device_offset_ps`/`device_duration_ps`), which XProf's op statistics, op profile and overview count. The host
alignment is re-anchored from time to time, which stretches or shrinks the op it falls in (on the bundled TPU
profile a 7.98 ms fusion spans 0.32 ms of the timeline, a 194.1 ms copy-done 298.8 ms) and can even swap two ops.
Such events take the device's clock, anchored where the timeline puts the plane's first one: their durations are
the device's, one core's ops never overlap (as they ran), a core's first-to-last span is XProf's; they drift from
the timeline (and from the plane's events without a device clock) by the re-anchorings (up to 0.2 s over 92 s
there). The timeline's ts and dur stay in args as `span_ts`/`span_ns`.
"""

from __future__ import annotations

import base64
import json
from array import array
import math
import re
import tempfile
from pathlib import Path

import numpy as np
from google.protobuf.message import DecodeError

from ..errors import TraceError
from . import hlo
from .common import MAX_NAME_CHARS, Budget
from .proto import messages

FORMAT = "xplane"
SUFFIXES = (".xplane.pb", ".xplane.pb.gz")  # gzipped: inflated by its magic number (common.mapped_content)

# ---- mapping ----
ACCELERATOR_PLANE = re.compile(r"^/device:(?:GPU|TPU):(\d+)$")  # also the Chrome reader's TSL dialect
STREAM_LINE = re.compile(r"^Stream #(\d+)")
_LINE_SUFFIX = re.compile(r"/-?\d+$")  # 'Host Threads/583', 'tf_pjrt_thread_pool/-246...': the thread id
HOST_PLANE = "/host:CPU"
# stats that say what a stream event is (the line name lists every kind the stream ran, not the event's)
_COPY_STATS = {"memcpy_details": "memcpy", "memset_details": "memset"}


def detect(path: Path, head: bytes) -> bool:
    return path.name.endswith(SUFFIXES)  # protobuf has no magic number: the name is what says XPlane


def parse(path: Path, data: bytes):
    """The XSpace message of `data`, or a TraceError naming `path`."""
    space = messages()["XSpace"]()
    try:
        space.ParseFromString(data)
    except DecodeError as e:
        raise TraceError(path, f"not a valid XPlane protobuf ({e})") from None
    return space


#: Holding a parsed XPlane message takes up to HELD_RATIO times its encoded size (measured: 5-6x for real
#: profiles, up to ~30x for messages of empty events or stats: upb allocates each message whole). Everything the
#: reader holds for the whole file (the messages but the events: metadata, HLO modules, plane and line headers;
#: where the events are; the XLA ops and launches it resolves) is charged against --memory-limit, beyond which
#: the file is refused in one line; the events are parsed a chunk at a time (CHUNK_EVENTS or CHUNK_BYTES).
HELD_RATIO = 32
CHUNK_EVENTS = 8192
CHUNK_BYTES = 1 << 20
RECORD_BYTES = 512  # a line's or plane's Python objects
RANGE_BYTES = 64  # a recorded (start, end) of header fields or of a chunk of events
OP_ROW_BYTES = 4096  # an `xla_ops` row (a dict of ~25 values, its HLO text)
LAUNCH_BYTES = 24  # a launch's correlation id and XLA op, in arrays and their sorted copies


class _Invalid(Exception):
    pass


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        result |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _Invalid("varint too long")


def _field(buf, pos: int, end: int) -> tuple[int, int, int, int]:
    """(field number, wire type, start of the value, end of the field) of the protobuf field at buf[pos]."""
    tag, pos = _varint(buf, pos)
    number, wire = tag >> 3, tag & 7
    if wire == 0:
        _, stop = _varint(buf, pos)
    elif wire == 2:
        n, pos = _varint(buf, pos)
        stop = pos + n
    elif wire in (1, 5):
        stop = pos + (8 if wire == 1 else 4)
    else:
        raise _Invalid(f"wire type {wire}")
    if number == 0 or stop > end:
        raise _Invalid("truncated message" if stop > end else "field number 0")
    return number, wire, pos, stop


def _submessages(buf, pos: int, end: int, number: int, header):
    """(start, end) of each length-delimited field `number` in buf[pos:end]; every other field goes to `header`."""
    while pos < end:
        start = pos
        found, wire, value, pos = _field(buf, pos, end)
        if (found, wire) == (number, 2):
            yield value, pos
        else:
            header.add(start, pos)


class _Header:
    """The fields of a message but its repeated children (a plane's lines, a line's events), as ranges of `buf`
    (adjacent fields merged), parsed once all is charged."""

    def __init__(self, buf, budget: Budget):
        self.buf, self.budget, self.ranges = buf, budget, []

    def add(self, start: int, stop: int) -> None:
        if self.ranges and self.ranges[-1][1] == start:
            self.ranges[-1] = (self.ranges[-1][0], stop)
            self.budget.take((stop - start) * HELD_RATIO)
        else:
            self.ranges.append((start, stop))
            self.budget.take((stop - start) * HELD_RATIO + RANGE_BYTES)

    def parse(self, message):
        message.ParseFromString(b"".join(self.buf[a:b] for a, b in self.ranges))
        return message


class _Line:
    """A line's header (the XLine message without its events) and where its events are, in chunks of at most
    CHUNK_EVENTS events or CHUNK_BYTES (one bigger event alone), parsed a chunk at a time."""

    __slots__ = ("header", "chunks", "_buf", "_path")

    def __init__(self, path: Path, buf, pos: int, end: int, budget: Budget):
        self._path, self._buf = path, buf
        budget.take(RECORD_BYTES)
        header, chunks, first, count = _Header(buf, budget), [], None, 0
        while pos < end:
            if buf[pos] == 0x22:  # field 4 (events), length-delimited: the fast path of nearly every field
                n = buf[pos + 1]
                value = pos + 2
                if n >= 0x80:
                    n, value = _varint(buf, pos + 1)
                start, pos = pos, value + n
                if pos > end:
                    raise _Invalid("truncated message")
            else:
                start = pos
                number, wire, _, pos = _field(buf, pos, end)
                if (number, wire) != (4, 2):
                    header.add(start, pos)
                    continue
            if first is None:
                first = start
            elif count >= CHUNK_EVENTS or pos - first > CHUNK_BYTES:
                chunks.append((first, start))
                budget.take(RANGE_BYTES)
                first, count = start, 0
            count += 1
        if first is not None:
            chunks.append((first, end))  # header fields among the events are parsed with them, and ignored there
        chunk = max((b - a for a, b in chunks), default=0)
        if chunk > CHUNK_BYTES:  # one event bigger than a chunk: parsed alone
            budget.check(chunk * HELD_RATIO, "one XPlane event, with what the reader holds for the whole file")
        self.chunks = chunks
        self.header = header

    def parse(self) -> None:
        self.header = self.header.parse(messages()["XSpace"]().planes.add().lines.add())

    def __getattr__(self, name):
        return getattr(self.header, name)

    def event_chunks(self):
        """The line's events, a chunk at a time (each chunk valid until the next is asked for)."""
        line = messages()["XSpace"]().planes.add().lines.add()
        for start, end in self.chunks:
            try:
                line.ParseFromString(self._buf[start:end])
            except DecodeError as e:
                raise TraceError(self._path, f"not a valid XPlane protobuf ({e})") from None
            yield line.events


class _Plane:
    """A plane's header (the XPlane message without its lines: metadata, stats) and its lines."""

    __slots__ = ("header", "lines")

    def __init__(self, path: Path, buf, pos: int, end: int, budget: Budget):
        budget.take(RECORD_BYTES)
        self.header = _Header(buf, budget)
        self.lines = [_Line(path, buf, a, b, budget) for a, b in _submessages(buf, pos, end, 3, self.header)]

    def parse(self) -> None:
        self.header = self.header.parse(messages()["XSpace"]().planes.add())
        for line in self.lines:
            line.parse()

    def __getattr__(self, name):
        return getattr(self.header, name)


class _Space:
    """An XSpace read without holding its events: its header (hostnames, errors, warnings) and its planes, each
    with its metadata parsed and its lines' events left where they are in `buf` (the file, memory-mapped).
    What is held is charged to `budget` before it is parsed."""

    def __init__(self, path: Path, buf, budget: Budget):
        header = _Header(buf, budget)
        try:
            self.planes = [_Plane(path, buf, a, b, budget) for a, b in _submessages(buf, 0, len(buf), 1, header)]
            self.header = header.parse(messages()["XSpace"]())
            for plane in self.planes:
                plane.parse()
        except (_Invalid, IndexError, DecodeError) as e:
            raise TraceError(path, f"not a valid XPlane protobuf ({e or 'truncated message'})") from None

    def __getattr__(self, name):
        return getattr(self.header, name)


def _stat_value(plane, stat):
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    value = getattr(stat, kind)
    if kind == "ref_value":  # an interned string: the name of another stat metadata entry
        ref = plane.stat_metadata.get(value)
        return ref.name if ref is not None else value
    if kind == "bytes_value":
        return base64.b64encode(value).decode()
    if kind == "double_value" and not math.isfinite(value):
        return str(value)  # JSON has no NaN / Infinity
    return value


def _stats(plane, stats, names: dict | None = None) -> dict:
    """The stats as {name: value}; `names`: the plane's stat names by id, when the caller has them already."""
    if names is None:
        names = {k: m.name for k, m in plane.stat_metadata.items()}
    out = {}
    for s in stats:
        kind = s.WhichOneof("value")
        if kind in _PLAIN_KINDS:
            value = getattr(s, kind)
        else:
            value = _stat_value(plane, s)
        name = names.get(s.metadata_id)
        out[str(s.metadata_id) if name is None else name] = value
    return out


_PLAIN_KINDS = frozenset(("int64_value", "uint64_value", "str_value"))  # values kept as they are


def _host_kind(name: str, stats: dict, dur_ps: int) -> str:
    if "correlation_id" in stats:
        return "runtime"  # the launch (cudaLaunchKernel, hipModuleLaunchKernel, hipMemcpy...) of device work
    if "hlo_op" in stats and "device_ordinal" in stats:
        return "kernel"  # an XLA op run by the CPU backend's thunk executor: the host is the device
    if name in ALLOCATOR_EVENTS:
        return "memory"
    if dur_ps == 0:
        return "instant"
    if is_tf_op(name):
        return "cpu_op"
    return "python_function" if name.startswith("$") else "user_annotation"  # '$file.py:12 fn': Python tracer


#: A TensorFlow op's host event is named '<node name>:<op type>' (TensorFlow's executor, eager or graph); a tf.data
#: iterator's 'Iterator::<dataset>...'. XProf's rules (TSL's tf_op_utils: ParseTfOpFullname, IsTfOpName,
#: IsTfOpType), which its framework op statistics count as TensorFlow's and tf.data's host ops.
_TF_OP = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*:[A-Z_][a-zA-Z0-9_]*")
_TF_DATA_OP = "Iterator::"


def is_tf_op(name: str) -> bool:
    """Whether a host event is a TensorFlow (or tf.data) op, as XProf tells them apart."""
    return name.startswith(_TF_DATA_OP) or _TF_OP.fullmatch(name) is not None


#: TSL's allocator events (BFC on GPU, the TPU runtime's): one per allocation or free, with the totals after it.
ALLOCATOR_EVENTS = ("MemoryAllocation", "MemoryDeallocation")
#: Device lines whose events are the device's XLA ops (TPU; on GPU they are derived from the streams).
XLA_OPS_LINE = "XLA Ops"
#: Per-op stats of a TPU profile's event metadata that describe the HLO op (XLA's cost analysis and category):
#: they go to `xla_ops`, not to every event's args.
_OP_STATS = ("hlo_category", "flops", "model_flops", "bytes_accessed", "raw_bytes_accessed",
             "memory_access_breakdown", "shape_with_layout", "source", "source_stack", "tf_op",
             "deduplicated_name", "symbol_id")
_PROGRAM_IN_NAME = re.compile(r"\((\d+)\)$")  # 'jit_step(12)': the program id of a module's metadata


def program_key(value) -> str | None:
    """A program id as text, unsigned: XPlane stores these 64-bit fingerprints signed or unsigned."""
    try:
        return str(int(value) % 2**64) if value is not None else None
    except (TypeError, ValueError):
        return None


def _programs(space) -> dict[str, object]:
    """program id -> its HloModuleProto, from the metadata plane's 'Hlo Proto' stats."""
    programs = {}
    for plane in space.planes:
        names = {k: m.name for k, m in plane.stat_metadata.items()}
        for key, meta in plane.event_metadata.items():
            stats = {names.get(s.metadata_id): s for s in meta.stats}
            if "Hlo Proto" not in stats:
                continue
            try:
                module = messages()["HloProto"].FromString(stats["Hlo Proto"].bytes_value).hlo_module
            except DecodeError:
                continue  # a damaged module loses its op details, not the trace
            in_name = _PROGRAM_IN_NAME.search(meta.name)
            program = stats.get("program_id")
            program = program_key(_stat_value(plane, program) if program is not None
                                  else in_name.group(1) if in_name else key)
            programs[program] = module
    return programs


def read(path: Path, threads: int | None = None):
    from .common import TraceData, mapped_content, mapped_slices

    budget = Budget(path, "what an XPlane reader holds for the whole file (metadata, HLO modules, XLA ops, "
                          "plane and line headers, kernel launches)")
    with tempfile.TemporaryDirectory(prefix="tracesql-") as scratch, mapped_content(path, Path(scratch)) as buf:
        space = _Space(path, buf, budget)
        environment = {p.name: _stats(p, p.stats) for p in space.planes if not p.lines and p.stats}
        start = environment.get("Task Environment", {}).get("profile_start_time")
        # A profiler session stores line timestamps relative to its start (profile_start_time, epoch ns); XPlanes
        # written by other tools hold epoch ns already. Relative ones are far below any epoch-ns start.
        line_starts = [line.timestamp_ns for p in space.planes for line in p.lines]
        base = start if isinstance(start, int) and line_starts and max(line_starts) < start else 0

        programs = _programs(space)
        op_costs: dict[str, dict] = {}  # program -> op name -> the profile's per-op stats (TPU)
        for plane in space.planes:
            if ACCELERATOR_PLANE.match(plane.name):
                for meta in plane.event_metadata.values():
                    stats = _stats(plane, meta.stats)
                    program = program_key(stats.get("program_id"))
                    if program is not None and "hlo_category" in stats:
                        op_costs.setdefault(program, {}).setdefault(
                            meta.display_name or meta.name, {**stats, "long_name": meta.name})
        op_rows = []
        for program, module in programs.items():
            rows = hlo.op_rows(module, program, op_costs.get(program))
            budget.take(len(rows) * OP_ROW_BYTES)
            op_rows += rows
        del programs
        categories = {(r["program_id"], r["name"]): r["category"] for r in op_rows}

        state = _Events(base, categories, budget)
        # the slices go to a memory-mapped scratch file a batch at a time (it stays mapped once the folder is gone)
        slices = mapped_slices(Path(scratch) / "slices.arrows", state.batches(space))
    if state.total == 0:
        raise TraceError(path, "empty trace: no XPlane has events" if space.planes
                         else "not an XPlane trace: no planes")
    if state.total == state.aggregated:
        raise TraceError(path, "no timed events (every event is an aggregate without a timestamp)")
    total, aggregated, devices = state.total, state.aggregated, state.devices

    metadata = {"hostnames": list(space.hostnames), **environment}
    metadata.update({k: list(v) for k, v in (("errors", space.errors), ("warnings", space.warnings)) if v})
    return TraceData(
        format=FORMAT,
        slices=slices.table(),
        host_name=space.hostnames[0] if space.hostnames else None,
        base_time_ns=base,
        event_count=total,
        skipped={"aggregated event without a timestamp (num_occurrences)": aggregated} if aggregated else {},
        metadata=metadata,
        devices=devices,
        xla_ops=op_rows,
        mappings=[slices],
    )


_encode_str = json.encoder.encode_basestring_ascii  # what json.dumps writes for a str (C)
_JSON_TEXT = {True: "true", False: "false", None: "null"}


def _json(stats: dict) -> str:
    """json.dumps(stats) for a flat dict of stat values (ints, strs, finite floats), several times faster;
    anything else goes to json.dumps."""
    parts = []
    for key, value in stats.items():
        kind = type(value)
        if kind is int:
            text = int.__repr__(value)
        elif kind is str:
            text = _encode_str(value)
        elif kind is float and math.isfinite(value):
            text = float.__repr__(value)
        elif kind is bool or value is None:
            text = _JSON_TEXT[value]
        else:
            return json.dumps(stats)
        parts.append(f"{_encode_str(key) if type(key) is str else json.dumps(key)}: {text}")
    return "{" + ", ".join(parts) + "}"


class _Events:
    """The slices of an XSpace's events, as record batches of at most BATCH rows and BATCH_TEXT characters of
    text (names, tracks, args: a row repeats its metadata's, so a batch is cut by their size, not only by its
    rows). An event's row is resolved from its
    line, its metadata and its own stats; events without stats of their own (most) take the row resolved for
    the first event of their line with the same metadata (and zero or not duration, which a host event's kind
    depends on): each metadata's stats are decoded and written as JSON once per line, not once per event."""

    BATCH = 1 << 16
    BATCH_TEXT = 16 << 20
    #: a resolved row: these columns, then the characters of its text
    COLUMNS = ("kind", "category", "name", "pid", "tid", "device_id", "stream", "track", "correlation", "args")

    def __init__(self, base: int, categories: dict, budget: Budget):
        self.base, self.categories, self.budget = base, categories, budget
        self.total = self.aggregated = 0
        self.devices: list[dict] = []
        self.launches = _Launches()
        self.rows = 0

    def batches(self, space):
        """Record batches of reader slice columns, in the order of the planes (host plane first: GPU kernels whose
        own stats do not name their XLA op take their launch's), lines and events."""
        import pyarrow as pa

        from .common import READER_SLICE_TYPES

        resolved, ts, dur, text = [], [], [], 0
        for plane in sorted(space.planes, key=lambda p: p.name != HOST_PLANE):
            for chunk_resolved, chunk_ts, chunk_dur, chunk_text in self._plane(plane):
                resolved += chunk_resolved
                ts += chunk_ts
                dur += chunk_dur
                text += chunk_text
                while len(ts) >= self.BATCH or text >= self.BATCH_TEXT:
                    n, n_text = self._cut(resolved)
                    yield self._batch(pa, READER_SLICE_TYPES, resolved[:n], ts[:n], dur[:n])
                    del resolved[:n], ts[:n], dur[:n]
                    text -= n_text
        if ts:
            yield self._batch(pa, READER_SLICE_TYPES, resolved, ts, dur)

    def _cut(self, resolved) -> tuple[int, int]:
        """How many of the first rows make a batch (at least one), and their characters of text."""
        text = 0
        for n, row in enumerate(resolved[:self.BATCH]):
            if n and text + row[-1] > self.BATCH_TEXT:
                return n, text
            text += row[-1]
        return min(len(resolved), self.BATCH), text

    def _batch(self, pa, types, resolved, ts, dur):
        n = len(ts)
        columns = dict(zip(self.COLUMNS, zip(*resolved)))
        arrays = {"slice_id": pa.array(range(self.rows, self.rows + n), pa.int64()),
                  "ts": pa.array(ts, pa.int64()), "dur": pa.array(dur, pa.int64())}
        self.rows += n
        for name in self.COLUMNS:
            arrays[name] = pa.array(columns[name], types[name])
        arrays["external_id"] = pa.nulls(n, pa.int64())
        return pa.record_batch(arrays)

    def _plane(self, plane):
        """(line, resolved row of each event, ts, dur) per line of the plane."""
        accelerator = ACCELERATOR_PLANE.match(plane.name)
        names = {k: m.name for k, m in plane.stat_metadata.items()}
        plane_stats = _stats(plane, plane.stats, names)
        device_id = stream = None
        self.clock_shift = None  # the plane's timeline minus its device clock, ps (module docstring: device clock)
        if accelerator:
            device_id = int(accelerator.group(1))
            self.devices.append(_device(device_id, plane, plane_stats))
        has_streams = any(STREAM_LINE.match(line.name) for line in plane.lines)
        metadata = {k: _metadata(plane, m, accelerator is not None, names) for k, m in plane.event_metadata.items()}
        pid = device_id if accelerator else plane_stats.get("process_id", plane.id)
        is_host = plane.name == HOST_PLANE
        base, categories, launches = self.base, self.categories, self.launches
        plane_name = plane.name[:MAX_NAME_CHARS]
        for line in plane.lines:
            line_name = line.name[:MAX_NAME_CHARS]
            stream_match = STREAM_LINE.match(line_name)
            family = _LINE_SUFFIX.sub("", line_name)
            if accelerator:
                stream = int(stream_match.group(1)) if stream_match else line.id
                track = f"device {device_id} / " + (f"stream {stream}" if stream_match else line_name)
                # 'XLA Ops' is the device's op timeline on TPU; on GPU it is derived from the stream kernels,
                # which are already counted, so it is an annotation there
                line_kind = "kernel" if stream_match or (line_name == XLA_OPS_LINE and not has_streams) \
                    else "gpu_annotation"
            else:
                track = f"{plane_name} / {line_name}"
            tid = line.id
            start = base + line.timestamp_ns
            cache: dict[tuple, tuple] = {}
            for events in line.event_chunks():
                rows, ts, dur = [], [], []
                for event in events:
                    if event.WhichOneof("data") == "num_occurrences":
                        self.aggregated += 1
                        continue
                    metadata_id, duration_ps = event.metadata_id, event.duration_ps
                    ts.append(start + event.offset_ps // 1000)  # ps -> ns, floored
                    dur.append(duration_ps // 1000)
                    if not event.stats:
                        key = (metadata_id, duration_ps == 0)
                        row = cache.get(key)
                        if row is not None:
                            rows.append(row)
                            continue
                        own = None
                    else:
                        key, own = None, _stats(plane, event.stats, names)
                        at, device_ps = own.get("device_offset_ps"), own.get("device_duration_ps")
                        if accelerator and type(at) is int and type(device_ps) is int:
                            # the device's own clock, anchored at the plane's first such op (module docstring)
                            if self.clock_shift is None:
                                self.clock_shift = event.offset_ps - at
                            own["span_ts"], own["span_ns"] = ts[-1], dur[-1]
                            ts[-1] = start + (at + self.clock_shift) // 1000
                            dur[-1] = start + (at + device_ps + self.clock_shift) // 1000 - ts[-1]
                    name, meta_stats, meta_json = metadata.get(metadata_id, (str(metadata_id), {}, None))
                    stats = {**meta_stats, **own} if own else meta_stats
                    event_device, event_stream = (device_id, stream) if accelerator else (None, None)
                    if accelerator:
                        kind = next((k for s, k in _COPY_STATS.items() if s in stats), line_kind) \
                            if stream_match else line_kind
                    elif is_host:
                        kind = _host_kind(name, stats, duration_ps)
                        if kind == "kernel":
                            event_device, event_stream = stats["device_ordinal"], line.id
                    else:
                        kind = "other"
                    step = stats.get("step_num")
                    if kind == "user_annotation" and isinstance(step, int):
                        # jax.profiler.StepTraceAnnotation: the name normalize recognizes as a step (the
                        # annotation's own name, 'train', stays in args)
                        stats = {**stats, "annotation": name}
                        name, own = f"ProfilerStep#{step}", True
                    correlation = stats.get("correlation_id")
                    correlation = correlation if isinstance(correlation, int) else None
                    op = (program_key(stats.get("program_id")), stats["hlo_op"]) if "hlo_op" in stats \
                        and kind not in ("gpu_annotation",) else None
                    if op is None and kind == "kernel" and correlation is not None:
                        op = launches.get(correlation)
                        if op is not None:
                            stats, own = {**stats, "hlo_op": op[1], "program_id": op[0]}, True
                    elif op is not None:
                        if kind == "runtime" and correlation is not None:
                            launches.add(correlation, op)
                        if stats.get("program_id") != op[0]:
                            stats, own = {**stats, "program_id": op[0]}, True
                    category = categories.get(op) or stats.get("hlo_category") or family
                    row_track = f"device {event_device} / stream {event_stream}" \
                        if kind == "kernel" and not accelerator else track
                    args = (_json(stats) if stats else None) if own else meta_json
                    row = (kind, category, name, pid, tid, event_device, event_stream, row_track, correlation, args,
                           len(str(category)) + len(name) + len(row_track) + (len(args) if args else 0))
                    rows.append(row)
                    if key is not None and correlation is None:  # a launch's correlation is its own: not shared
                        cache[key] = row
                self.total += len(events)
                self.budget.take(launches.added() * LAUNCH_BYTES)
                yield rows, ts, dur, sum(row[-1] for row in rows)


class _Launches:
    """The XLA op that each kernel launch names (correlation id -> (program, op); the last launch of an id wins),
    for the kernels whose own stats do not name theirs: in arrays, LAUNCH_BYTES a launch, and the distinct ops."""

    def __init__(self):
        self._ids, self._ops = array("q"), array("i")
        self._index: dict[tuple, int] = {}
        self._distinct: list[tuple] = []
        self._sorted = None
        self._counted = 0

    def add(self, correlation: int, op: tuple) -> None:
        if not -2**63 <= correlation < 2**63:
            return  # no BIGINT holds it: the launch's row fails to convert anyway
        i = self._index.get(op)
        if i is None:
            i = self._index[op] = len(self._distinct)
            self._distinct.append(op)
        self._ids.append(correlation)
        self._ops.append(i)
        self._sorted = None

    def get(self, correlation: int) -> tuple | None:
        if not self._ids or not -2**63 <= correlation < 2**63:
            return None
        if self._sorted is None:
            ids = np.array(self._ids, dtype=np.int64)
            order = np.argsort(ids, kind="stable")
            self._sorted = ids[order], np.array(self._ops, dtype=np.int32)[order]
        ids, ops = self._sorted
        at = int(np.searchsorted(ids, correlation, side="right")) - 1
        return self._distinct[ops[at]] if at >= 0 and ids[at] == correlation else None

    def added(self) -> int:
        """Launches added since the last call."""
        n, self._counted = len(self._ids) - self._counted, len(self._ids)
        return n


def _metadata(plane, meta, on_device: bool, names: dict | None = None) -> tuple[str, dict, str | None]:
    """(name, stats, stats as JSON) of an event metadata entry. A TPU op's metadata is named by its HLO text
    and displays the op's name: the event takes the short name (the text is in `xla_ops.hlo_text`), its
    program and op name go to args, and the op's own stats stay with the op in `xla_ops`."""
    stats = _stats(plane, meta.stats, names)
    name = meta.name[:MAX_NAME_CHARS]
    if on_device and meta.display_name and "program_id" in stats:
        name = meta.display_name[:MAX_NAME_CHARS]
        stats = {"hlo_op": meta.display_name, "program_id": program_key(stats["program_id"]),
                 **{k: v for k, v in stats.items() if k not in _OP_STATS and k != "program_id"}}
    return name, stats, json.dumps(stats) if stats else None


#: GPU models told apart by what a GPU plane's stats record (XLA's CUPTI/ROCm tracers write the vendor, compute
#: capability, core count, clock (kHz), memory size and bandwidth, never the model's name): (vendor, compute
#: capability, cores, memory GiB range, least clock MHz, least memory bandwidth B/s) -> the model's name as its
#: driver spells it (what device_peaks matches). Only combinations one model has: an ambiguous one (A100 40 GB
#: SXM/PCIe, V100 SXM2/PCIe, MI210/MI250 GCD, H100 NVL/GH200) keeps a generic name.
GPU_MODELS = (
    ("AMD", "9.4", 304, (0, 224), 0, 0, "AMD Instinct MI300X"),  # gfx942, 192 GB HBM3
    ("AMD", "9.4", 304, (224, 1e9), 0, 0, "AMD Instinct MI325X"),  # gfx942, 256 GB HBM3E
    ("AMD", "9.4", 228, (0, 1e9), 0, 0, "AMD Instinct MI300A"),
    ("AMD", "9.4", 80, (0, 1e9), 0, 0, "AMD Instinct MI308X"),
    ("AMD", "9.5", 256, (0, 1e9), 2300, 0, "AMD Instinct MI355X"),  # gfx950 at 2.4 GHz (the MI350X: 2.2 GHz)
    ("AMD", "9.5", 256, (0, 1e9), 0, 0, "AMD Instinct MI350X"),
    ("AMD", "9.0", 110, (0, 1e9), 0, 0, "AMD Instinct MI250X"),  # gfx90a: one GCD, the device ROCm shows
    ("Nvidia", "8.0", 108, (60, 1e9), 0, 2.0e12, "NVIDIA A100-SXM4-80GB"),  # 2039 GB/s
    ("Nvidia", "8.0", 108, (60, 1e9), 0, 0, "NVIDIA A100 80GB PCIe"),  # 1935 GB/s
    ("Nvidia", "9.0", 132, (0, 88), 0, 0, "NVIDIA H100 80GB HBM3"),
    ("Nvidia", "9.0", 114, (0, 1e9), 0, 0, "NVIDIA H100 PCIe"),
    ("Nvidia", "9.0", 132, (130, 1e9), 0, 0, "NVIDIA H200"),
    ("Nvidia", "10.0", 148, (0, 1e9), 0, 0, "NVIDIA B200"),
)


def gpu_model(stats: dict) -> str | None:
    """The GPU model that a GPU plane's stats describe (vendor, compute capability, cores, memory, clock,
    bandwidth), when only one model of GPU_MODELS has them."""
    vendor, major, minor = stats.get("device_vendor"), stats.get("compute_cap_major"), stats.get("compute_cap_minor")
    cores, memory = stats.get("core_count"), stats.get("memory_size")
    if vendor is None or major is None or cores is None:
        return None
    mhz, bandwidth = (stats.get("clock_rate") or 0) / 1000, stats.get("memory_bandwidth") or 0
    for v, capability, count, (low, high), least_mhz, least_bandwidth, name in GPU_MODELS:
        if (v.lower() == str(vendor).lower() and capability == f"{major}.{minor}" and count == cores
                and (memory is None or low <= memory / 2**30 < high) and mhz >= least_mhz
                and bandwidth >= least_bandwidth):
            return name
    return None


def _generic_name(plane, stats: dict) -> str | None:
    """A GPU the trace describes without naming its model: by vendor and capabilities ('AMD GPU (compute
    capability 9.0, 104 cores)'); by nothing when the plane records only its vendor (a GPU the profiled process
    did not use: the tracer did not query it), so that it does not pass for a device model."""
    vendor, major = stats.get("device_vendor"), stats.get("compute_cap_major")
    if vendor is None:
        return plane.name
    if major is None:
        return None
    cores = f", {stats['core_count']} cores" if stats.get("core_count") is not None else ""
    return f"{vendor} GPU (compute capability {major}.{stats.get('compute_cap_minor')}{cores})"


def _device(device_id: int, plane, stats: dict) -> dict:
    """A device plane's `devices` row. XPlane records a GPU's vendor and capabilities, not its model (told apart
    by GPU_MODELS); a TPU's generation ('TPU v6 Lite', 'TPU v5p')."""
    major, minor = stats.get("compute_cap_major"), stats.get("compute_cap_minor")
    model = gpu_model(stats)
    properties = {"plane": plane.name, **stats}
    if model:
        properties["name_from"] = "device_vendor, compute_cap_major/minor, core_count, memory_size, clock_rate"
    return {
        "device_id": device_id,
        "name": stats.get("device_name") or stats.get("device_type_string") or model or _generic_name(plane, stats),
        "total_memory_bytes": stats.get("memory_size"),
        "compute_capability": f"{major}.{minor}" if major is not None else None,
        "sm_count": stats.get("core_count"),
        "properties": properties,
    }
