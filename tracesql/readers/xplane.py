"""XPlane protobuf traces (`*.xplane.pb`): what the JAX / TensorFlow / XLA profiler (TSL, xprof) writes.

An XSpace holds planes: one per accelerator ('/device:GPU:N', '/device:TPU:N') whose lines are CUDA/ROCm streams
('Stream #N(Kernel)') or derived timelines ('XLA Ops', 'XLA Modules', 'Steps'), and '/host:CPU', whose lines are
host threads (TraceMe annotations, runtime launch calls, XLA CPU thunks) and the Python tracer ('python').
Events name their metadata (name, constant stats) by id and carry their own stats; every stat is kept in `args`.

No maintained PyPI package ships the generated `xplane_pb2` without heavy baggage (xprof is a 32 MB server with
Google Cloud dependencies and does not include it), so the message classes are built here from a descriptor of
the schema (tensorflow/core/profiler/protobuf/xplane.proto, now tsl/profiler/protobuf/xplane.proto) and the
protobuf runtime decodes the file.
"""

from __future__ import annotations

import base64
import json
import math
import re
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from ..errors import TraceError

FORMAT = "xplane"
SUFFIXES = (".xplane.pb",)

# ---- the schema: message -> (field, number, type); '*' repeated, a fourth item names the field's oneof ----
_MESSAGES = {
    "XSpace": [("planes", 1, "*XPlane"), ("errors", 2, "*string"), ("warnings", 3, "*string"),
               ("hostnames", 4, "*string")],
    "XPlane": [("id", 1, "int64"), ("name", 2, "string"), ("lines", 3, "*XLine"),
               ("event_metadata", 4, "*XPlane.EventMetadataEntry"),
               ("stat_metadata", 5, "*XPlane.StatMetadataEntry"), ("stats", 6, "*XStat")],
    "XLine": [("id", 1, "int64"), ("display_id", 10, "int64"), ("name", 2, "string"),
              ("display_name", 11, "string"), ("timestamp_ns", 3, "int64"), ("duration_ps", 9, "int64"),
              ("events", 4, "*XEvent")],
    "XEvent": [("metadata_id", 1, "int64"), ("offset_ps", 2, "int64", "data"),
               ("num_occurrences", 5, "int64", "data"), ("duration_ps", 3, "int64"), ("stats", 4, "*XStat")],
    "XStat": [("metadata_id", 1, "int64"), ("double_value", 2, "double", "value"),
              ("uint64_value", 3, "uint64", "value"), ("int64_value", 4, "int64", "value"),
              ("str_value", 5, "string", "value"), ("bytes_value", 6, "bytes", "value"),
              ("ref_value", 7, "uint64", "value")],
    "XEventMetadata": [("id", 1, "int64"), ("name", 2, "string"), ("display_name", 4, "string"),
                       ("metadata", 3, "bytes"), ("stats", 5, "*XStat"), ("child_id", 6, "*int64")],
    "XStatMetadata": [("id", 1, "int64"), ("name", 2, "string"), ("description", 3, "string")],
}
_MAPS = {"XPlane": [("EventMetadataEntry", "XEventMetadata"), ("StatMetadataEntry", "XStatMetadata")]}
_PACKAGE = "tensorflow.profiler"


def _message_classes() -> dict:
    F = descriptor_pb2.FieldDescriptorProto
    scalar = {"int64": F.TYPE_INT64, "uint64": F.TYPE_UINT64, "double": F.TYPE_DOUBLE,
              "string": F.TYPE_STRING, "bytes": F.TYPE_BYTES}

    def add_field(message, name, number, type_, oneof=None):
        field = message.field.add(name=name, number=number,
                                  label=F.LABEL_REPEATED if type_.startswith("*") else F.LABEL_OPTIONAL)
        type_ = type_.lstrip("*")
        if type_ in scalar:
            field.type = scalar[type_]
        else:
            field.type, field.type_name = F.TYPE_MESSAGE, f".{_PACKAGE}.{type_}"
        if oneof:
            names = [o.name for o in message.oneof_decl]
            if oneof not in names:
                message.oneof_decl.add(name=oneof)
                names.append(oneof)
            field.oneof_index = names.index(oneof)

    proto = descriptor_pb2.FileDescriptorProto(name="tracesql/xplane.proto", package=_PACKAGE, syntax="proto3")
    for name, fields in _MESSAGES.items():
        message = proto.message_type.add(name=name)
        for field in fields:
            add_field(message, *field)
        for entry_name, value_type in _MAPS.get(name, []):
            entry = message.nested_type.add(name=entry_name)
            entry.options.map_entry = True
            add_field(entry, "key", 1, "int64")
            add_field(entry, "value", 2, value_type)
    pool = descriptor_pool.DescriptorPool()  # a private pool: no clash with a real xplane_pb2 imported elsewhere
    pool.Add(proto)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.{name}"))
            for name in _MESSAGES}


XSpace = _message_classes()["XSpace"]

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
    space = XSpace()
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


def _stats(plane, stats) -> dict:
    names = plane.stat_metadata
    return {(names[s.metadata_id].name if s.metadata_id in names else str(s.metadata_id)): _stat_value(plane, s)
            for s in stats}


def _host_kind(name: str, stats: dict, dur_ps: int) -> str:
    if "correlation_id" in stats:
        return "runtime"  # the launch (cudaLaunchKernel, hipModuleLaunchKernel, hipMemcpy...) of device work
    if "hlo_op" in stats and "device_ordinal" in stats:
        return "kernel"  # an XLA op run by the CPU backend's thunk executor: the host is the device
    if dur_ps == 0:
        return "instant"
    return "python_function" if name.startswith("$") else "user_annotation"  # '$file.py:12 fn': Python tracer


def read(path: Path, threads: int | None = None):
    from . import TraceData, read_bytes, slices_from_columns

    space = parse(path, read_bytes(path))
    environment = {p.name: _stats(p, p.stats) for p in space.planes if not p.lines and p.stats}
    start = environment.get("Task Environment", {}).get("profile_start_time")
    # A profiler session stores line timestamps relative to its start (profile_start_time, epoch ns); XPlanes
    # written by other tools hold epoch ns already. Relative ones are far below any epoch-ns start.
    line_starts = [line.timestamp_ns for p in space.planes for line in p.lines]
    base = start if isinstance(start, int) and line_starts and max(line_starts) < start else 0

    cols = {c: [] for c in ("kind", "category", "name", "ts", "dur", "pid", "tid", "device_id", "stream", "track",
                            "correlation", "args")}
    total = aggregated = 0
    devices = []
    for plane in space.planes:
        accelerator = ACCELERATOR_PLANE.match(plane.name)
        plane_stats = _stats(plane, plane.stats)
        if accelerator:
            device_id = int(accelerator.group(1))
            devices.append(_device(device_id, plane, plane_stats))
        has_streams = any(STREAM_LINE.match(line.name) for line in plane.lines)
        metadata = {k: (m.name, _stats(plane, m.stats)) for k, m in plane.event_metadata.items()}
        pid = device_id if accelerator else plane_stats.get("process_id", plane.id)
        for line in plane.lines:
            stream_match = STREAM_LINE.match(line.name)
            family = _LINE_SUFFIX.sub("", line.name)
            if accelerator:
                stream = int(stream_match.group(1)) if stream_match else line.id
                track = f"device {device_id} / " + (f"stream {stream}" if stream_match else line.name)
                # 'XLA Ops' is the device's op timeline on TPU; on GPU it is derived from the stream kernels,
                # which are already counted, so it is an annotation there
                line_kind = "kernel" if stream_match or (line.name == "XLA Ops" and not has_streams) \
                    else "gpu_annotation"
            else:
                track = f"{plane.name} / {line.name}"
            for event in line.events:
                total += 1
                if event.WhichOneof("data") == "num_occurrences":
                    aggregated += 1
                    continue
                name, stats = metadata.get(event.metadata_id, (str(event.metadata_id), {}))
                stats = {**stats, **_stats(plane, event.stats)}
                event_device, event_stream = (device_id, stream) if accelerator else (None, None)
                if accelerator:
                    kind = next((k for s, k in _COPY_STATS.items() if s in stats), line_kind) \
                        if stream_match else line_kind
                elif plane.name == HOST_PLANE:
                    kind = _host_kind(name, stats, event.duration_ps)
                    if kind == "kernel":
                        event_device, event_stream = stats["device_ordinal"], line.id
                else:
                    kind = "other"
                step = stats.get("step_num")
                if kind == "user_annotation" and isinstance(step, int):
                    # jax.profiler.StepTraceAnnotation: the name normalize recognizes as a step (the
                    # annotation's own name, 'train', stays in args)
                    stats["annotation"], name = name, f"ProfilerStep#{step}"
                correlation = stats.get("correlation_id")
                cols["kind"].append(kind)
                cols["category"].append(stats.get("hlo_category") or family)
                cols["name"].append(name)
                # ps -> ns, floored; line.timestamp_ns is already ns
                cols["ts"].append(base + line.timestamp_ns + event.offset_ps // 1000)
                cols["dur"].append(event.duration_ps // 1000)
                cols["pid"].append(pid)
                cols["tid"].append(line.id)
                cols["device_id"].append(event_device)
                cols["stream"].append(event_stream)
                cols["track"].append(f"device {event_device} / stream {event_stream}" if kind == "kernel"
                                     and not accelerator else track)
                cols["correlation"].append(correlation if isinstance(correlation, int) else None)
                cols["args"].append(json.dumps(stats) if stats else None)
    if total == 0:
        raise TraceError(path, "empty trace: no XPlane has events" if space.planes
                         else "not an XPlane trace: no planes")
    if total == aggregated:
        raise TraceError(path, "no timed events (every event is an aggregate without a timestamp)")


    metadata = {"hostnames": list(space.hostnames), **environment}
    metadata.update({k: list(v) for k, v in (("errors", space.errors), ("warnings", space.warnings)) if v})
    return TraceData(
        format=FORMAT,
        slices=slices_from_columns(cols),
        host_name=space.hostnames[0] if space.hostnames else None,
        base_time_ns=base,
        event_count=total,
        skipped={"aggregated event without a timestamp (num_occurrences)": aggregated} if aggregated else {},
        metadata=metadata,
        devices=devices,
    )


def _device(device_id: int, plane, stats: dict) -> dict:
    major, minor = stats.get("compute_cap_major"), stats.get("compute_cap_minor")
    return {
        "device_id": device_id,
        "name": stats.get("device_name") or plane.name,  # XPlane records a vendor, not always a model name
        "total_memory_bytes": stats.get("memory_size"),
        "compute_capability": f"{major}.{minor}" if major is not None else None,
        "sm_count": stats.get("core_count"),
        "properties": {"plane": plane.name, **stats},
    }
