#!/usr/bin/env python3
"""Make a big, valid Perfetto protobuf trace by tiling a real one.

    python benchmarks/tile_perfetto.py IN.perfetto-trace[.gz] OUT.perfetto-trace --min-bytes 1e9 [--gap-ns 1000000]

The packets of IN are written k times, k as small as possible for OUT to reach --min-bytes. Copy i keeps every
packet sequence, interned string and track as they are (each copy re-sends them, as a producer that clears its
incremental state does), and moves in time and ids only: its builtin-clock times (ClockSnapshot clocks below id
64, and packets timed on such a clock, explicitly or by their sequence's defaults) are shifted by
i * (span + gap), span = the longest of the spans (last minus first
time) of the builtin clocks, so that the copies follow one another
(times on a sequence's own clock follow, through the snapshots); its flow and correlation ids are offset by
i * (max id + 1), so that each copy's flows link its own slices. Packets that need none of this are copied as
bytes. Written to OUT.tmp, renamed to OUT at the end; a sidecar OUT.meta.json records copies, packets and bytes.
"""

from __future__ import annotations

import gzip
import math
import time

from tiling import main, publish

_FIRST_SEQUENCE_CLOCK = 64
_BOOTTIME = 6


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def tile(src: str, out: str, min_bytes: float, gap_ns: int = 1_000_000, copies: int | None = None) -> dict:
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace

    start = time.perf_counter()
    with (gzip.open if src.endswith(".gz") else open)(src, "rb") as f:
        trace = Trace.FromString(f.read())
    default_clock: dict[int, int] = {}
    moved = []  # per packet: (shift its timestamp?, shift its snapshot?, offset its ids?)
    times: dict[int, list[int]] = {}  # builtin clock -> times seen on it
    max_id = 0
    for p in trace.packet:
        seq = p.trusted_packet_sequence_id
        if p.HasField("trace_packet_defaults") and p.trace_packet_defaults.HasField("timestamp_clock_id"):
            default_clock[seq] = p.trace_packet_defaults.timestamp_clock_id
        clock = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else default_clock.get(seq, _BOOTTIME)
        timed = p.HasField("timestamp") and clock < _FIRST_SEQUENCE_CLOCK
        if timed:
            times.setdefault(clock, []).append(p.timestamp)
        snapshot = p.HasField("clock_snapshot")
        if snapshot:
            for c in p.clock_snapshot.clocks:
                if c.clock_id < _FIRST_SEQUENCE_CLOCK:
                    times.setdefault(c.clock_id, []).append(c.timestamp)
        ids = False
        if p.HasField("track_event"):
            e = p.track_event
            flows = [*e.flow_ids, *e.terminating_flow_ids, *([e.correlation_id] if e.HasField("correlation_id") else [])]
            if flows:
                ids, max_id = True, max(max_id, *flows)
        moved.append((timed, snapshot, ids))
    shift = max((max(t) - min(t) for t in times.values()), default=0) + gap_ns  # the longest span of a clock
    id_step = max_id + 1
    framed = [b"\x0a" + _varint(len(b)) + b for b in (p.SerializeToString() for p in trace.packet)]
    one_copy = sum(len(b) for b in framed)
    k = copies or max(1, math.ceil(min_bytes / one_copy))
    tmp = out + ".tmp"
    with open(tmp, "wb") as f:
        for i in range(k):
            chunk = []
            for p, data, (timed, snapshot, ids) in zip(trace.packet, framed, moved):
                if i == 0 or not (timed or snapshot or ids):
                    chunk.append(data)
                    continue
                q = type(p)()
                q.CopyFrom(p)
                if timed:
                    q.timestamp += i * shift
                if snapshot:
                    for c in q.clock_snapshot.clocks:
                        if c.clock_id < _FIRST_SEQUENCE_CLOCK:
                            c.timestamp += i * shift
                if ids:
                    e = q.track_event
                    offset = i * id_step
                    e.flow_ids[:] = [(v + offset) % 2**64 for v in e.flow_ids]
                    e.terminating_flow_ids[:] = [(v + offset) % 2**64 for v in e.terminating_flow_ids]
                    if e.HasField("correlation_id"):
                        e.correlation_id = (e.correlation_id + offset) % 2**64
                body = q.SerializeToString()
                chunk.append(b"\x0a" + _varint(len(body)) + body)
            f.write(b"".join(chunk))
    events = sum(1 for p in trace.packet if p.HasField("track_event")) * k
    return publish(tmp, out, {"source": src, "copies": k, "shift_ns": shift, "packets": len(trace.packet) * k,
                              "events": events}, start)


if __name__ == "__main__":
    main(tile, __doc__)
