"""`tracesql export`: one rank's step (or its whole trace) written back as a Perfetto trace, so that the step a
query or the report pointed at opens in the Perfetto UI (https://ui.perfetto.dev) exactly.

    tracesql.export.export("runs/1234", "step.pftrace", rank=3, step=120)

The file is a stream of `TracePacket`s (the `perfetto` package's protos) with TrackEvent slices:
- the host: a process track per pid and a thread track per (pid, tid), named as `slices.track`; ops, annotations,
  runtime calls as nested slices, allocator events and other instants as instants;
- the devices: a group per device with a track per stream (kernels, copies, memsets);
- flows from each launch (runtime/driver call) to the device work it launched (`slices.launch_id`);
- tracesql's view of each device as extra tracks under it: `tracesql · compute`, `· communication`, `· memory`
  (while a kernel of that class runs, `kernel_classes`), `· exposed communication` (communication with no
  compute running) and `· idle` (nothing running), over the step's device window as `temporal_breakdown
  per=step` measures it (the device's whole window without --step): the lanes add up to that query's numbers;
- the run's data-quality warnings (`warnings` table) as instants on a `tracesql · warnings` track at the window's
  start, and the rank's counters (`counters` table) as counter tracks.

Every slice carries its kind, category, slice_id and (when set) correlation, op_id, step, launch_id, class and
args as debug annotations. Slices of one track that overlap without nesting (Perfetto requires nesting) go to
an extra track beside it, `… (2)`, `… (3)`, so nothing is dropped or cut.

Which slices: every slice of the rank that overlaps or touches the window. With a step, the window is the step's
host range (`steps.ts`, `dur`) joined with its device windows (`step_windows`: on each device, from the step's
first device event to the next step's first); without, the rank's first to last event.
"""

from __future__ import annotations

import heapq
import json
import os
import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import engine, store
from .errors import TraceError

INSTANT_KINDS = ("instant", "memory")
CLASS_BITS = {"compute": 1, "communication": 2, "memory": 4, "infeed_outfeed": 4}
# tracesql's lanes per device: (track suffix, predicate on the class bits of a timeline segment)
LANES = {
    "compute": lambda s: s & 1 == 1,
    "communication": lambda s: s & 2 == 2,
    "memory": lambda s: s & 4 == 4,
    "exposed communication": lambda s: s & 3 == 2,
    "idle": lambda s: s == 0,
}
ARGS_CHARS = 4096  # args longer than this are cut (with '…') in the debug annotation
SEQUENCE_ID = 1
CLASS_SCHEMES = ("default", "hta")
#: The tables and functions the export's SQL names: what its connection is opened with (engine.connect's `names`;
#: creating every function took 0.3 CPU-s)
NAMES_USED = frozenset({"ranks", "steps", "slices", "warnings", "counters", "collectives", "step_windows",
                        "device_activity", "collective_calls", "rank_clock_offsets"})


def _proto():
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    return pb


def _writer(file):
    """The perfetto package's streaming builder (each packet written as it is made), or the same framing by hand
    for versions without it: a Trace message holding one packet, repeated."""
    try:
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

        return StreamingTraceProtoBuilder(file)
    except ImportError:  # pragma: no cover - perfetto < 0.50
        pb = _proto()

        class Builder:
            def create_packet(self):
                return pb.TracePacket()

            def write_packet(self, packet):
                trace = pb.Trace()
                trace.packet.append(packet)
                file.write(trace.SerializeToString())

        return Builder()


@dataclass
class Exported:
    """What was written: counts a test or a user can check against the run's tables."""

    path: Path
    run_id: str
    rank: int
    step: int | None
    window: tuple[int, int]  # [t0, t1] absolute ns
    slices: int = 0  # begin/end pairs
    instants: int = 0  # slice instants (allocator events, ...)
    flows: int = 0
    tracks: int = 0
    warnings: int = 0
    counter_values: int = 0
    lanes: dict[tuple[int, str], int] = field(default_factory=dict)  # (device_id, lane) -> ns in the lane
    device_windows: dict[int, tuple[int, int]] = field(default_factory=dict)


def pick_run(target, run_id: str | None = None) -> tuple[Path, str]:
    """The one run behind `target` (a run, a folder of runs with `run_id`, or raw traces)."""
    runs = engine.resolve(target)
    ids = {store.load_manifest(r)["run_id"]: r for r in runs}
    if run_id is not None:
        if run_id not in ids:
            raise TraceError(target, f"no run {run_id!r} here (runs: {', '.join(sorted(ids))})")
        return ids[run_id], run_id
    if len(ids) != 1:
        raise TraceError(target, f"holds {len(ids)} runs; pick one with --run-id ({', '.join(sorted(ids)[:5])}"
                                 f"{', ...' if len(ids) > 5 else ''})")
    (rid, path), = ids.items()
    return path, rid


def export(target, out, *, rank: int | None = None, step: int | None = None, run_id: str | None = None,
           class_scheme: str = "default", con=None) -> Exported:
    """Write rank `rank`'s step `step` (None: the rank's whole trace) of the run behind `target` to `out` as a
    Perfetto trace. `con`: an open connection holding that run (with others: `run_id` names it), not opened again."""
    if class_scheme not in CLASS_SCHEMES:
        raise TraceError("--class-scheme", f"one of {', '.join(CLASS_SCHEMES)}, not {class_scheme!r}")
    if con is None:  # its own connection, opened again if an ingest swaps the run in meanwhile
        path, rid = pick_run(target, run_id)
        return engine.on_fresh_connection(path, lambda con: _export(con, target, out, rank, step, rid, class_scheme),
                                          names=NAMES_USED)
    return _export(con, target, out, rank, step, run_id or con.execute("SELECT min(run_id) FROM ranks").fetchone()[0],
                   class_scheme)


def _export(con, target, out, rank: int | None, step: int | None, rid: str, class_scheme: str) -> Exported:
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM ranks WHERE run_id = $1 ORDER BY 1",
                                       [rid]).fetchall()]
    if rank is None:
        if len(ranks) != 1:
            raise TraceError(target, f"the run has {len(ranks)} ranks ({_span(ranks)}); pick one with --rank")
        rank = ranks[0]
    elif rank not in ranks:
        raise TraceError(f"--rank {rank}", f"no such rank in {rid} (ranks: {_span(ranks)})")
    part = _collect(con, target, out, rank, step, rid, class_scheme)
    _write(*part)
    return part[0]


#: Ranks up to which export_all_ranks keeps every host slice; beyond, host slices nested deeper than HOST_DEPTH
#: are left out (communication calls, device work and tracesql's lanes are always kept), so that a trace of 64+
#: ranks stays small enough to open.
FULL_RANKS = 16
HOST_DEPTH = 2


@dataclass
class AllRanks:
    """What export_all_ranks wrote: each rank's part, the clock offsets applied, the flows across ranks."""

    path: Path
    run_id: str
    step: int | None
    parts: list[Exported]
    offsets: dict[int, int]  # rank -> ns subtracted from its times (clock_offsets)
    links: int = 0  # flows between the ranks' parts of a collective or a send/recv pair
    host_depth: int | None = None


def export_all_ranks(target, out, *, step: int | None = None, run_id: str | None = None,
                     class_scheme: str = "default", host_depth: int | None = None,
                     align_clocks: bool = True) -> AllRanks:
    """Every rank of the run (step `step`, else whole traces) in one Perfetto trace: a process per rank, its
    times shifted by its clock offset when `align_clocks` (rank_clock_offsets' shift_ns: the `clock_offsets`
    estimate where it exceeds its uncertainty; elsewhere the clock as recorded), flows from each rank's
    part of a collective instance or send/recv pair to the next rank's. `host_depth`: host slices nested deeper
    are left out (default: none up to FULL_RANKS ranks, HOST_DEPTH beyond)."""
    if class_scheme not in CLASS_SCHEMES:
        raise TraceError("--class-scheme", f"one of {', '.join(CLASS_SCHEMES)}, not {class_scheme!r}")
    path, rid = pick_run(target, run_id)
    return engine.on_fresh_connection(path, lambda con: _export_all(con, target, Path(out), step, rid, class_scheme,
                                                                    host_depth, align_clocks), names=NAMES_USED)


def _export_all(con, target, out: Path, step, rid, class_scheme, host_depth, align_clocks) -> AllRanks:
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM ranks WHERE run_id = $1 ORDER BY 1",
                                       [rid]).fetchall()]
    if host_depth is None and len(ranks) > FULL_RANKS:
        host_depth = HOST_DEPTH
    offsets = {int(r): int(o) for r, o in con.execute(
        "SELECT rank, shift_ns FROM rank_clock_offsets() WHERE run_id = $1 AND shift_ns <> 0", [rid]).fetchall()
        } if align_clocks else {}
    parts = [_collect(con, target, out, rank, step, rid, class_scheme, offsets.get(rank, 0), host_depth)
             for rank in ranks]
    exported = {part[0].rank: set(part[1]["slice_id"]) for part in parts}
    # flows across ranks: each exported call of an instance (ordered by aligned start, then rank) to the next one
    calls = con.execute("SELECT rank, collective_id, match_key, COALESCE(cpu_ts, device_ts) AS ts "
                        "FROM collective_calls() WHERE run_id = $1", [rid]).fetchall()
    instances: dict[str, list[tuple]] = {}
    for rank, cid, key, ts in calls:
        if cid in exported[rank]:
            instances.setdefault(key, []).append((ts - offsets.get(rank, 0), rank, cid))
    links: dict[int, dict[int, tuple[list[int], list[int]]]] = {r: {} for r in ranks}
    flow = (1 << 62) + 1  # above every rank's own flow ids ((rank + 1) << 40 + slice_id + 1)
    for members in instances.values():
        members.sort()
        for (_, ra, ca), (_, rb, cb) in zip(members, members[1:]):
            links[ra].setdefault(ca, ([], []))[0].append(flow)
            links[rb].setdefault(cb, ([], []))[1].append(flow)
            flow += 1
    result = AllRanks(out, rid, step, [part[0] for part in parts], offsets, flow - (1 << 62) - 1, host_depth)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuidlib.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            builder = _writer(f)
            for i, part in enumerate(parts):
                rank = part[0].rank
                _write(*part, merge=Merge(builder, i + 1, (rank + 1) << 40, i + 1, links[rank]))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return result


def _collect(con, target, out, rank: int, step: int | None, rid: str, class_scheme: str, shift: int = 0,
             host_depth: int | None = None) -> tuple:
    """What one rank contributes, its times minus `shift` (its clock offset); host slices nested deeper than
    `host_depth` left out (communication calls kept). Returns _write's arguments."""
    activity = f"device_activity(class_scheme := '{class_scheme}')"
    where = "run_id = $run AND rank = $rank"
    params = {"run": rid, "rank": rank, "shift": shift}
    if step is not None:
        row = con.execute(f"SELECT min(ts) - $shift, max(ts + dur) - $shift FROM steps WHERE {where} AND step = $step",
                          {**params, "step": step}).fetchone()
        if row[0] is None:
            steps = [s for (s,) in con.execute(f"SELECT DISTINCT step FROM steps WHERE {where} ORDER BY 1",
                                               {"run": rid, "rank": rank}).fetchall()]
            raise TraceError(f"--step {step}", f"rank {rank} of {rid} has no such step"
                                               f" ({'steps: ' + _span(steps) if steps else 'no steps recorded'})")
        host = [row]
        windows = con.execute(f"SELECT device_id, ts - $shift, te - $shift FROM step_windows(class_scheme := "
                              f"'{class_scheme}') WHERE {where} AND step = $step ORDER BY 1",
                              {**params, "step": step}).fetchall()
    else:
        host = con.execute(f"SELECT min(ts) - $shift, max(ts + dur) - $shift FROM slices WHERE {where}",
                           params).fetchall()
        windows = con.execute(f"SELECT device_id, min(ts) - $shift, max(ts + dur) - $shift FROM {activity} "
                              f"WHERE {where} GROUP BY 1 ORDER BY 1", params).fetchall()
    bounds = [b for b in host if b[0] is not None] + [(w0, w1) for _, w0, w1 in windows]
    if not bounds:
        raise TraceError(target, f"rank {rank} of {rid} has no events")
    t0, t1 = min(b[0] for b in bounds), max(b[1] for b in bounds)
    span = {**params, "t0": t0, "t1": t1, "depth": host_depth}
    depth = ("AND (device_id IS NOT NULL OR $depth IS NULL OR depth <= $depth OR slice_id IN "
             "(SELECT collective_id FROM collectives WHERE run_id = $run AND rank = $rank))")
    slices = con.sql(
        "SELECT slice_id, kind, category, name, ts - $shift AS ts, dur, pid, tid, device_id, stream, track, "
        f"launch_id, correlation, op_id, step, CAST(args AS VARCHAR) AS args FROM slices WHERE {where} "
        f"AND ts - $shift <= $t1 AND ts - $shift + dur >= $t0 {depth} ORDER BY ts, dur DESC, slice_id",
        params=span).to_arrow_table()
    device = con.sql(f"SELECT slice_id, device_id, class, ts - $shift AS ts, dur FROM {activity} WHERE {where} "
                     "AND ts - $shift <= $t1 AND ts - $shift + dur >= $t0",
                     params={**params, "t0": t0, "t1": t1}).to_arrow_table()
    slices = {c: slices.column(c).to_pylist() for c in slices.column_names}
    device = {c: device.column(c).to_pylist() for c in device.column_names}
    warn = con.execute("SELECT check_name, event_count, example, message, source_path FROM warnings "
                       f"WHERE run_id = $run AND (rank = $rank OR rank IS NULL) ORDER BY check_name, source_path",
                       {"run": rid, "rank": rank}).fetchall()
    counters = con.execute(f"SELECT name, series, track, ts - $shift, value FROM counters WHERE {where} "
                           "AND ts - $shift BETWEEN $t0 AND $t1 ORDER BY name, series, ts",
                           {**params, "t0": t0, "t1": t1}).fetchall()

    result = Exported(Path(out), rid, rank, step, (t0, t1), device_windows={int(d): (a, b) for d, a, b in windows})
    classes = dict(zip(device["slice_id"], device["class"]))
    return result, slices, classes, device, warn, counters


def _span(values: list) -> str:
    if not values:
        return "none"
    if len(values) > 6 and values == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}–{values[-1]}"
    return ", ".join(map(str, values[:12])) + (", ..." if len(values) > 12 else "")


def _lanes(starts: np.ndarray, ends: np.ndarray, order: np.ndarray) -> np.ndarray:
    """For slices (indices `order` into starts/ends, sorted by ts, dur desc): the lane of each so that slices on one lane nest (Perfetto draws a
    track's slices as a stack). Lane 0 unless a slice overlaps an open one without fitting inside it."""
    lane = np.zeros(len(order), dtype=np.int64)
    stacks: list[list[int]] = [[]]
    for j, i in enumerate(order.tolist()):
        ts, te = starts[i], ends[i]
        for k, stack in enumerate(stacks):
            while stack and stack[-1] <= ts:
                stack.pop()
            if not stack or stack[-1] >= te:
                stack.append(te)
                lane[j] = k
                break
        else:
            stacks.append([te])
            lane[j] = len(stacks) - 1
    return lane


def timeline_lanes(events_ts, events_te, events_bit, w0: int, w1: int) -> dict[str, list[tuple[int, int]]]:
    """tracesql's device timeline inside [w0, w1] (as `device_timeline`: at each instant the set of classes with
    an event running), as the intervals of each lane in LANES, adjacent segments merged."""
    ts = np.clip(np.asarray(events_ts, dtype=np.int64), w0, w1)
    te = np.clip(np.asarray(events_te, dtype=np.int64), w0, w1)
    bit = np.asarray(events_bit, dtype=np.int64)
    keep = (te > ts) & (bit > 0)
    ts, te, bit = ts[keep], te[keep], bit[keep]
    cuts = np.unique(np.concatenate([[w0, w1], ts, te]))
    seg_start, seg_end = cuts[:-1], cuts[1:]
    state = np.zeros(len(seg_start), dtype=np.int64)
    for b in (1, 2, 4):
        starts, ends = np.sort(ts[bit == b]), np.sort(te[bit == b])
        running = np.searchsorted(starts, seg_start, "right") - np.searchsorted(ends, seg_start, "right")
        state |= np.where(running > 0, b, 0)
    out = {}
    for name, test in LANES.items():
        on = test(state)
        intervals: list[tuple[int, int]] = []
        for a, b, flag in zip(seg_start.tolist(), seg_end.tolist(), on.tolist()):
            if not flag:
                continue
            if intervals and intervals[-1][1] == a:
                intervals[-1] = (intervals[-1][0], b)
            else:
                intervals.append((a, b))
        out[name] = intervals
    return out


@dataclass
class Merge:
    """How one rank's part goes into a trace of several ranks (export_all_ranks): its own packet sequence, track
    uuids and flow ids above `base`, one process (pid `pid`) holding its threads and devices, and the flows
    across ranks that begin or end at its slices."""

    builder: object
    sequence_id: int
    base: int
    pid: int
    links: dict[int, tuple[list[int], list[int]]]  # slice_id -> (flow ids out, flow ids in)


def _write(result: Exported, s: dict, classes: dict, device: dict, warn: list, counters: list,
           merge: Merge | None = None) -> None:
    pb = _proto()
    out = result.path
    base = merge.base if merge else 0
    sequence_id = merge.sequence_id if merge else SEQUENCE_ID
    links = merge.links if merge else {}
    next_uuid = iter(range(base + 1, base + (1 << 40))).__next__
    n = len(s["slice_id"])
    ids, kinds = s["slice_id"], s["kind"]
    starts = np.asarray(s["ts"], dtype=np.int64)
    ends = starts + np.asarray(s["dur"], dtype=np.int64)
    is_device = [d is not None for d in s["device_id"]]
    exported = set(ids)
    pid, tid, dev, track = s["pid"], s["tid"], s["device_id"], s["track"]
    launch, correlation, op_id, steps = s["launch_id"], s["correlation"], s["op_id"], s["step"]
    names, categories, args = s["name"], s["category"], s["args"]

    packets: list = []  # descriptors first, then events merged by time

    def descriptor(**fields) -> int:
        d = pb.TrackDescriptor(uuid=next_uuid(), **fields)
        packets.append(d)
        return d.uuid

    # tracks: host processes and threads, device groups and streams (+ overflow lanes), tracesql lanes
    groups: dict[tuple, int] = {}
    group_of = [None] * n
    proc_uuid: dict[int, int] = {}
    dev_uuid: dict[int, int] = {}
    rank_uuid = None
    if merge:  # one process per rank: its threads and its devices under it
        rank_uuid = descriptor(process=pb.ProcessDescriptor(pid=merge.pid, process_name=f"rank {result.rank}"))
    for i in range(n):
        if is_device[i]:
            d = int(dev[i])
            if d not in dev_uuid:
                dev_uuid[d] = descriptor(name=f"rank {result.rank} · device {d}", parent_uuid=rank_uuid)
            key = ("device", d, track[i] or f"device {d}")
            if key not in groups:
                groups[key] = descriptor(name=key[2], parent_uuid=dev_uuid[d])
        else:
            p, t = int(pid[i] or 0), int(tid[i] or 0)
            if p not in proc_uuid:
                label = (track[i] or f"pid {p}").split(" / ")[0]
                proc_uuid[p] = rank_uuid or descriptor(process=pb.ProcessDescriptor(
                    pid=p, process_name=f"rank {result.rank} · {label}"))
            key = ("host", p, t)
            if key not in groups:
                groups[key] = descriptor(thread=pb.ThreadDescriptor(pid=merge.pid if merge else p, tid=t,
                                                                    thread_name=track[i] or f"tid {t}"),
                                         parent_uuid=proc_uuid[p])
        group_of[i] = key
    for d, (w0, w1) in result.device_windows.items():
        if d not in dev_uuid:
            dev_uuid[d] = descriptor(name=f"rank {result.rank} · device {d}", parent_uuid=rank_uuid)

    # slices: begin/end per track lane, nested; instants on their group's first lane
    timed = [i for i in range(n) if kinds[i] not in INSTANT_KINDS]
    by_group: dict[tuple, list[int]] = {}
    for i in timed:
        by_group.setdefault(group_of[i], []).append(i)
    lane_uuid: dict[tuple, int] = {}
    streams: list[list] = []  # per track lane: events (time, packet maker) in order
    flows_out: dict[int, list[int]] = {}
    for i in range(n):
        if is_device[i] and launch[i] is not None and launch[i] in exported:
            flows_out.setdefault(launch[i], []).append(base + ids[i] + 1)  # the device slice's id + 1 (never 0)
            result.flows += 1
    for key, members in by_group.items():
        order = np.asarray(members)
        lanes = _lanes(starts, ends, order)
        for k in sorted(set(lanes.tolist())):
            if k == 0:
                lane_uuid[(key, 0)] = groups[key]
            else:
                lane_name = key[2] if key[0] == "device" else f"thread {key[2]}"
                parent = dev_uuid[key[1]] if key[0] == "device" else proc_uuid[key[1]]
                lane_uuid[(key, k)] = descriptor(name=f"{lane_name} ({k + 1})", parent_uuid=parent)
            events, open_ends = [], []
            for i in order[lanes == k].tolist():
                while open_ends and open_ends[-1][0] <= starts[i]:
                    events.append((int(open_ends.pop()[0]), "end", None))
                events.append((int(starts[i]), "begin", i))
                open_ends.append((ends[i], i))
            while open_ends:
                events.append((int(open_ends.pop()[0]), "end", None))
            streams.append([(t, kind, i, lane_uuid[(key, k)]) for t, kind, i in events])
    instants = [(int(starts[i]), "instant", i, lane_uuid.get((group_of[i], 0)) or groups[group_of[i]])
                for i in range(n) if kinds[i] in INSTANT_KINDS]
    streams.append(instants)

    # tracesql lanes per device over its window
    bits = np.asarray([CLASS_BITS.get(c, 0) for c in device["class"]], dtype=np.int64)
    dts = np.asarray(device["ts"], dtype=np.int64)
    dte = dts + np.asarray(device["dur"], dtype=np.int64)
    dev_arr = np.asarray(device["device_id"], dtype=np.int64)
    for d, (w0, w1) in sorted(result.device_windows.items()):
        mine = dev_arr == d
        lanes = timeline_lanes(dts[mine], dte[mine], bits[mine], w0, w1)
        for lane, intervals in lanes.items():
            u = descriptor(name=f"tracesql · {lane}", parent_uuid=dev_uuid[d])
            result.lanes[(d, lane)] = sum(b - a for a, b in intervals)
            events = []
            for a, b in intervals:
                events += [(a, "lane_begin", lane, u), (b, "end", None, u)]
            streams.append(events)

    # warnings: instants at the window's start; counters: a counter track per (name, series)
    t0 = result.window[0]
    if warn:
        u = descriptor(name=f"rank {result.rank} · tracesql · warnings")
        streams.append([(t0, "warning", w, u) for w in warn])
        result.warnings = len(warn)
    counter_uuid: dict[tuple, int] = {}
    counter_events = []
    for name, series, where, ts, value in counters:
        key = (name, series, where)
        if key not in counter_uuid:
            label = name + (f" · {series}" if series else "") + (f" ({where})" if where else "")
            counter_uuid[key] = descriptor(name=label, counter=pb.CounterDescriptor())
        counter_events.append((int(ts), "counter", value, counter_uuid[key]))
    counter_events.sort(key=lambda e: e[0])
    streams.append(counter_events)
    result.counter_values = len(counter_events)
    result.tracks = len(packets)

    def annotate(event, i):
        add = event.debug_annotations.add
        for key, value in (("kind", kinds[i]), ("category", categories[i]), ("slice_id", ids[i]),
                           ("correlation", correlation[i]), ("op_id", op_id[i]), ("step", steps[i]),
                           ("launch_id", launch[i]), ("class", classes.get(ids[i]) if is_device[i] else None)):
            if value is None:
                continue
            a = add(name=key)
            if isinstance(value, str):
                a.string_value = value
            else:
                a.int_value = int(value)
        if args[i] and args[i] != "{}":
            text = args[i] if len(args[i]) <= ARGS_CHARS else args[i][: ARGS_CHARS - 1] + "…"
            add(name="args", string_value=text)

    def emit(builder):
        first = True
        for d in packets:
            p = builder.create_packet()
            p.trusted_packet_sequence_id = sequence_id
            if first:
                p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
                first = False
            p.track_descriptor.CopyFrom(d)
            builder.write_packet(p)
        T = pb.TrackEvent
        for t, kind, what, u in heapq.merge(*streams, key=lambda e: e[0]):
            p = builder.create_packet()
            p.trusted_packet_sequence_id = sequence_id
            p.timestamp = t
            e = p.track_event
            e.track_uuid = u
            if kind == "begin" or kind == "instant":
                i = what
                e.type = T.TYPE_SLICE_BEGIN if kind == "begin" else T.TYPE_INSTANT
                e.name = names[i] or ""
                e.categories.append(kinds[i])
                annotate(e, i)
                if kind == "begin":
                    result.slices += 1
                    if ids[i] in flows_out:
                        e.flow_ids.extend(flows_out[ids[i]])
                    if is_device[i] and launch[i] is not None and launch[i] in exported:
                        e.terminating_flow_ids.append(base + ids[i] + 1)
                    if ids[i] in links:
                        e.flow_ids.extend(links[ids[i]][0])
                        e.terminating_flow_ids.extend(links[ids[i]][1])
                else:
                    result.instants += 1
            elif kind == "end":
                e.type = T.TYPE_SLICE_END
            elif kind == "lane_begin":
                e.type = T.TYPE_SLICE_BEGIN
                e.name = what
                e.categories.append("tracesql")
            elif kind == "warning":
                check, count, example, message, source = what
                e.type = T.TYPE_INSTANT
                e.name = f"warning: {check}"
                e.categories.append("tracesql")
                for key, value in (("message", message), ("example", example), ("source_path", source)):
                    if value is not None:
                        e.debug_annotations.add(name=key, string_value=str(value))
                e.debug_annotations.add(name="event_count", int_value=int(count or 0))
            elif kind == "counter":
                e.type = T.TYPE_COUNTER
                e.double_counter_value = float(what)
            builder.write_packet(p)

    if merge:
        emit(merge.builder)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuidlib.uuid4().hex[:8]}.tmp")
    with open(tmp, "wb") as f:
        emit(_writer(f))
    os.replace(tmp, out)


def read(path) -> list:
    """The packets of a Perfetto trace file written by export() (or any trace of TracePackets)."""
    pb = _proto()
    trace = pb.Trace()
    trace.ParseFromString(Path(path).read_bytes())
    return list(trace.packet)


def summary(result: Exported) -> str:
    where = f"step {result.step}" if result.step is not None else "whole trace"
    lanes = "; ".join(f"device {d}: exposed communication {result.lanes.get((d, 'exposed communication'), 0) / 1e6:,.3f}"
                      f" ms, idle {result.lanes.get((d, 'idle'), 0) / 1e6:,.3f} ms of "
                      f"{(w1 - w0) / 1e6:,.3f} ms" for d, (w0, w1) in sorted(result.device_windows.items()))
    return (f"{result.path}: {result.run_id} rank {result.rank} {where}, {(result.window[1] - result.window[0]) / 1e6:,.3f}"
            f" ms: {result.slices:,} slices, {result.instants:,} instants, {result.flows:,} flows, {result.tracks} "
            f"tracks, {result.warnings} warning(s)" + (f"; {lanes}" if lanes else "")
            + ". Open it in https://ui.perfetto.dev")


def summary_all(result: AllRanks) -> str:
    where = f"step {result.step}" if result.step is not None else "whole traces"
    shifted = {r: o for r, o in result.offsets.items() if o}
    clocks = ("clocks aligned by clock_offsets (" + ", ".join(f"rank {r}: {-o / 1e6:+,.3f} ms" for r, o in
                                                             sorted(shifted.items())[:8])
              + (", ..." if len(shifted) > 8 else "") + ")") if shifted else "clocks as recorded"
    kept = (f"host slices to depth {result.host_depth} and every communication call" if result.host_depth is not None
            else "every slice")
    return (f"{result.path}: {result.run_id}, {len(result.parts)} ranks, {where}: "
            f"{sum(p.slices for p in result.parts):,} slices ({kept}), {result.links:,} flows between ranks, "
            f"{clocks}. Open it in https://ui.perfetto.dev")


def to_json(result: Exported) -> str:
    return json.dumps({"path": str(result.path), "run_id": result.run_id, "rank": result.rank, "step": result.step,
                       "window": list(result.window), "slices": result.slices, "flows": result.flows})
