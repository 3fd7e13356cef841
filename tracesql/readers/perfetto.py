"""Perfetto protobuf traces with TrackEvent packets (`*.pftrace`, `*.perfetto-trace[.gz]`).

Decoded with the `perfetto` package's protobuf classes (the trace processor binary is not needed). What is read:
track descriptors (process, thread and named tracks, with parents), slice begin/end pairs (nested per track),
instants, interned names/categories/annotation names (per packet sequence, reset when a packet says its
incremental state was cleared), debug annotations (-> args JSON), flows/correlation ids (-> correlation) and
counter tracks (counter events and the extra counter values slices carry, scaled by the track's unit multiplier,
summed when incremental -> counters).

A track is a device track when its name or an ancestor's names a GPU/device/stream/queue; the kind comes from
the category when the producer writes Kineto's categories, else from the track (device: kernel, host: annotation).

Speed and memory: one pass over the (unpacked, memory-mapped) file, a block of packets at a time (upb parses a
block in C; Python sees each event once). Slices, flows and counter samples go to scratch Arrow files a batch at a
time as they complete; what depends on the tracks (kind, lanes, labels, which flows link a host and a device
slice, counter units and sums) is resolved at the end by DuckDB joins with the track table, since a producer may
describe a track after events on it. Memory holds a block, the tracks, the live interned strings and the open
slices (each bounded: MAX_TRACKS, MAX_INTERNED_BYTES, MAX_OPEN_BYTES) and DuckDB's working memory (the limit).
"""

from __future__ import annotations

import json
import mmap
import re
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa

from .. import db, limits
from ..arrays import array, texts
from ..db import sql_list
from ..errors import TraceError
from .common import MAX_NAME_CHARS, OUT_BATCH_ROWS
from .kineto import CATEGORY_KINDS, DEVICE_KINDS

FORMAT = "perfetto"
SUFFIXES = (".pftrace", ".perfetto-trace", ".perfetto-trace.gz")

_PACKET_TAG = 0x0A  # Trace.packet: field 1, length-delimited
_DEVICE_TRACK = re.compile(r"(?i)\b(gpu|device|stream|queue|cuda|hip)\b")
_DEVICE_NUMBER = re.compile(r"(?i)\b(?:gpu|device)\s*[:#]?\s*(\d+)")
_STREAM_NUMBER = re.compile(r"(?i)\b(?:stream|queue)\s*[:#]?\s*(\d+)")
_INCREMENTAL_STATE_CLEARED = 1
BLOCK_BYTES = 4 << 20  # packets are parsed this many bytes at a time
MAX_PACKET_BYTES = 64 << 20  # a longer packet is skipped (no producer writes one)
MAX_TRACKS = 50_000  # track descriptors kept (real traces: thousands); a track's name is cut to MAX_TRACK_NAME
MAX_TRACK_NAME = 1024
MAX_INTERNED_BYTES = 64 << 20  # interned strings alive at once, over all sequences (real traces: < 1 MB)
MAX_OPEN_BYTES = 64 << 20  # begun, not yet ended slices held at once; begins beyond are counted and dropped
_ROW_BYTES = 200  # what a row costs in Python besides its strings
_BATCH_BYTES = 32 << 20  # a batch of rows is written at _BATCH_ROWS rows or this many bytes of text
_BATCH_ROWS = 1 << 16


def _varint_at(buf, pos: int) -> tuple[int, int]:
    """The varint at `pos` of `buf`: (value, position after it), or (-1, pos) when cut off or too long."""
    value = shift = 0
    n = len(buf)
    while pos < n:
        b = buf[pos]
        value |= (b & 0x7F) << shift
        pos += 1
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            break
    return -1, pos


def detect(path: Path, head: bytes) -> bool:
    """A Trace is a run of `packet` fields: the head must be one, packet after packet, each with a valid first
    field tag (random bytes starting with 0x0A rarely chain that way)."""
    pos = 0
    while pos < len(head):
        if head[pos] != _PACKET_TAG:
            return False
        length, start = _varint_at(head, pos + 1)
        if length < 0:
            return pos > 0
        if start < len(head) and length:
            tag, _ = _varint_at(head, start)
            if tag >> 3 == 0 or tag & 7 not in (0, 1, 2, 5):
                return False
        pos = start + length
    return True


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
    """Per packet sequence: interned strings and the default track. `generation` counts the sequence's
    incremental-state resets (incremental counters restart at each)."""

    def __init__(self, generation: int = 0):
        self.generation = generation
        self.names: dict[int, str] = {}
        self.categories: dict[int, str] = {}
        self.annotation_names: dict[int, str] = {}
        self.annotation_strings: dict[int, str] = {}
        self.default_track = 0
        self.default_clock: int | None = None
        self.extra_counter_tracks: list[int] = []  # for slices that carry counter values without naming tracks
        self.extra_double_counter_tracks: list[int] = []
        self.size = 0  # bytes of interned strings held (with a per-entry cost)

    def intern(self, interned) -> int:
        """The packet's interned strings into the tables; returns how many bytes they add (in `size`)."""
        before = self.size
        for entries, table, field in ((interned.event_names, self.names, "name"),
                                      (interned.event_categories, self.categories, "name"),
                                      (interned.debug_annotation_names, self.annotation_names, "name"),
                                      (interned.debug_annotation_string_values, self.annotation_strings, "str")):
            for e in entries:
                text = _text(getattr(e, field))[:MAX_NAME_CHARS]
                old = table.get(e.iid)
                self.size += len(text) - (len(old) if old is not None else -_ROW_BYTES)
                table[e.iid] = text
        return self.size - before


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
        self.name = _text(desc.name or desc.static_name or "")[:MAX_TRACK_NAME]
        self.pid = desc.process.pid if desc.HasField("process") else (
            desc.thread.pid if desc.HasField("thread") else (self.parent.pid if self.parent else 0))
        self.is_thread = desc.HasField("thread")
        self.tid = desc.thread.tid if self.is_thread else 0
        self.process_name = _text(desc.process.process_name)[:MAX_TRACK_NAME] if desc.HasField("process") else (
            self.parent.process_name if self.parent else "")
        if desc.HasField("thread") and desc.thread.thread_name:
            self.name = self.name or _text(desc.thread.thread_name)[:MAX_TRACK_NAME]
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


_EMPTY_PACKET = 10  # b"\x0a\x00" (an empty packet) read as a little-endian uint16
_EMPTY_RUN = 64  # a run of at least this many empty packets is skipped in one step
_RELEASE_BYTES = 64 << 20  # the mapped file's pages already read are released this many bytes at a time


def _empty_run_end(doc, pos: int, released: int) -> tuple[int, int]:
    """Where the run of empty packets (0x0A 0x00, 0x0A 0x00, ...) starting at `pos` ends, found by numpy a chunk
    at a time: a file of nothing else (a 1 MB gzip holds 500 M of them) passes in seconds, not a Python step
    per packet. Returns (the end, the new released offset: see _release)."""
    n = len(doc)
    while pos + 1 < n:
        count = min((n - pos) // 2, 1 << 23)
        other = np.flatnonzero(np.frombuffer(doc, dtype="<u2", count=count, offset=pos) != _EMPTY_PACKET)
        if other.size:
            return pos + 2 * int(other[0]), released
        pos += 2 * count
        released = _release(doc, pos, released)
    return pos, released


def _release(doc, upto: int, released: int) -> int:
    """Drop the mapped file's pages before `upto` from memory (they are read; RSS would otherwise grow with the
    file) once _RELEASE_BYTES more are read; returns the new released offset."""
    length = (upto - released) // mmap.PAGESIZE * mmap.PAGESIZE
    if length >= _RELEASE_BYTES and hasattr(doc, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        doc.madvise(mmap.MADV_DONTNEED, released, length)
        return released + length
    return released


def _blocks(path: Path, doc, skipped: dict[str, int], empty: list[int]):
    """The file's packets, a block of whole packets (~BLOCK_BYTES) at a time, as bytes of a `Trace`. A packet
    over MAX_PACKET_BYTES is left out (counted); other top-level fields are skipped as a protobuf parser would.
    Long runs of empty packets (they carry nothing) are skipped and counted in `empty[0]`."""
    n, pos, start, released = len(doc), 0, 0, 0
    too_long = f"packet over {MAX_PACKET_BYTES >> 20} MB"
    while pos < n:
        if doc[pos] == _PACKET_TAG and pos + 2 < n and doc[pos + 1] < 0x80:  # the common case: a short packet
            end = pos + 2 + doc[pos + 1]
            length = 0
            if end == pos + 2 and doc[pos:pos + 2 * _EMPTY_RUN] == b"\x0a\x00" * _EMPTY_RUN:
                if pos > start:
                    yield doc[start:pos]
                start, released = _empty_run_end(doc, pos, released)
                empty[0] += (start - pos) // 2
                pos = start
                continue
        else:
            tag, after = _varint_at(doc, pos)
            wire = tag & 7
            if tag < 0 or tag >> 3 == 0 or wire not in (0, 1, 2, 5):
                raise TraceError(path, f"truncated or damaged protobuf (no field at byte {pos})")
            length = 0
            if wire == 2:
                length, body = _varint_at(doc, after)
                if length < 0:
                    raise TraceError(path, "truncated or damaged protobuf (the last packet is cut off)")
                end = body + length
            elif wire == 0:
                _, end = _varint_at(doc, after)
            else:
                end = after + (8 if wire == 1 else 4)
        if end > n:
            raise TraceError(path, "truncated or damaged protobuf (the last packet is cut off)")
        if length > MAX_PACKET_BYTES:
            if pos > start:
                yield doc[start:pos]
            skipped[too_long] = skipped.get(too_long, 0) + 1
            start = end
        elif end - start >= BLOCK_BYTES:
            yield doc[start:end]
            start = end
            released = _release(doc, start, released)
        pos = end
    if n > start:
        yield doc[start:n]


class _Rows:
    """Rows (tuples) of one scratch table, written to an Arrow stream file a batch at a time."""

    def __init__(self, path: Path, schema: pa.Schema):
        self.path, self.schema = path, schema
        self.batch: list[tuple] = []
        self.writer = pa.ipc.new_stream(str(path), schema)
        self.rows = 0
        self.bytes = 0  # text in the batch

    def flush(self) -> None:
        """Write the batch; its first column, when the schema's first field is `numbered`, is the row's index."""
        if self.batch:
            columns = [list(values) for values in zip(*self.batch)]
            if len(columns) < len(self.schema):
                columns.insert(0, range(self.rows, self.rows + len(self.batch)))
            arrays = [_arrow(values, field.type) for values, field in zip(columns, self.schema)]
            self.writer.write_batch(pa.record_batch(arrays, schema=self.schema))
            self.rows += len(self.batch)
            self.batch.clear()
            self.bytes = 0

    def close(self):
        from .common import FileMapping

        self.flush()
        self.writer.close()
        return FileMapping(self.path)


def _arrow(values, type_: pa.DataType) -> pa.Array:
    """A Python list (or range) as an Arrow array without pa.array (which imports pandas)."""
    if pa.types.is_dictionary(type_):  # each distinct string once: names repeat (and one may be long)
        codes: dict = {}
        indices = np.array([codes.setdefault(v, len(codes)) for v in values], np.int32)
        missing = indices == codes[None] if None in codes else None
        return pa.DictionaryArray.from_arrays(array(indices, pa.int32(), missing), texts(list(codes)))
    if pa.types.is_string(type_):
        return texts(values)
    if pa.types.is_boolean(type_):
        return array(np.array(values, bool))
    try:
        return array(np.array(values, type_.to_pandas_dtype()), type_)
    except TypeError:  # some are None
        missing = np.array([v is None for v in values], bool)
        return array(np.array([0 if v is None else v for v in values], type_.to_pandas_dtype()), type_, missing)


_NAMES = pa.dictionary(pa.int32(), pa.string())
_ROWS = pa.schema([("slice_id", pa.int64()), ("instant", pa.bool_()), ("category", _NAMES), ("name", _NAMES), ("ts", pa.int64()), ("dur", pa.int64()), ("track_uuid", pa.uint64()),
                   ("correlation", pa.uint64()), ("external_id", pa.int64()), ("args", pa.string())])
_FLOWS = pa.schema([("slice_id", pa.int64()), ("flow", pa.uint64()), ("ord", pa.int32())])
_SAMPLES = pa.schema([("ord", pa.int64()), ("track_uuid", pa.uint64()), ("seq", pa.uint32()),
                      ("generation", pa.int64()), ("ts", pa.int64()), ("value", pa.float64())])
_TRACKS = pa.schema([("uuid", pa.uint64()), ("pid", pa.int64()), ("tid", pa.int64()), ("on_device", pa.bool_()),
                     ("device_id", pa.int32()), ("stream", pa.int64()), ("host_label", pa.string()),
                     ("home", pa.string()), ("name", pa.string()), ("has_counter", pa.bool_()),
                     ("multiplier", pa.float64()), ("incremental", pa.bool_())])
_INT64 = 1 << 63


def read(path: Path, threads: int | None = None):
    from google.protobuf.message import DecodeError

    from .common import mapped_content

    with tempfile.TemporaryDirectory(prefix="tracesql-") as scratch:
        scratch = Path(scratch)
        state = _Reader(path, scratch)
        with mapped_content(path, scratch) as doc:
            try:
                state.read(doc)
            except DecodeError as e:
                raise TraceError(path, f"truncated or damaged protobuf ({e})") from None
        return state.finish(threads)


class _Reader:
    """The one pass over the packets, and the DuckDB queries that finish the tables."""

    def __init__(self, path: Path, scratch: Path):
        self.path, self.scratch = path, scratch
        self.tracks: dict[int, _Track] = {}
        self.skipped: dict[str, int] = {}
        self.packets = 0
        self.empty_packets = [0]  # skipped in runs by _blocks
        self.rows = _Rows(scratch / "rows.arrows", _ROWS)
        self.flows = _Rows(scratch / "flows.arrows", _FLOWS)
        self.samples = _Rows(scratch / "samples.arrows", _SAMPLES)
        self.max_events = limits.current().max_events

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n

    def read(self, doc) -> None:
        from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TrackEvent

        SLICE_BEGIN, SLICE_END, INSTANT, COUNTER = (TrackEvent.TYPE_SLICE_BEGIN, TrackEvent.TYPE_SLICE_END,
                                                    TrackEvent.TYPE_INSTANT, TrackEvent.TYPE_COUNTER)
        tracks, sequences, clocks = self.tracks, {}, _Clocks()
        open_slices: dict[int, list[list]] = {}
        overflow: dict[int, int] = {}  # per track: begins beyond MAX_OPEN_BYTES not held (their ends pop these)
        open_count = open_bytes = interned = 0
        rows, flows, samples = self.rows.batch, self.flows.batch, self.samples.batch
        skip = self.skip

        def emit(row: list, flow_ids: list, size: int) -> None:
            if flow_ids:
                slice_id = self.rows.rows + len(rows)
                flows.extend((slice_id, flow, k) for k, flow in enumerate(flow_ids))
                if len(flows) >= _BATCH_ROWS:
                    self.flows.flush()
            rows.append(row)
            self.rows.bytes += size
            if len(rows) >= _BATCH_ROWS or self.rows.bytes >= _BATCH_BYTES:
                self.rows.flush()

        for block in _blocks(self.path, doc, self.skipped, self.empty_packets):
            for p in Trace.FromString(block).packet:
                if self.max_events and self.rows.rows + len(rows) >= self.max_events:
                    self.rows.flush()
                    self.truncated = True
                    return
                self.packets += 1
                seq_id = p.trusted_packet_sequence_id
                seq = sequences.get(seq_id)
                if seq is None or p.sequence_flags & _INCREMENTAL_STATE_CLEARED:
                    if seq is not None:
                        interned -= seq.size
                    seq = sequences[seq_id] = _Sequence(seq.generation + 1 if seq is not None else 0)
                data = p.WhichOneof("data")
                if data == "track_descriptor":
                    if p.track_descriptor.uuid not in tracks and len(tracks) >= MAX_TRACKS:
                        raise TraceError(self.path, f"more than {MAX_TRACKS:,} tracks: refused as damaged or hostile")
                    tracks[p.track_descriptor.uuid] = _Track(p.track_descriptor, tracks)
                elif data == "clock_snapshot":
                    clocks.snapshot(seq_id, p.clock_snapshot)
                if p.HasField("interned_data"):
                    interned += seq.intern(p.interned_data)
                    if interned > MAX_INTERNED_BYTES:
                        raise TraceError(self.path, f"more than {MAX_INTERNED_BYTES >> 20} MB of interned strings at "
                                                    "once: refused as damaged or hostile")
                if p.HasField("trace_packet_defaults"):
                    defaults = p.trace_packet_defaults
                    if defaults.HasField("timestamp_clock_id"):
                        seq.default_clock = defaults.timestamp_clock_id
                    event_defaults = defaults.track_event_defaults
                    seq.default_track = event_defaults.track_uuid
                    seq.extra_counter_tracks = list(event_defaults.extra_counter_track_uuids)
                    seq.extra_double_counter_tracks = list(event_defaults.extra_double_counter_track_uuids)
                if data != "track_event":
                    continue
                e = p.track_event
                track_uuid = e.track_uuid if e.HasField("track_uuid") else seq.default_track
                ts = clocks.ns(p, seq_id, seq.default_clock)
                if ts is None:
                    skip("timestamp on a clock no snapshot defines")
                    continue
                values = e.extra_counter_values
                if values:
                    generation = seq.generation
                    samples.extend((uuid, seq_id, generation, ts, value) for uuid, value in
                                   zip(e.extra_counter_track_uuids or seq.extra_counter_tracks, values))
                values = e.extra_double_counter_values
                if values:
                    generation = seq.generation
                    samples.extend((uuid, seq_id, generation, ts, value) for uuid, value in
                                   zip(e.extra_double_counter_track_uuids or seq.extra_double_counter_tracks, values))
                kind = e.type
                if kind == COUNTER:
                    samples.append((track_uuid, seq_id, seq.generation, ts,
                                    e.double_counter_value if e.HasField("double_counter_value") else e.counter_value))
                if len(samples) >= _BATCH_ROWS:
                    self.samples.flush()
                if kind == COUNTER:
                    continue
                if kind == SLICE_END:
                    if overflow.get(track_uuid):
                        overflow[track_uuid] -= 1
                        skip(f"slice begun while {MAX_OPEN_BYTES >> 20} MB of slices were open")
                        continue
                    stack = open_slices.get(track_uuid)
                    if not stack:
                        skip("slice end without a begin")
                        continue
                    row = stack.pop()
                    size = row.pop()
                    open_count -= 1
                    open_bytes -= size
                    if ts < row[3]:
                        skip("slice ends before it begins")
                        continue
                    row[4] = ts - row[3]
                    row_flows = row.pop()
                    starting, ending = e.flow_ids, e.terminating_flow_ids
                    emit(row, row_flows + [*starting, *ending] if starting or ending else row_flows, size)
                    continue
                if kind != SLICE_BEGIN and kind != INSTANT:
                    skip("unsupported track event type")
                    continue
                name = _text(e.name) if e.HasField("name") else seq.names.get(e.name_iid)
                categories, category_iids = e.categories, e.category_iids
                if categories:
                    category = ",".join(_text(c) for c in categories) or None
                elif len(category_iids) == 1:  # the common case
                    category = seq.categories.get(category_iids[0]) or None
                elif category_iids:
                    category = ",".join(seq.categories.get(i, "") for i in category_iids) or None
                else:
                    category = None
                args = external = None
                if e.debug_annotations:
                    annotations = {_annotation_name(a, seq): _annotation_value(a, seq) for a in e.debug_annotations}
                    if annotations:
                        args = json.dumps(annotations)
                        external = annotations.get("External id")
                        if not isinstance(external, int) or not -_INT64 <= external < _INT64:
                            external = None
                row = [kind == INSTANT, category, name, ts, 0, track_uuid,
                       e.correlation_id if e.HasField("correlation_id") else None, external, args]
                starting, ending = e.flow_ids, e.terminating_flow_ids
                flow_ids = [*starting, *ending] if starting or ending else []
                size = _ROW_BYTES + len(args or "") + len(name or "") + len(category or "")
                if kind == INSTANT:
                    emit(row, flow_ids, size)
                elif open_bytes >= MAX_OPEN_BYTES:
                    overflow[track_uuid] = overflow.get(track_uuid, 0) + 1
                else:
                    row += (flow_ids, size)
                    open_slices.setdefault(track_uuid, []).append(row)
                    open_count += 1
                    open_bytes += size
        unfinished = open_count + sum(overflow.values())
        if unfinished:
            self.skipped["slice never ended"] = self.skipped.get("slice never ended", 0) + unfinished

    def finish(self, threads: int | None):
        from .common import TraceData

        rows, flows, samples = self.rows.close(), self.flows.close(), self.samples.close()
        empty = f" ({self.empty_packets[0]:,} empty packets)" if self.empty_packets[0] else ""
        if not self.packets:
            raise TraceError(self.path, f"empty trace: no packets with content{empty}")
        if not self.rows.rows and not self.samples.rows:
            raise TraceError(self.path, "no slices or counters (no TrackEvent slice, instant or counter on any "
                                        f"track){empty}")
        import duckdb

        lim = limits.current()
        con = db.connect(threads, lim.memory, database=self.scratch / "perfetto.duckdb")
        try:
            con.register("raw_rows", rows.table())
            con.register("flows", flows.table())
            con.register("samples", samples.table())
            con.register("tracks", _track_table(self.tracks))
            con.execute(_CATEGORY_KINDS)
            slices, counters = self._mapped(con, "slices.arrows", _SLICES), self._mapped(con, "counters.arrows",
                                                                                         _COUNTERS, counters=True)
        except duckdb.OutOfMemoryException:  # not the trace's fault: the ingest names the file and the limit
            raise
        except duckdb.Error as e:
            raise TraceError(self.path, f"cannot finish the tables ({str(e).splitlines()[0][:300]})") from None
        finally:
            con.close()
        notes = [f"read only the first {self.max_events:,} events (--max-events)"] if getattr(self, "truncated",
                                                                                              False) else []
        return TraceData(
            format=FORMAT,
            slices=slices.table(),
            event_count=self.rows.rows + sum(self.skipped.values()) + self.samples.rows,
            skipped=self.skipped,
            notes=notes,
            metadata={"tracks": len(self.tracks)},
            counters=counters.table(),
            mappings=[rows, flows, samples, slices, counters],
        )

    def _mapped(self, con, name: str, sql: str, counters: bool = False):
        from .common import READER_COUNTER_TYPES, FileMapping, mapped_slices

        reader = con.sql(sql).to_arrow_reader(OUT_BATCH_ROWS)
        if not counters:
            return mapped_slices(self.scratch / name, reader)
        schema = pa.schema(READER_COUNTER_TYPES)
        return FileMapping.of_batches(self.scratch / name, schema, (b.select(schema.names).cast(schema)
                                                                    for b in reader))


def _track_table(tracks: dict[int, _Track]) -> pa.Table:
    """Every described track's lanes, labels and counter units (the reader's rows join it by uuid)."""
    unnamed_streams = iter(range(1 << 20, 1 << 21))  # lanes for device tracks that carry no stream number
    for t in tracks.values():
        if t.on_device and t.stream is None:
            t.stream = next(unnamed_streams)
    threads_named = Counter((t.pid, t.name) for t in tracks.values() if t.is_thread)
    for t in tracks.values():
        t.shared_name = t.is_thread and threads_named[t.pid, t.name] > 1
    columns = {name: [] for name in _TRACKS.names}
    for uuid, t in tracks.items():
        counter = t.counter
        for name, value in (("uuid", uuid), ("pid", t.pid), ("tid", t.tid), ("on_device", t.on_device),
                            ("device_id", t.device_id), ("stream", t.stream), ("host_label", t.host_label()),
                            ("home", t.home()), ("name", t.name), ("has_counter", counter is not None),
                            ("multiplier", float(counter.unit_multiplier or 1) if counter is not None else 1.0),
                            ("incremental", counter is not None and counter.is_incremental)):
            columns[name].append(value)
    return pa.table([_arrow(columns[f.name], f.type) for f in _TRACKS], schema=_TRACKS)


_CATEGORY_KINDS = "CREATE TABLE category_kinds AS SELECT * FROM (VALUES {}) t(category, kind)".format(
    ", ".join(f"('{c}', '{k}')" for c, k in CATEGORY_KINDS.items()))
_signed = "CAST(CASE WHEN {0} >= 9223372036854775808 THEN {0}::HUGEINT - 18446744073709551616 ELSE {0} END AS BIGINT)"
# Every row's kind (what the producer said, else Kineto's category, else from its track: device work or a host
# annotation) and lanes. A flow that both a host and a device slice carry links them: the first such flow of a
# slice (in the order the producer listed them) is its correlation, unless it has a correlation id of its own.
# Rows on a track no descriptor describes are host rows of process 0.
_SLICES = f"""
WITH kinds AS (
    SELECT r.*, COALESCE(CASE WHEN r.instant THEN 'instant' END, ck.kind,
                         CASE WHEN COALESCE(t.on_device, false) THEN 'kernel' ELSE 'user_annotation' END) AS kind,
        t.pid AS track_pid, t.tid AS track_tid, t.device_id AS track_device, t.stream AS track_stream, t.host_label
    FROM raw_rows r LEFT JOIN tracks t ON t.uuid = r.track_uuid
    LEFT JOIN category_kinds ck ON ck.category = lower(COALESCE(r.category, ''))
), linking AS (
    SELECT f.flow FROM flows f JOIN kinds k ON k.slice_id = f.slice_id
    GROUP BY f.flow HAVING count(DISTINCT k.kind IN ({sql_list(DEVICE_KINDS)})) = 2
), correlated AS (
    SELECT f.slice_id, arg_min(f.flow, f.ord) AS flow FROM flows f SEMI JOIN linking l ON l.flow = f.flow
    GROUP BY f.slice_id
), placed AS (
    SELECT k.*, k.kind IN ({sql_list(DEVICE_KINDS)}) AS on_device, c.flow FROM kinds k
    LEFT JOIN correlated c ON c.slice_id = k.slice_id
)
SELECT slice_id, kind, category, name, ts, dur, COALESCE(track_pid, 0) AS pid,
    CASE WHEN on_device THEN track_stream ELSE COALESCE(track_tid, 0) END AS tid,
    CASE WHEN on_device THEN COALESCE(track_device, 0) END AS device_id,
    CASE WHEN on_device THEN COALESCE(track_stream, 0) END AS stream,
    CASE WHEN on_device THEN 'device ' || COALESCE(track_device, 0) || ' / stream ' || COALESCE(track_stream, 0)
         ELSE COALESCE(host_label, 'process 0 / process') END AS track,
    COALESCE({_signed.format('correlation')}, {_signed.format('flow')}) AS correlation, external_id, args
FROM placed
"""
# Counter samples in the track's units times its multiplier; an incremental track's deltas summed, per packet
# sequence, restarting where the sequence's incremental state was cleared.
_COUNTERS = """
SELECT COALESCE(NULLIF(t.name, ''), 'counter ' || s.track_uuid) AS name, NULL::VARCHAR AS series,
    COALESCE(t.home, 'process 0') AS track, CASE WHEN t.on_device THEN t.device_id END AS device_id, s.ts,
    CASE WHEN t.incremental THEN sum(s.value * t.multiplier) OVER (
             PARTITION BY s.seq, s.generation, s.track_uuid ORDER BY s.ord ROWS UNBOUNDED PRECEDING)
         WHEN t.has_counter THEN s.value * t.multiplier ELSE s.value END AS value
FROM samples s LEFT JOIN tracks t ON t.uuid = s.track_uuid
"""
