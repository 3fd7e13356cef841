"""PyTorch profiler (Kineto) JSON traces: `*.pt.trace.json[.gz]` from CUDA, ROCm, MTIA and CPU runs.

Speed: the file is decoded once by msgspec into small typed structs whose `args` stay raw JSON bytes; names
and categories are dictionary-encoded with a Python dict; numbers go through numpy; the JSON fields that
other columns need (correlation, stream, ...) are pulled out of `args` by DuckDB in one vectorized pass.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Union

import msgspec
import numpy as np
import pyarrow as pa

from .. import arrays
from ..errors import TraceError

FORMAT = "kineto"


class Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: Union[str, None] = None
    cat: Union[str, None] = None
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    ts: Union[float, None] = None
    dur: Union[float, None] = None
    args: msgspec.Raw = msgspec.Raw(b"")


class LinkArgs(msgspec.Struct, gc=False, frozen=True):
    """The args other columns are built from; a second, cheap decode pass (unknown keys are skipped)."""

    correlation: Union[int, None] = None
    external_id: Union[int, None] = msgspec.field(default=None, name="External id")
    stream: Union[int, None] = None
    device: Union[int, None] = None


class EventLinks(msgspec.Struct, gc=False):
    args: LinkArgs = LinkArgs()


# Kineto category (lower case) -> slices.kind. Declared, not branched on, so new categories are one line.
CATEGORY_KINDS = {
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "python_function": "python_function",
    "cuda_runtime": "runtime",
    "hip_runtime": "runtime",
    "mtia_runtime": "runtime",
    "privateuse1_runtime": "runtime",
    "cuda_driver": "driver",
    "hip_driver": "driver",
    "privateuse1_driver": "driver",
    "kernel": "kernel",
    "mtia_ccp_events": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "gpu_user_annotation": "gpu_annotation",
    "cuda_sync": "sync",
    "trace": "profiler",
    "cpu_instant_event": "instant",
    "overhead": "profiler",
}
DEVICE_KINDS = ("kernel", "memcpy", "memset", "gpu_annotation", "sync")
# Device events whose name, not category, says what they are.
NAME_KINDS = {("mtia_ccp_events", "dma_request"): "memcpy"}

SLICE_PHASES = ("X", "i", "I")
KNOWN_OTHER_PHASES = ("M", "s", "f", "t")  # metadata and flows: used or deliberately not kept

_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_.]?(\d+)", re.IGNORECASE)


def detect(path: Path, head: bytes) -> bool:
    text = head.lstrip()
    return text[:1] == b"{" and any(k in text for k in (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"'))


def rank_from_file_name(path: Path) -> int | None:
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m else None


def _decode(path: Path, data: bytes, notes: list[str]):
    try:
        top = msgspec.json.decode(data, type=dict[str, msgspec.Raw])
    except msgspec.ValidationError:
        raise TraceError(path, "not a trace: the JSON is not an object") from None
    except msgspec.DecodeError as e:
        raise TraceError(path, f"not valid JSON ({e})") from None
    if "traceEvents" not in top:
        raise TraceError(path, "not a trace: JSON object has no 'traceEvents'")
    raw_events = top.pop("traceEvents")
    try:
        events = msgspec.json.decode(raw_events, type=list[Event])
        skipped_types = 0
    except msgspec.ValidationError:
        events, skipped_types = _decode_one_by_one(path, raw_events)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        if not isinstance(e, UnicodeDecodeError) and "utf-8" not in str(e).lower():
            raise TraceError(path, f"not valid JSON ({e})") from None
        notes.append("invalid UTF-8 in names replaced by U+FFFD")
        fixed = bytes(raw_events).decode("utf-8", "replace").encode()
        events, skipped_types = _decode_one_by_one(path, fixed)
    links = _decode_links(raw_events, len(events)) if not skipped_types else None
    meta = {}
    for key, raw in top.items():
        try:
            meta[key] = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            meta[key] = None
    return events, links, skipped_types, meta


def _decode_links(raw_events, n: int) -> list[EventLinks] | None:
    try:
        links = msgspec.json.decode(raw_events, type=list[EventLinks])
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None  # a damaged args value: fall back to decoding the kept events' args one by one
    return links if len(links) == n else None


def _decode_one_by_one(path: Path, raw_events) -> tuple[list[Event], int]:
    """Slow path for a trace with some malformed events: keep the good ones, count the rest."""
    try:
        raws = msgspec.json.decode(raw_events, type=list[msgspec.Raw])
    except msgspec.ValidationError:
        raise TraceError(path, "not a trace: 'traceEvents' is not a list") from None
    decode = msgspec.json.Decoder(Event).decode
    events, bad = [], 0
    for raw in raws:
        try:
            events.append(decode(raw))
        except (msgspec.ValidationError, msgspec.DecodeError):
            bad += 1
    return events, bad


def _codes(values: list) -> tuple[np.ndarray, list]:
    """Dictionary-encode a list of hashables: (int32 codes, unique values in first-seen order)."""
    lookup: dict = {}
    codes = np.array([lookup.setdefault(v, len(lookup)) for v in values], np.int32)
    return codes, list(lookup)


def _dictionary(codes: np.ndarray, values: list) -> pa.DictionaryArray:
    """Codes + values -> a dictionary array; a None value becomes a null entry (Parquet cannot store a null key)."""
    mask = None
    if None in values:
        mask = codes == values.index(None)
        values = ["" if v is None else v for v in values]
    return pa.DictionaryArray.from_arrays(arrays.array(codes, pa.int32(), mask), arrays.strings(values))


def _ns(us: np.ndarray) -> np.ndarray:
    """Float microseconds -> int64 nanoseconds, rounding the fraction separately so large epoch values keep ns."""
    whole = np.floor(us)
    return whole.astype(np.int64) * 1000 + np.rint((us - whole) * 1000).astype(np.int64)


def _raw_json_column(raws: list) -> pa.Array:
    """Raw JSON byte strings -> an Arrow string array without a per-element Python copy; b'' -> NULL."""
    lengths = np.fromiter(map(len, raws), np.int64, len(raws))
    offsets = np.zeros(len(raws) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    validity = arrays.bitmap(lengths > 0) if (lengths == 0).any() else None
    return pa.LargeStringArray.from_buffers(len(raws), pa.py_buffer(offsets), pa.py_buffer(b"".join(raws)), validity)


def _ids(values: list, labels: dict[int, str]) -> np.ndarray:
    """pid/tid values -> int64. A label such as 'Spans' gets a stable negative id, recorded in `labels`."""
    if set(map(type, values)) <= {int}:  # the usual case, without a dictionary
        return np.array(values, np.int64)
    codes, uniques = _codes(values)
    mapped = []
    for v in uniques:
        if type(v) is int:
            mapped.append(v)
        else:
            labels[-1 - len(labels)] = str(v)
            mapped.append(-len(labels))
    return np.array(mapped, np.int64)[codes] if mapped else np.zeros(0, np.int64)


def _nullable_int(values: list, arrow_type=pa.int64()) -> pa.Array:
    arr = np.array(values, dtype=np.float64)  # None -> NaN; ids are far below 2**53
    missing = np.isnan(arr)
    return arrays.array(np.where(missing, 0, arr).astype(np.int64), arrow_type, missing)


def read(path: Path):
    from . import TraceData, read_bytes

    notes: list[str] = []
    events, links, skipped_types, meta = _decode(path, read_bytes(path), notes)
    if not events:
        raise TraceError(path, "empty trace: 'traceEvents' has no events")
    skipped: dict[str, int] = {}
    if skipped_types:
        skipped["malformed event"] = skipped_types

    ph_codes, phs = _codes([e.ph for e in events])
    ph_is = lambda names: np.isin(ph_codes, [i for i, p in enumerate(phs) if p in names])  # noqa: E731
    timed, is_x = ph_is(SLICE_PHASES), ph_is(("X",))
    unsupported = int((~timed & ~ph_is(KNOWN_OTHER_PHASES)).sum())
    if unsupported:
        skipped["unsupported phase"] = unsupported

    ts = np.array([e.ts for e in events], np.float64)
    dur = np.where(is_x, np.array([e.dur for e in events], np.float64), 0.0)
    bad_ts = timed & ~np.isfinite(ts)
    bad_dur = timed & ~bad_ts & (~np.isfinite(dur) | (dur < 0))
    for reason, mask in (("missing or non-numeric ts", bad_ts), ("missing or negative dur", bad_dur)):
        if mask.any():
            skipped[reason] = int(mask.sum())
    keep = np.flatnonzero(timed & ~bad_ts & ~bad_dur)
    if not len(keep):
        raise TraceError(path, "no timed events (every event lacks a usable ts/dur)")

    kept = [events[i] for i in keep.tolist()]
    labels: dict[int, str] = {}
    pid = _ids([e.pid for e in kept], labels)
    tid = _ids([e.tid for e in kept], labels)
    name_codes, names = _codes([e.name for e in kept])
    cat_codes, cats = _codes([e.cat for e in kept])
    kind_codes, kinds = _kinds(cat_codes, cats, name_codes, names, ~is_x[keep])
    on_device = np.isin(kind_codes, [i for i, k in enumerate(kinds) if k in DEVICE_KINDS])

    kept_links = [links[i].args for i in keep.tolist()] if links is not None else [_link_args(e) for e in kept]
    device = np.array([a.device for a in kept_links], np.float64)
    stream = np.array([a.stream for a in kept_links], np.float64)
    device = np.where(np.isnan(device), pid, device)  # Kineto puts the device in pid and the stream in tid
    stream = np.where(np.isnan(stream), tid, stream)
    lanes = np.stack([on_device, np.where(on_device, device, pid), np.where(on_device, stream, tid)], 1).astype(np.int64)
    device_id = arrays.array(device.astype(np.int32), pa.int32(), ~on_device)
    stream_id = arrays.array(stream.astype(np.int64), pa.int64(), ~on_device)

    base_time_ns = int(meta.get("baseTimeNanoseconds") or 0)
    slices = pa.table(
        {
            "slice_id": arrays.array(np.arange(len(kept), dtype=np.int64)),
            "kind": _dictionary(kind_codes, kinds),
            "category": _dictionary(cat_codes, cats),
            "name": _dictionary(name_codes, names),
            "ts": arrays.array(_ns(ts[keep]) + base_time_ns),
            "dur": arrays.array(_ns(dur[keep])),
            "pid": arrays.array(pid),
            "tid": arrays.array(tid),
            "device_id": device_id,
            "stream": stream_id,
            "track": _tracks([events[i] for i in np.flatnonzero(ph_is(("M",))).tolist()], labels, lanes),
            "correlation": _nullable_int([a.correlation for a in kept_links]),
            "external_id": _nullable_int([a.external_id for a in kept_links]),
            "args": _raw_json_column([e.args for e in kept]),
        }
    )

    dist = meta.pop("distributedInfo", None)
    dist = dist if isinstance(dist, dict) else {}
    rank = dist.get("rank")
    if not isinstance(rank, int):
        rank = rank_from_file_name(path)
    return TraceData(
        format=FORMAT,
        slices=slices,
        rank=rank,
        world_size=dist.get("world_size") if isinstance(dist.get("world_size"), int) else None,
        backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        host_name=meta.get("host_name") or meta.get("hostname"),
        base_time_ns=base_time_ns,
        event_count=len(events) + skipped_types,
        skipped=skipped,
        notes=notes,
        metadata={k: v for k, v in meta.items() if k != "deviceProperties"},
        devices=_devices(meta.get("deviceProperties")),
        process_groups=_process_groups(dist),
    )


def _link_args(e: Event) -> LinkArgs:
    try:
        return msgspec.json.decode(e.args, type=EventLinks).args if e.args else LinkArgs()
    except (msgspec.ValidationError, msgspec.DecodeError):
        return LinkArgs()


def _kinds(cat_codes, cats, name_codes, names, instant) -> tuple[np.ndarray, list[str]]:
    """slices.kind for each event, as (codes, kinds): by category, then the (category, name) exceptions, then
    instants. Works on codes: comparing strings per event would cost more than the whole decode."""
    kinds = sorted(set(CATEGORY_KINDS.values()) | set(NAME_KINDS.values()) | {"other", "instant", "memory"})
    code = {k: i for i, k in enumerate(kinds)}
    per_cat = np.array([code[CATEGORY_KINDS.get((c or "").lower(), "other")] for c in cats] or [0], np.int32)
    kind = per_cat[cat_codes]
    name_index = {nm: i for i, nm in enumerate(names)}
    cat_index = {c: i for i, c in enumerate(cats)}
    for (cat, nm), k in NAME_KINDS.items():
        if nm in name_index and cat in cat_index:
            kind[(name_codes == name_index[nm]) & (cat_codes == cat_index[cat])] = code[k]
    kind[instant] = code["instant"]
    if "[memory]" in name_index:
        kind[name_codes == name_index["[memory]"]] = code["memory"]
    return kind, kinds


def _tracks(metadata_events, labels, lanes) -> pa.Array:
    """A readable label per lane (rows of [on_device, pid or device, tid or stream]) from the trace's
    process_name/thread_name metadata events."""
    procs: dict[int, str] = dict(labels)
    threads: dict[tuple[int, int], str] = {}
    for e in metadata_events:
        if e.name not in ("process_name", "thread_name") or type(e.pid) is not int:
            continue
        try:
            label = msgspec.json.decode(e.args).get("name")
        except (msgspec.DecodeError, AttributeError):
            continue
        if not isinstance(label, str):
            continue
        if e.name == "process_name":
            procs.setdefault(e.pid, label)
        elif type(e.tid) is int:
            threads.setdefault((e.pid, e.tid), label)  # first name wins: threads get renamed mid-trace
    # factorize the (on_device, a, b) rows with 1-D sorts: a row-wise np.unique sorts whole rows, 10x slower
    a_codes = np.unique(lanes[:, 1], return_inverse=True)[1].reshape(-1)
    b_values, b_codes = np.unique(lanes[:, 2], return_inverse=True)
    combined = (a_codes.astype(np.int64) * len(b_values) + b_codes.reshape(-1)) * 2 + lanes[:, 0]
    first_rows, codes = np.unique(combined, return_index=True, return_inverse=True)[1:]
    text = []
    for dev, a, b in lanes[first_rows].tolist():
        if dev:
            text.append(f"device {a} / stream {b}")
        else:
            text.append(f"{procs.get(a) or f'process {a}'} / {threads.get((a, b)) or labels.get(b) or f'thread {b}'}")
    return _dictionary(codes.reshape(-1).astype(np.int32), text)


def _devices(props) -> list[dict]:
    out = []
    for p in props if isinstance(props, list) else []:
        if not isinstance(p, dict) or not isinstance(p.get("id"), int):
            continue
        major, minor = p.get("computeMajor"), p.get("computeMinor")
        out.append(
            {
                "device_id": p["id"],
                "name": p.get("name") or None,
                "total_memory_bytes": p.get("totalGlobalMem"),
                "compute_capability": f"{major}.{minor}" if major is not None else p.get("gcnArchName"),
                "sm_count": p.get("numSms"),
                "properties": p,
            }
        )
    return out


def _process_groups(dist) -> list[dict]:
    if not isinstance(dist, dict):
        return []
    groups = []
    for g in dist.get("pg_config") or []:
        if not isinstance(g, dict):
            continue
        ranks = g.get("ranks")
        groups.append(
            {
                "pg_name": str(g.get("pg_name")) if g.get("pg_name") is not None else None,
                "pg_desc": g.get("pg_desc"),
                "backend": g.get("backend_config"),
                "group_size": g.get("pg_size"),
                "group_ranks": [r for r in ranks if isinstance(r, int)] if isinstance(ranks, list) else None,
            }
        )
    return groups
