"""rocprofv3 (rocprofiler-sdk) JSON output: `<pid>_results.json[.gz]`, written with `--output-format json`.

The file holds one object per profiled process under "rocprofiler-sdk-tool". Timed records sit in
`buffer_records` by domain; their names are indices into lookup tables of the same file (`strings.buffer_records`
for API operations, `kernel_symbols` for kernels), and their agents are handles into `agents`. msgspec decodes
only the fields used, straight into typed structs: a 44k-dispatch file reads in a fraction of a second.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from ..errors import TraceError

FORMAT = "rocprof"
SUFFIXES = ("_results.json", "_results.json.gz")

_TOOL_KEY = b'"rocprofiler-sdk-tool"'

# API domains of `buffer_records` -> slices.kind; each record is one call on a host thread.
API_KINDS = {"hip_api": "runtime", "hsa_api": "driver", "marker_api": "user_annotation", "rccl_api": "cpu_op"}
DEVICE_DOMAINS = ("kernel_dispatch", "memory_copy")
GPU_AGENT_TYPE = 2  # rocprofiler_agent_type_t: 1 CPU, 2 GPU


def detect(path: Path, head: bytes) -> bool:
    text = head.lstrip()
    return text[:1] == b"{" and _TOOL_KEY in text[:4096]


class _Handle(msgspec.Struct):
    handle: int = 0


class _Correlation(msgspec.Struct):
    internal: int = 0
    external: int = 0


class _Dim(msgspec.Struct):
    x: int = 0
    y: int = 0
    z: int = 0


class _DispatchInfo(msgspec.Struct):
    agent_id: _Handle = msgspec.field(default_factory=_Handle)
    queue_id: _Handle = msgspec.field(default_factory=_Handle)
    kernel_id: int = 0
    dispatch_id: int = 0
    private_segment_size: int = 0
    group_segment_size: int = 0
    workgroup_size: _Dim = msgspec.field(default_factory=_Dim)
    grid_size: _Dim = msgspec.field(default_factory=_Dim)


class _Record(msgspec.Struct):
    """Every buffer record domain in one struct: the fields a domain lacks keep their defaults."""

    start_timestamp: int
    end_timestamp: int
    kind: int = 0
    operation: int = 0
    thread_id: int = 0
    correlation_id: _Correlation = msgspec.field(default_factory=_Correlation)
    dispatch_info: _DispatchInfo | None = None
    stream_id: _Handle | None = None
    src_agent_id: _Handle | None = None
    dst_agent_id: _Handle | None = None
    bytes: int | None = None


class _KernelSymbol(msgspec.Struct):
    kernel_id: int = 0
    kernel_name: str = ""
    formatted_kernel_name: str = ""
    demangled_kernel_name: str = ""
    sgpr_count: int | None = None
    arch_vgpr_count: int | None = None
    accum_vgpr_count: int | None = None


class _Strings(msgspec.Struct):
    buffer_records: list[dict] = []


class _Metadata(msgspec.Struct):
    pid: int = 0
    node: dict = {}
    init_time: int | None = None
    fini_time: int | None = None
    command: list[str] = []


class _Process(msgspec.Struct):
    metadata: _Metadata = msgspec.field(default_factory=_Metadata)
    agents: list[dict] = []
    strings: _Strings = msgspec.field(default_factory=_Strings)
    kernel_symbols: list[_KernelSymbol] = []
    buffer_records: dict[str, msgspec.Raw] = {}


class _File(msgspec.Struct, rename={"processes": "rocprofiler-sdk-tool"}):
    processes: list[_Process]


def read(path: Path, threads: int | None = None):
    from . import TraceData, read_bytes, slices_from_columns

    raw = read_bytes(path)
    notes = []
    try:
        try:
            processes = msgspec.json.decode(raw, type=_File).processes
        except UnicodeDecodeError:  # msgspec checks UTF-8 in strings: read them with the bad bytes replaced
            notes.append("invalid UTF-8 in strings replaced by U+FFFD")
            processes = msgspec.json.decode(raw.decode("utf-8", "replace").encode(), type=_File).processes
    except msgspec.ValidationError as e:
        raise TraceError(path, f"not a rocprofv3 JSON trace ({e})") from None
    except msgspec.DecodeError as e:
        raise TraceError(path, f"not valid JSON ({e})") from None
    del raw
    if not processes:
        raise TraceError(path, "empty trace: 'rocprofiler-sdk-tool' has no process")

    cols: dict[str, list] = {c: [] for c in _COLUMNS}
    devices: dict[int, dict] = {}
    skipped = 0
    unread: dict[str, int] = {}  # domains with no slices equivalent (allocations, page faults, ...)
    for proc in processes:
        agents = {a.get("id", {}).get("handle"): a for a in proc.agents if isinstance(a.get("id"), dict)}
        device_of = {h: _device_id(a) for h, a in agents.items() if a.get("type") == GPU_AGENT_TYPE}
        for handle, device_id in device_of.items():
            devices.setdefault(device_id, _device(device_id, agents[handle]))
        kernels = {k.kernel_id: k for k in proc.kernel_symbols}
        domains = [d.get("kind") for d in proc.strings.buffer_records]
        operations = [d.get("operations") or [] for d in proc.strings.buffer_records]
        pid = proc.metadata.pid
        for domain, raw in proc.buffer_records.items():
            kept = domain in DEVICE_DOMAINS or domain in API_KINDS
            try:
                records = msgspec.json.decode(raw, type=list[_Record] if kept else list[msgspec.Raw])
            except msgspec.ValidationError as e:
                raise TraceError(path, f"unreadable {domain} records ({e})") from None
            if not kept:
                unread[domain] = unread.get(domain, 0) + len(records)
                continue
            for r in records:
                if r.end_timestamp < r.start_timestamp:
                    skipped += 1
                    continue
                row = _row(domain, r, pid, device_of, kernels, domains, operations)
                if row is None:
                    skipped += 1
                    continue
                for c, v in zip(_COLUMNS, row):
                    cols[c].append(v)
    if not cols["ts"]:
        raise TraceError(path, "no timed records (no kernel dispatch, memory copy or API call)")

    n = len(cols["ts"])
    slices = slices_from_columns(cols)
    first = processes[0].metadata
    return TraceData(
        format=FORMAT,
        slices=slices,
        host_name=first.node.get("hostname"),
        event_count=n + skipped + sum(unread.values()),
        skipped={"unusable record (negative duration or unknown agent)": skipped} if skipped else {},
        notes=notes + [f"{n} {domain} records not kept (no table for them yet)" for domain, n in unread.items() if n],
        metadata={"processes": [{"pid": p.metadata.pid, "command": p.metadata.command,
                                 "init_time": p.metadata.init_time, "fini_time": p.metadata.fini_time}
                                for p in processes], "node": first.node},
        devices=sorted(devices.values(), key=lambda d: d["device_id"]),
    )


_COLUMNS = ("kind", "category", "name", "ts", "dur", "pid", "tid", "device_id", "stream", "track",
            "correlation", "external_id", "args")


def _row(domain, r: _Record, pid, device_of, kernels, domains, operations):
    """One record as the values of _COLUMNS, or None when its device cannot be told."""
    category = domains[r.kind] if 0 <= r.kind < len(domains) else domain
    external = r.correlation_id.external or None  # 0 means "no external correlation" in rocprofiler-sdk
    dur = r.end_timestamp - r.start_timestamp
    if r.dispatch_info is not None:
        info = r.dispatch_info
        device_id = device_of.get(info.agent_id.handle)
        if device_id is None:
            return None
        sym = kernels.get(info.kernel_id)
        name = (sym.formatted_kernel_name or sym.demangled_kernel_name or sym.kernel_name) if sym else None
        args = {"dispatch_id": info.dispatch_id, "kernel_id": info.kernel_id, "queue": info.queue_id.handle,
                "hip_stream": r.stream_id.handle if r.stream_id else None,
                "grid_size": [info.grid_size.x, info.grid_size.y, info.grid_size.z],
                "workgroup_size": [info.workgroup_size.x, info.workgroup_size.y, info.workgroup_size.z],
                "private_segment_size": info.private_segment_size, "group_segment_size": info.group_segment_size,
                "sgpr_count": sym.sgpr_count if sym else None, "arch_vgpr_count": sym.arch_vgpr_count if sym else None,
                "accum_vgpr_count": sym.accum_vgpr_count if sym else None}
        stream = info.queue_id.handle
        return ("kernel", category, name or f"kernel {info.kernel_id}", r.start_timestamp, dur, pid, r.thread_id,
                device_id, stream, f"device {device_id} / stream {stream}", r.correlation_id.internal, external,
                msgspec.json.encode(args).decode())
    if r.dst_agent_id is not None:
        # the GPU end of the copy owns it (device-to-device copies: the destination)
        handle = r.dst_agent_id.handle if r.dst_agent_id.handle in device_of else (r.src_agent_id or _Handle()).handle
        device_id = device_of.get(handle)
        if device_id is None:
            return None
        # copies run on DMA engines, not on a dispatch queue: one lane per device, apart from the kernel queues
        stream = r.stream_id.handle if r.stream_id else -1
        ops = operations[r.kind] if 0 <= r.kind < len(operations) else []
        name = ops[r.operation] if 0 <= r.operation < len(ops) else f"memory copy {r.operation}"
        args = {"bytes": r.bytes, "src_agent": r.src_agent_id.handle if r.src_agent_id else None,
                "dst_agent": r.dst_agent_id.handle}
        return ("memcpy", category, name, r.start_timestamp, dur, pid, r.thread_id, device_id, stream,
                f"device {device_id} / stream {stream}", r.correlation_id.internal, external,
                msgspec.json.encode(args).decode())
    kind = API_KINDS.get(domain)
    if kind is None:
        return None
    ops = operations[r.kind] if 0 <= r.kind < len(operations) else []
    name = ops[r.operation] if 0 <= r.operation < len(ops) else f"{domain} {r.operation}"
    return (kind, category, name, r.start_timestamp, dur, pid, r.thread_id, None, None,
            f"process {pid} / thread {r.thread_id}", r.correlation_id.internal, external, None)


def _device_id(agent: dict) -> int:
    """The GPU's index as HIP numbers devices (gpu_index), else its index among GPU nodes."""
    for key in ("gpu_index", "logical_node_type_id"):
        if isinstance(agent.get(key), int) and agent[key] >= 0:
            return agent[key]
    return agent.get("node_id", 0)


def _device(device_id: int, agent: dict) -> dict:
    banks = agent.get("mem_banks") or []
    local = sum(b.get("size_in_bytes", 0) for b in banks if isinstance(b, dict) and b.get("heap_type") == 1)
    return {
        "device_id": device_id,
        "name": agent.get("product_name") or agent.get("name") or None,
        "total_memory_bytes": local or None,
        "compute_capability": agent.get("name") or None,  # the gfx target, e.g. 'gfx950'
        "sm_count": agent.get("cu_count"),
        "properties": agent,
    }
