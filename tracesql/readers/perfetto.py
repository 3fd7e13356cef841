"""Perfetto protobuf traces with TrackEvent packets (`*.pftrace`, `*.perfetto-trace[.gz]`).

Decoded with the `perfetto` package's protobuf classes (the trace processor binary is not needed). What is read:
track descriptors (process, thread and named tracks, with parents), slice begin/end pairs (nested per track),
instants, interned names/categories/annotation names (per packet sequence, reset when a packet says its
incremental state was cleared), debug annotations (-> args JSON), flows/correlation ids (-> correlation) and
counter tracks (counter events and the extra counter values slices carry, scaled by the track's unit multiplier,
summed when incremental -> counters).

A track is a device track when its name or an ancestor's names a GPU/device/stream/queue; the kind comes from
the category when the producer writes Kineto's categories, else from the track (device: kernel, host: annotation).
"""

from __future__ import annotations

import json
import re
from collections import Counter
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


_BOOTTIME = 6  # the clock of a packet that names none
_FIRST_SEQUENCE_CLOCK = 64  # ids from here on are clocks of one packet sequence


class _SequenceClock:
    def __init__(self, clock, reference_ns: int):
        self.incremental = clock.is_incremental
        self.unit_ns = clock.unit_multiplier_ns or 1
        self.at_snapshot = self.last = clock.timestamp
        self.reference_ns = reference_ns  # the snapshot's instant on the trace's clock


class _Clocks:
    """Packet timestamps -> ns on the trace's primary clock. A packet is timed on a builtin clock (BOOTTIME unless
    its sequence's defaults say otherwise) or on a clock of its sequence (Chrome writes µs deltas on an incremental
    one); ClockSnapshot packets relate them."""

    def __init__(self):
        self.offsets: dict[int, int] | None = None  # builtin clock -> ns to add to reach the primary clock
        self.sequence_clocks: dict[tuple[int, int], _SequenceClock] = {}

    def snapshot(self, seq_id: int, snap) -> None:
        builtin = {c.clock_id: c.timestamp for c in snap.clocks if c.clock_id < _FIRST_SEQUENCE_CLOCK}
        if self.offsets is None and builtin:
            primary = snap.primary_trace_clock or _BOOTTIME
            base = builtin.get(primary)
            self.offsets = {c: base - t for c, t in builtin.items()} if base is not None else {}
        ref = next(iter(builtin.items()), None)
        for c in snap.clocks:
            if c.clock_id >= _FIRST_SEQUENCE_CLOCK and ref is not None:
                self.sequence_clocks[seq_id, c.clock_id] = _SequenceClock(c, ref[1] + self._offset(ref[0]))

    def _offset(self, clock_id: int) -> int:
        return (self.offsets or {}).get(clock_id, 0)

    def ns(self, p, seq_id: int, default_clock: int | None) -> int | None:
        """The packet's time, or None when it is on a sequence clock no snapshot defined."""
        clock_id = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else (default_clock or _BOOTTIME)
        if clock_id < _FIRST_SEQUENCE_CLOCK:
            return p.timestamp + self._offset(clock_id)
        clock = self.sequence_clocks.get((seq_id, clock_id))
        if clock is None:
            return None
        value = clock.last + p.timestamp if clock.incremental else p.timestamp
        clock.last = value if clock.incremental else clock.last
        return clock.reference_ns + (value - clock.at_snapshot) * clock.unit_ns


class _Sequence:
    """Per packet sequence: interned strings and the default track."""

    def __init__(self):
        self.names: dict[int, str] = {}
        self.categories: dict[int, str] = {}
        self.annotation_names: dict[int, str] = {}
        self.annotation_strings: dict[int, str] = {}
        self.default_track = 0
        self.default_clock: int | None = None
        self.counter_sums: dict[int, float] = {}  # incremental counter tracks: the sum so far on this sequence
        self.extra_counter_tracks: list[int] = []  # for slices that carry counter values without naming tracks
        self.extra_double_counter_tracks: list[int] = []

    def counter_value(self, track, value: float) -> float:
        """A counter sample in the track's units times its multiplier; incremental tracks' deltas summed."""
        counter = track.counter
        if counter is None:
            return value
        value *= counter.unit_multiplier or 1
        if counter.is_incremental:
            value = self.counter_sums[track.uuid] = self.counter_sums.get(track.uuid, 0) + value
        return value

    def intern(self, interned) -> None:
        for entries, table, field in ((interned.event_names, self.names, "name"),
                                      (interned.event_categories, self.categories, "name"),
                                      (interned.debug_annotation_names, self.annotation_names, "name"),
                                      (interned.debug_annotation_string_values, self.annotation_strings, "str")):
            for e in entries:
                value = getattr(e, field)
                table[e.iid] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _annotation_value(a, seq: _Sequence):
    kind = a.WhichOneof("value")
    if kind == "legacy_json_value":
        try:
            return json.loads(a.legacy_json_value)
        except ValueError:
            return a.legacy_json_value
    if kind == "string_value_iid":
        return seq.annotation_strings.get(a.string_value_iid)
    if kind == "nested_value":
        return None  # the deprecated NestedValue form: producers now write dict_entries/array_values
    if kind is not None:
        return getattr(a, kind)
    if a.dict_entries:
        return {_annotation_name(e, seq): _annotation_value(e, seq) for e in a.dict_entries}
    if a.array_values:
        return [_annotation_value(e, seq) for e in a.array_values]
    return None


def _annotation_name(a, seq: _Sequence) -> str:
    return a.name if a.HasField("name") else seq.annotation_names.get(a.name_iid, f"arg{a.name_iid}")


class _Track:
    def __init__(self, desc, tracks: dict):
        self.uuid = desc.uuid
        self.parent = tracks.get(desc.parent_uuid) if desc.HasField("parent_uuid") else None
        self.name = desc.name or desc.static_name or ""
        self.pid = desc.process.pid if desc.HasField("process") else (
            desc.thread.pid if desc.HasField("thread") else (self.parent.pid if self.parent else 0))
        self.is_thread = desc.HasField("thread")
        self.tid = desc.thread.tid if self.is_thread else 0
        self.process_name = desc.process.process_name if desc.HasField("process") else (
            self.parent.process_name if self.parent else "")
        if desc.HasField("thread") and desc.thread.thread_name:
            self.name = self.name or desc.thread.thread_name
        names = [t.name for t in self._chain()]
        self.on_device = any(_DEVICE_TRACK.search(n) for n in names)
        device = next((m for n in names if (m := _DEVICE_NUMBER.search(n))), None)
        self.device_id = int(device.group(1)) if device else 0
        stream = _STREAM_NUMBER.search(self.name)
        self.stream = int(stream.group(1)) if stream else None  # filled in by the reader when unnamed
        self.counter = desc.counter if desc.HasField("counter") else None
        self.shared_name = False  # another thread of the process has this name (a pool's workers): add the tid

    def _chain(self):
        t = self
        while t is not None:
            yield t
            t = t.parent

    def home(self) -> str:
        """Where a counter track belongs: its device, its thread (as slices name it) or its process."""
        if self.on_device:
            return f"device {self.device_id}"
        if self.parent is not None and self.parent.is_thread:
            return self.parent.host_label()
        return self.process_name or f"process {self.pid}"

    def host_label(self) -> str:
        process = self.process_name or f"process {self.pid}"
        name = self.name or (f"thread {self.tid}" if self.is_thread else "process")
        return f"{process} / {name} {self.tid}" if self.shared_name else f"{process} / {name}"


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
    threads_named = Counter((t.pid, t.name) for t in tracks.values() if t.is_thread)
    for t in tracks.values():
        t.shared_name = t.is_thread and threads_named[t.pid, t.name] > 1

    rows: list[tuple] = []  # kind, category, name, ts, dur, track, correlation, external_id, args, flows
    open_slices: dict[int, list[list]] = {}
    sequences: dict[int, _Sequence] = {}
    skipped: dict[str, int] = {}
    samples: list[tuple[int, int, float]] = []  # counter track uuid, ts, value

    def skip(reason: str) -> None:
        skipped[reason] = skipped.get(reason, 0) + 1

    clocks = _Clocks()
    for p in trace.packet:
        seq_id = p.trusted_packet_sequence_id
        if p.sequence_flags & _INCREMENTAL_STATE_CLEARED or seq_id not in sequences:
            sequences[seq_id] = _Sequence()
        seq = sequences[seq_id]
        if p.HasField("clock_snapshot"):
            clocks.snapshot(seq_id, p.clock_snapshot)
        if p.HasField("interned_data"):
            seq.intern(p.interned_data)
        if p.HasField("trace_packet_defaults"):
            if p.trace_packet_defaults.HasField("timestamp_clock_id"):
                seq.default_clock = p.trace_packet_defaults.timestamp_clock_id
            defaults = p.trace_packet_defaults.track_event_defaults
            seq.default_track = defaults.track_uuid
            seq.extra_counter_tracks = list(defaults.extra_counter_track_uuids)
            seq.extra_double_counter_tracks = list(defaults.extra_double_counter_track_uuids)
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        track_uuid = e.track_uuid if e.HasField("track_uuid") else seq.default_track
        ts = clocks.ns(p, seq_id, seq.default_clock)
        if ts is None:
            skip("timestamp on a clock no snapshot defines")
            continue
        for uuids, values in ((e.extra_counter_track_uuids or seq.extra_counter_tracks, e.extra_counter_values),
                              (e.extra_double_counter_track_uuids or seq.extra_double_counter_tracks,
                               e.extra_double_counter_values)):
            samples += ((uuid, ts, seq.counter_value(tracks.get(uuid, default), value))
                        for uuid, value in zip(uuids, values))
        if e.type == TrackEvent.TYPE_COUNTER:
            value = e.double_counter_value if e.HasField("double_counter_value") else e.counter_value
            samples.append((track_uuid, ts, seq.counter_value(tracks.get(track_uuid, default), value)))
            continue
        if e.type == TrackEvent.TYPE_SLICE_END:
            stack = open_slices.get(track_uuid)
            if not stack:
                skip("slice end without a begin")
                continue
            row = stack.pop()
            if ts < row[3]:
                skip("slice ends before it begins")
                continue
            row[4] = ts - row[3]
            row[9] += [*e.flow_ids, *e.terminating_flow_ids]
            rows.append(tuple(row))
            continue
        if e.type not in (TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_INSTANT):
            skip("unsupported track event type")
            continue
        name = e.name if e.HasField("name") else seq.names.get(e.name_iid)
        categories = list(e.categories) or [seq.categories.get(i, "") for i in e.category_iids]
        args = {_annotation_name(a, seq): _annotation_value(a, seq) for a in e.debug_annotations}
        external = args.get("External id")
        row = [None, ",".join(categories) or None, name, ts, 0, track_uuid,
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
    if not rows and not samples:
        raise TraceError(path, "no slices or counters (no TrackEvent slice, instant or counter on any track)")
    return TraceData(
        format=FORMAT,
        slices=_slices(rows, tracks, default),
        event_count=len(rows) + sum(skipped.values()) + len(samples),
        skipped=skipped,
        metadata={"tracks": len(tracks)},
        counters=_counters(samples, tracks, default),
    )


def _counters(samples: list[tuple[int, int, float]], tracks: dict, default: _Track) -> pa.Table:
    from . import counters_from_columns

    homes = {uuid: tracks.get(uuid, default) for uuid in {s[0] for s in samples}}
    return counters_from_columns({
        "name": [homes[u].name or f"counter {u}" for u, _, _ in samples],
        "track": [homes[u].home() for u, _, _ in samples],
        "device_id": [homes[u].device_id if homes[u].on_device else None for u, _, _ in samples],
        "ts": [ts for _, ts, _ in samples],
        "value": [v for _, _, v in samples],
    })


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
