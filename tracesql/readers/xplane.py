"""XPlane protobuf traces (`*.xplane.pb`): what the JAX / TensorFlow / XLA profiler (TSL, xprof) writes.

An XSpace holds planes: one per accelerator ('/device:GPU:N', '/device:TPU:N') whose lines are CUDA/ROCm streams
('Stream #N(Kernel)') or derived timelines ('XLA Ops', 'XLA Modules', 'Steps'), and '/host:CPU', whose lines are
host threads (TraceMe annotations, runtime launch calls, XLA CPU thunks) and the Python tracer ('python').
Events name their metadata (name, constant stats) by id and carry their own stats; every stat is kept in `args`.

The messages are OpenXLA's own (`proto.messages()`: the descriptors TensorFlow ships); the HLO modules of the
'/host:metadata' plane become the `xla_ops` table (`hlo.op_rows`), and every event that ran an XLA op names it
in `args` (`hlo_op`, `program_id`) and takes its category from it.
"""

from __future__ import annotations

import base64
import json
import math
import re
import tempfile
from pathlib import Path

from google.protobuf.message import DecodeError

from ..errors import TraceError
from . import hlo
from .proto import messages

FORMAT = "xplane"
SUFFIXES = (".xplane.pb",)

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
    return "python_function" if name.startswith("$") else "user_annotation"  # '$file.py:12 fn': Python tracer


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
    from .common import TraceData, mapped_slices, read_bytes

    space = parse(path, read_bytes(path))
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
    op_rows = [row for program, module in programs.items()
               for row in hlo.op_rows(module, program, op_costs.get(program))]
    categories = {(r["program_id"], r["name"]): r["category"] for r in op_rows}

    state = _Events(base, categories)
    with tempfile.TemporaryDirectory(prefix="tracesql-") as scratch:
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
    """The slices of an XSpace's events, as record batches of BATCH rows. An event's row is resolved from its
    line, its metadata and its own stats; events without stats of their own (most) take the row resolved for
    the first event of their line with the same metadata (and zero or not duration, which a host event's kind
    depends on): each metadata's stats are decoded and written as JSON once per line, not once per event."""

    BATCH = 1 << 16
    COLUMNS = ("kind", "category", "name", "pid", "tid", "device_id", "stream", "track", "correlation", "args")

    def __init__(self, base: int, categories: dict):
        self.base, self.categories = base, categories
        self.total = self.aggregated = 0
        self.devices: list[dict] = []
        self.launched_op: dict[int, tuple] = {}  # correlation id -> (program, op) of launches that name one
        self.rows = 0

    def batches(self, space):
        """Record batches of reader slice columns, in the order of the planes (host plane first: GPU kernels whose
        own stats do not name their XLA op take their launch's), lines and events."""
        import pyarrow as pa

        from .common import READER_SLICE_TYPES

        resolved, ts, dur = [], [], []
        for plane in sorted(space.planes, key=lambda p: p.name != HOST_PLANE):
            for line, line_resolved, line_ts, line_dur in self._plane(plane):
                resolved += line_resolved
                ts += line_ts
                dur += line_dur
                while len(ts) >= self.BATCH:
                    yield self._batch(pa, READER_SLICE_TYPES, resolved[:self.BATCH], ts[:self.BATCH],
                                      dur[:self.BATCH])
                    del resolved[:self.BATCH], ts[:self.BATCH], dur[:self.BATCH]
        if ts:
            yield self._batch(pa, READER_SLICE_TYPES, resolved, ts, dur)

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
        if accelerator:
            device_id = int(accelerator.group(1))
            self.devices.append(_device(device_id, plane, plane_stats))
        has_streams = any(STREAM_LINE.match(line.name) for line in plane.lines)
        metadata = {k: _metadata(plane, m, accelerator is not None, names) for k, m in plane.event_metadata.items()}
        pid = device_id if accelerator else plane_stats.get("process_id", plane.id)
        is_host = plane.name == HOST_PLANE
        base, categories, launched_op = self.base, self.categories, self.launched_op
        for line in plane.lines:
            stream_match = STREAM_LINE.match(line.name)
            family = _LINE_SUFFIX.sub("", line.name)
            if accelerator:
                stream = int(stream_match.group(1)) if stream_match else line.id
                track = f"device {device_id} / " + (f"stream {stream}" if stream_match else line.name)
                # 'XLA Ops' is the device's op timeline on TPU; on GPU it is derived from the stream kernels,
                # which are already counted, so it is an annotation there
                line_kind = "kernel" if stream_match or (line.name == XLA_OPS_LINE and not has_streams) \
                    else "gpu_annotation"
            else:
                track = f"{plane.name} / {line.name}"
            tid = line.id
            start = base + line.timestamp_ns
            cache: dict[tuple, tuple] = {}
            rows, ts, dur = [], [], []
            for event in line.events:
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
                    op = launched_op.get(correlation)
                    if op is not None:
                        stats, own = {**stats, "hlo_op": op[1], "program_id": op[0]}, True
                elif op is not None:
                    if kind == "runtime" and correlation is not None:
                        launched_op[correlation] = op
                    if stats.get("program_id") != op[0]:
                        stats, own = {**stats, "program_id": op[0]}, True
                row = (kind, categories.get(op) or stats.get("hlo_category") or family, name, pid, tid,
                       event_device, event_stream,
                       f"device {event_device} / stream {event_stream}" if kind == "kernel" and not accelerator
                       else track,
                       correlation,
                       (_json(stats) if stats else None) if own else meta_json)
                rows.append(row)
                if key is not None and correlation is None:  # a launch's correlation is its own: not shared
                    cache[key] = row
            self.total += len(line.events)
            yield line, rows, ts, dur


def _metadata(plane, meta, on_device: bool, names: dict | None = None) -> tuple[str, dict, str | None]:
    """(name, stats, stats as JSON) of an event metadata entry. A TPU op's metadata is named by its HLO text
    and displays the op's name: the event takes the short name (the text is in `xla_ops.hlo_text`), its
    program and op name go to args, and the op's own stats stay with the op in `xla_ops`."""
    stats = _stats(plane, meta.stats, names)
    name = meta.name
    if on_device and meta.display_name and "program_id" in stats:
        name = meta.display_name
        stats = {"hlo_op": name, "program_id": program_key(stats["program_id"]),
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
