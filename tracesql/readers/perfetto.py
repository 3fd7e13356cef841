"""Perfetto protobuf traces with TrackEvent packets (`*.pftrace`, `*.perfetto-trace[.gz]`).

Decoded with the `perfetto` package's protobuf classes (the trace processor binary is not needed). What is read:
track descriptors (process, thread and named tracks, with parents), slice begin/end pairs (nested per track),
instants, interned names/categories/annotation names (per packet sequence, reset when a packet says its
incremental state was cleared), debug annotations (-> args JSON) and flows/correlation ids (-> correlation).
Counter values are counted, not kept: there is no counters table.

A track is a device track when its name or an ancestor's names a GPU/device/stream/queue; the kind comes from
the category when the producer writes Kineto's categories, else from the track (device: kernel, host: annotation).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa

from ..errors import TraceError
from .kineto import CATEGORY_KINDS, DEVICE_KINDS

FORMAT = "perfetto"
SUFFIXES = (".pftrace", ".perfetto-trace", ".perfetto-trace.gz")

_PACKET_TAG = 0x0A  # Trace.packet: field 1, length-delimited
_DEVICE_TRACK = re.compile(r"(?i)\b(gpu|device|stream|queue|cuda|hip)\b")
_DEVICE_NUMBER = re.compile(r"(?i)\b(?:gpu|device)\s*[:#]?\s*(\d+)")
_STREAM_NUMBER = re.compile(r"(?i)\b(?:stream|queue)\s*[:#]?\s*(\d+)")
_INCREMENTAL_STATE_CLEARED = 1


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while pos < len(buf):
        b = buf[pos]
        value |= (b & 0x7F) << shift
        pos += 1
        if not b & 0x80:
            return value, pos
        shift += 7
    return -1, pos


def detect(path: Path, head: bytes) -> bool:
    """A Trace is a run of `packet` fields: the head must be one, packet after packet, each with a valid first
    field tag (random bytes starting with 0x0A rarely chain that way)."""
    pos = 0
    while pos < len(head):
        if head[pos] != _PACKET_TAG:
            return False
        length, start = _varint(head, pos + 1)
        if length < 0:
            return pos > 0
        if start < len(head) and length:
            tag, _ = _varint(head, start)
            if tag >> 3 == 0 or tag & 7 not in (0, 1, 2, 5):
                return False
        pos = start + length
    return True


def _signed(v: int) -> int:
    """uint64 ids (flows, uuids) as the int64 the schema stores."""
    return v - (1 << 64) if v >= 1 << 63 else v


class _Sequence:
    """Per packet sequence: interned strings and the default track."""

    def __init__(self):
        self.names: dict[int, str] = {}
        self.categories: dict[int, str] = {}
        self.annotation_names: dict[int, str] = {}
        self.annotation_strings: dict[int, str] = {}
        self.default_track = 0

    def intern(self, interned) -> None:
        for entries, table, field in ((interned.event_names, self.names, "name"),
                                      (interned.event_categories, self.categories, "name"),
                                      (interned.debug_annotation_names, self.annotation_names, "name"),
                                      (interned.debug_annotation_string_values, self.annotation_strings, "str")):
            for e in entries:
                table[e.iid] = _text(getattr(e, field))


def _text(value):
    """A protobuf string field as str: with invalid UTF-8 the runtime hands back bytes."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _annotation_value(a, seq: _Sequence):
    kind = a.WhichOneof("value")
    if kind == "legacy_json_value":
        try:
            return json.loads(a.legacy_json_value)
        except (ValueError, RecursionError):
            return _text(a.legacy_json_value)
    if kind == "string_value_iid":
        return seq.annotation_strings.get(a.string_value_iid)
    if kind == "nested_value":
        return None  # the deprecated NestedValue form: producers now write dict_entries/array_values
    if kind is not None:
        return _text(getattr(a, kind))
    if a.dict_entries:
        return {_annotation_name(e, seq): _annotation_value(e, seq) for e in a.dict_entries}
    if a.array_values:
        return [_annotation_value(e, seq) for e in a.array_values]
    return None


def _annotation_name(a, seq: _Sequence) -> str:
    return _text(a.name) if a.HasField("name") else seq.annotation_names.get(a.name_iid, f"arg{a.name_iid}")


class _Track:
    def __init__(self, desc, tracks: dict):
        self.uuid = desc.uuid
        self.parent = tracks.get(desc.parent_uuid) if desc.HasField("parent_uuid") else None
        self.name = _text(desc.name or desc.static_name or "")
        self.pid = desc.process.pid if desc.HasField("process") else (
            desc.thread.pid if desc.HasField("thread") else (self.parent.pid if self.parent else 0))
        self.is_thread = desc.HasField("thread")
        self.tid = desc.thread.tid if self.is_thread else 0
        self.process_name = _text(desc.process.process_name) if desc.HasField("process") else (
            self.parent.process_name if self.parent else "")
        if desc.HasField("thread") and desc.thread.thread_name:
            self.name = self.name or _text(desc.thread.thread_name)
        names = [t.name for t in self._chain()]
        self.on_device = any(_DEVICE_TRACK.search(n) for n in names)
        device = next((m for n in names if (m := _DEVICE_NUMBER.search(n))), None)
        self.device_id = int(device.group(1)) if device else 0
        stream = _STREAM_NUMBER.search(self.name)
        self.stream = int(stream.group(1)) if stream else None  # filled in by the reader when unnamed

    def _chain(self):
        t = self
        while t is not None:
            yield t
            t = t.parent

    def host_label(self) -> str:
        process = self.process_name or f"process {self.pid}"
        return f"{process} / {self.name or (f'thread {self.tid}' if self.is_thread else 'process')}"


def read(path: Path, threads: int | None = None):
    from google.protobuf.message import DecodeError
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackDescriptor, TrackEvent

    from . import TraceData, read_bytes

    try:
        trace = Trace.FromString(read_bytes(path))
    except DecodeError as e:
        raise TraceError(path, f"truncated or damaged protobuf ({e})") from None
    if not trace.packet:
        raise TraceError(path, "empty trace: no packets")

    # Descriptors first: a producer may describe a track after events on it (or in another sequence).
    tracks: dict[int, _Track] = {}
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            tracks[p.track_descriptor.uuid] = _Track(p.track_descriptor, tracks)
    unnamed_streams = iter(range(1 << 20, 1 << 21))  # lanes for device tracks that carry no stream number
    for t in tracks.values():
        if t.on_device and t.stream is None:
            t.stream = next(unnamed_streams)
    default = _Track(TrackDescriptor(), tracks)  # events on no described track: host, process 0

    rows: list[tuple] = []  # kind, category, name, ts, dur, track, correlation, external_id, args, flows
    open_slices: dict[int, list[list]] = {}
    sequences: dict[int, _Sequence] = {}
    skipped: dict[str, int] = {}
    counters = 0

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    for p in trace.packet:
        seq_id = p.trusted_packet_sequence_id
        if p.sequence_flags & _INCREMENTAL_STATE_CLEARED or seq_id not in sequences:
            sequences[seq_id] = _Sequence()
        seq = sequences[seq_id]
        if p.HasField("interned_data"):
            seq.intern(p.interned_data)
        if p.HasField("trace_packet_defaults"):
            seq.default_track = p.trace_packet_defaults.track_event_defaults.track_uuid
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        track_uuid = e.track_uuid if e.HasField("track_uuid") else seq.default_track
        if e.type == TrackEvent.TYPE_COUNTER:
            counters += 1
            continue
        if e.type == TrackEvent.TYPE_SLICE_END:
            stack = open_slices.get(track_uuid)
            if not stack:
                skip("slice end without a begin")
                continue
            row = stack.pop()
            if p.timestamp < row[3]:
                skip("slice ends before it begins")
                continue
            row[4] = p.timestamp - row[3]
            row[9] += [*e.flow_ids, *e.terminating_flow_ids]
            rows.append(tuple(row))
            continue
        if e.type not in (TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_INSTANT):
            skip("unsupported track event type")
            continue
        name = _text(e.name) if e.HasField("name") else seq.names.get(e.name_iid)
        categories = [_text(c) for c in e.categories] or [seq.categories.get(i, "") for i in e.category_iids]
        args = {_annotation_name(a, seq): _annotation_value(a, seq) for a in e.debug_annotations}
        external = args.get("External id")
        row = [None, ",".join(categories) or None, name, p.timestamp, 0, track_uuid,
               e.correlation_id if e.HasField("correlation_id") else None,
               external if isinstance(external, int) else None,
               json.dumps(args) if args else None, [*e.flow_ids, *e.terminating_flow_ids]]
        if e.type == TrackEvent.TYPE_INSTANT:
            row[0] = "instant"
            rows.append(tuple(row))
        else:
            open_slices.setdefault(track_uuid, []).append(row)
    unfinished = sum(len(s) for s in open_slices.values())
    if unfinished:
        skipped["slice never ended"] = unfinished
    if not rows:
        raise TraceError(path, "no slices (no TrackEvent slice or instant on any track)")
    return TraceData(
        format=FORMAT,
        slices=_slices(rows, tracks, default),
        event_count=len(rows) + sum(skipped.values()) + counters,
        skipped=skipped,
        notes=[f"{counters} counter values not kept (no counters table yet)"] if counters else [],
        metadata={"tracks": len(tracks)},
    )


def _slices(rows: list[tuple], tracks: dict, default: _Track) -> pa.Table:
    from . import slices_from_columns

    # kinds first (devices depend on them), then flows: a flow links a host slice and a device slice
    kinds = []
    for kind, category, _, _, _, uuid, *_ in rows:
        track = tracks.get(uuid, default)
        kinds.append(kind or CATEGORY_KINDS.get((category or "").lower())
                     or ("kernel" if track.on_device else "user_annotation"))
    sides: dict[int, set[bool]] = {}
    for kind, row in zip(kinds, rows):
        for flow in row[9]:
            sides.setdefault(flow, set()).add(kind in DEVICE_KINDS)
    cols: dict[str, list] = {c: [] for c in ("pid", "tid", "device_id", "stream", "track", "correlation")}
    for kind, row in zip(kinds, rows):
        track = tracks.get(row[5], default)
        on_device = kind in DEVICE_KINDS
        cols["pid"].append(track.pid)
        cols["tid"].append(track.stream if on_device else track.tid)
        cols["device_id"].append(track.device_id if on_device else None)
        cols["stream"].append((track.stream if track.stream is not None else 0) if on_device else None)
        cols["track"].append(f"device {track.device_id} / stream {cols['stream'][-1]}" if on_device
                             else track.host_label())
        linking = next((f for f in row[9] if len(sides[f]) == 2), None)
        cols["correlation"].append(row[6] if row[6] is not None else (_signed(linking) if linking is not None
                                                                         else None))
    return slices_from_columns({
        "kind": kinds, "category": [r[1] for r in rows], "name": [r[2] for r in rows],
        "ts": [r[3] for r in rows], "dur": [r[4] for r in rows], "external_id": [r[7] for r in rows],
        "args": [r[8] for r in rows], **cols,
    })
