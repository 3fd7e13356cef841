"""The planted-cause benchmark of `tracesql findings` (issue 27): does the top finding name a cause planted in a
real trace, and is its saving the step time the cause costs?

Each variant is a real Kineto trace with one cause added to every step, by surgery on its events (`plant`):
- host_stall: a host op (`planted::host_stall`) of `fraction` × the step's length on the step's thread, at the
  step's start, before its launches;
- slow_loader: the same time spent in the data loader: the user annotation PyTorch records around a DataLoader's
  `__next__` (`enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`), with no op inside (Python time);
- sync_d2h: a `.item()` at the middle of the step: aten::item → aten::_local_scalar_dense → cudaMemcpyAsync (a
  4-byte device-to-host copy on the stream of the last kernel launched before it) and cudaStreamSynchronize (with
  its cuda_sync event), the host waiting until the copy ends.
The host events after the cause move later by the time it takes (ranges that span it grow), and each device event
launched after it starts at the earliest time its stream and its new launch allow (never earlier than it did):
a device that was behind its host absorbs the delay, as a real one would. Host calls that waited for the device
(synchronizations, launches blocked on a full queue) absorb the delay as far as the device work they waited for
did not move (`_shift`). The measured cost of the cause is the rank's span over its steps (from the first step's
start to the end of the last one's work, the what_if query's measured_ns) in the variant minus the original's,
per step: work a step queued may move into the next.

On XLA profiles of the CPU (JAX XPlane: the devices' ops are thunks on the host's threads, the replay is
device-only), by surgery on the XSpace (`plant_xla`):
- layout_transpose: a data-formatting op at the start of each step's device work, on every device: an HLO
  `transpose` of one of the program's parameters (`transpose.planted`, added to the program's entry computation in
  the profile's HLO proto) lasting `fraction` × the step on the thread that runs that device's first op of the
  step; every event that starts later moves later by that time, and the ranges that span its start (the step,
  the program's execution) grow by it.

A finding hits when the variant's top finding of that rank and step is the cause's rule (host_op naming the
planted op, host_sync, data_loader, xla_data_formatting naming the planted op), its saving error is
(saving_ns − cost) / cost. False findings: the unmodified trace's findings above 5 % of the step.

    python benchmarks/bench_findings.py [TRACE ...] [--fraction 0.3] [--markdown]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TRACESQL_CORPUS", REPO.parent / "shared" / "corpus"))
#: Real traces with steps whose host ops launched device work: bundled, then the corpus's.
TRACES = [REPO / "datasets" / "hta_trace_filter" / "sampled_rank-0.json.gz",
          CORPUS / "hta/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
          CORPUS / "hta/tests/data/negative_queue_length_values_check/rank0.json.gz",
          CORPUS / "hta/tests/data/trace_diff/control/control.json.gz"]
CAUSES = {"host_stall": "host_op", "sync_d2h": "host_sync", "slow_loader": "data_loader"}
#: Jobs of several ranks for the causes across ranks (a folder of rank traces, or one trace taken as `copies`
#: identical ranks: a balanced job), and those causes' rules.
JOBS = [(REPO / "datasets" / "hta_trace_filter", 1),
        (CORPUS / "hta/tests/data/trace_diff/control/control.json.gz", 4),
        (CORPUS / "hta/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", 2)]
JOB_CAUSES = {"slow_rank": "straggler", "exposed_collective": "exposed_communication"}
#: XLA profiles of the CPU with steps and their programs' HLO (jax_cpu_4dev_allreduce has no HLO: no opcodes)
XLA_TRACES = [REPO / "datasets" / "jax_cpu_8dev_ffn" / "ffn.xplane.pb", REPO / "datasets" / "jax_cpu_mlp" / "vm.xplane.pb"]
XLA_CAUSES = {"layout_transpose": "xla_data_formatting"}
PLANTED_TRANSPOSE = "transpose.planted"
SLOW_FACTOR = 1.3  # slow_rank: its kernels take this × their time
#: The causes that are one host range at the step's start: its category and name.
STALLS = {"host_stall": ("cpu_op", "planted::host_stall"),
          "slow_loader": ("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")}
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_LATENCY_US = 5.0  # a launch's latency when the plant adds a launch or its old one is not known


def load(path: Path) -> dict:
    with (gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open)(path, "rt") as f:
        return json.load(f)


def _steps(events: list[dict]) -> list[dict]:
    return sorted((e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")),
                  key=lambda e: e["ts"])


QUEUED_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync", "cudaMemsetAsync")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize")
DEEP_QUEUE_US = 1000.0  # a launch whose work starts this long after it returns was queued behind other work
SYNC_RETURN_US = 10.0  # a synchronize's own time once the work it waits for has ended


def _launch_starts(events: list[dict]) -> dict[int, float]:
    return {e["args"]["correlation"]: e["ts"] for e in events
            if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}


def _shift(events: list[dict], t0: float, delay: float) -> None:
    """Replay the trace from t0 with the host `delay` later there: host events from t0 on move later (ranges
    that span t0 grow), device work launched after t0 starts at the earliest its stream and its moved launch
    allow (never earlier than it did). A host call that waited for the device absorbs the delay: a
    synchronize, or a launch that blocked on a full queue (it took over twice its call's median and its work
    started over DEEP_QUEUE_US after it returned), now returns at the later of its own time after the delayed
    start and its old end moved as the device work it waited for moved. The host and the device depend on each
    other (a moved launch moves its work, moved work moves the calls waiting for it): three rounds settle it.
    Events marked "planted" (the cause) keep their times. cuda_sync records follow their host call."""
    device = sorted((e for e in events if e.get("cat") in DEVICE_CATS), key=lambda e: e["ts"])
    calls = {e["args"]["correlation"]: e for e in events
             if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    median = {name: statistics.median(e["dur"] for e in calls.values() if e["name"] == name)
              for name in {e["name"] for e in calls.values()}}
    streams: dict[tuple, list[dict]] = {}
    for e in device:
        streams.setdefault((e["pid"], e["args"].get("stream")), []).append(e)
    waits = {e["args"]["correlation"]: (e["pid"], e["args"].get("stream")) for e in events
             if e.get("cat") == "cuda_sync" and "correlation" in e.get("args", {})}
    later = sorted((c for c in calls.values() if c["ts"] >= t0 and not c.get("planted")), key=lambda c: c["ts"])
    moved: dict[int, float] = {}  # id(device event) -> how much later it starts
    for _ in range(3):
        warp = _warp(_breaks(later, t0, delay, median, streams, calls, waits, moved))
        moved, stream_end = {}, {}
        for e in device:  # in start order: each starts at the earliest its stream and its moved launch allow
            key, call = (e["pid"], e["args"].get("stream")), calls.get(e["args"].get("correlation"))
            new = e["ts"]
            if call is not None and not call.get("planted") and call["ts"] >= t0:
                latency = min(max(e["ts"] - call["ts"], 0.0), 20.0)
                new = max(e["ts"], warp(call["ts"]) + latency, stream_end.get(key, e["ts"]))
                moved[id(e)] = new - e["ts"]
            stream_end[key] = max(stream_end.get(key, 0.0), new + e["dur"])
    for e in events:
        if e.get("cat") in DEVICE_CATS or e.get("cat") in ("cuda_sync", "gpu_user_annotation") or e.get("planted"):
            continue
        end = e["ts"] + e.get("dur", 0)
        shift = warp(e["ts"]) - e["ts"]
        e["ts"] += shift
        if e.get("ph") == "X":
            e["dur"] += warp(end) - end - shift
    for e in device:
        e["ts"] += moved.get(id(e), 0.0)
    for e in events:
        if e.get("cat") == "cuda_sync" and e["args"].get("correlation") in calls:
            call = calls[e["args"]["correlation"]]
            e["ts"] = call["ts"] + call["dur"] - e["dur"]
        e.pop("planted", None)


def _breaks(calls, t0, delay, median, streams, by_correlation, waits, moved) -> list[tuple]:
    """(old time, how much later the host is from then on), from t0 on: the host calls that waited for the
    device (see _shift) absorb the delay, or add to it when the work they waited for moved later."""
    launched = {e["args"]["correlation"]: e for work in streams.values() for e in work
                if "correlation" in e.get("args", {})}
    starts = {key: [e["ts"] for e in work] for key, work in streams.items()}

    def ended_by(key, t, shifted):  # the latest end of the stream's work launched before t
        ends = [e["ts"] + e["dur"] + (moved.get(id(e), 0.0) if shifted else 0.0) for e in streams[key]
                if (c := by_correlation.get(e["args"].get("correlation"))) is not None and c["ts"] < t]
        return max(ends, default=0.0)

    breaks = [(t0, delay)]
    for call in calls:
        now, end = breaks[-1][1], call["ts"] + call["dur"]
        work = launched.get(call["args"]["correlation"])
        if work is not None and call["name"] in QUEUED_CALLS and call["dur"] > 2 * median[call["name"]] \
                and work["ts"] - end > DEEP_QUEUE_US:
            key = (work["pid"], work["args"].get("stream"))
            k = bisect.bisect_right(starts[key], end) - 1  # the work running when a slot freed
            freed = moved.get(id(streams[key][k]), 0.0) if k >= 0 else 0.0
            breaks.append((end, max(call["ts"] + now + median[call["name"]], end + freed) - end))
        elif work is None and call["name"] in SYNC_CALLS:
            keys = [waits[call["args"]["correlation"]]] if call["name"] == "cudaStreamSynchronize" and \
                call["args"]["correlation"] in waits else list(streams)
            keys = [k for k in keys if k in streams]
            waited = max((ended_by(k, call["ts"], True) for k in keys), default=0.0)
            was = max((ended_by(k, call["ts"], False) for k in keys), default=0.0)
            back = max(call["ts"] + now + min(call["dur"], SYNC_RETURN_US), end + waited - was)
            breaks.append((end, back - end))
    return breaks


def _warp(breaks: list[tuple]):
    times = [t for t, _ in breaks]

    def warp(t: float) -> float:
        k = bisect.bisect_right(times, t) - 1
        return t + (breaks[k][1] if k >= 0 else 0.0)
    return warp


def plant(trace: dict, cause: str, fraction: float) -> dict:
    """`trace` (Kineto JSON) with `cause` added to each step (see the module's doc)."""
    events = trace["traceEvents"]
    correlation = max((e.get("args", {}).get("correlation", 0) for e in events), default=0) + 1_000_000
    for step in _steps(events):  # in time order: each plant sees the timeline the earlier ones made
        before = _launch_starts(events)
        pid, tid = step["pid"], step["tid"]
        if cause in STALLS:
            t0, length = step["ts"] + 1, fraction * step["dur"]
            cat, name = STALLS[cause]
            events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": t0, "dur": length,
                           "args": {}, "planted": True})
        elif cause == "sync_d2h":
            t0 = step["ts"] + step["dur"] / 2
            kernels = [e for e in events if e.get("cat") == "kernel" and before.get(e["args"].get("correlation"),
                                                                                     t0) < t0]
            last = max(kernels, key=lambda e: before[e["args"]["correlation"]])
            stream, device = last["args"]["stream"], last["pid"]
            busy_until = max(e["ts"] + e["dur"] for e in events if e.get("cat") in DEVICE_CATS
                             and e["pid"] == device and e["args"].get("stream") == stream
                             and before.get(e["args"].get("correlation"), t0) < t0)
            copy_ts = max(busy_until, t0 + 10 + LAUNCH_LATENCY_US)
            wait = copy_ts + 2 - (t0 + 20)  # the host is back 20 µs of calls after t0 plus the wait
            length = 20 + max(wait, 0) + 10
            c_copy, c_sync = correlation, correlation + 1
            correlation += 2
            host = [("cpu_op", "aten::item", t0, length, {}),
                    ("cpu_op", "aten::_local_scalar_dense", t0 + 2, length - 4, {}),
                    ("cuda_runtime", "cudaMemcpyAsync", t0 + 4, 6, {"correlation": c_copy}),
                    ("cuda_runtime", "cudaStreamSynchronize", t0 + 12, length - 16, {"correlation": c_sync})]
            events += [{"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
                        "args": args, "planted": True} for cat, name, ts, dur, args in host]
            events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": device,
                           "tid": stream, "ts": copy_ts, "dur": 2,
                           "args": {"device": device, "stream": stream, "correlation": c_copy, "bytes": 4},
                           "planted": True})
            events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": device, "tid": stream,
                           "ts": t0 + length - 6, "dur": 2,
                           "args": {"cuda_sync_kind": "Stream Sync", "stream": stream, "correlation": c_sync,
                                    "device": device}})
        else:
            raise ValueError(f"unknown cause {cause!r} (known: {', '.join(CAUSES)})")
        _shift(events, t0, length)
    return trace


def _stat_values(plane, stats) -> dict:
    names = {k: m.name for k, m in plane.stat_metadata.items()}
    out = {}
    for stat in stats:
        kind = stat.WhichOneof("value")
        value = getattr(stat, kind) if kind else None
        out[names.get(stat.metadata_id)] = plane.stat_metadata[value].name if kind == "ref_value" else value
    return out


def _plant_transpose(space, programs: set) -> None:
    """Add `transpose.planted` (a transpose of the first 2-D parameter) to the entry computation of each program."""
    from tracesql.readers.proto import messages

    metadata = next(p for p in space.planes if p.name == "/host:metadata")
    stat_names = {m.name: k for k, m in metadata.stat_metadata.items()}
    for meta in metadata.event_metadata.values():
        stats = {s.metadata_id: s for s in meta.stats}
        program = stats.get(stat_names.get("program_id"))
        if program is None or program.uint64_value not in programs:
            continue
        hlo = stats[stat_names["Hlo Proto"]]
        proto = messages()["HloProto"].FromString(hlo.bytes_value)
        module = proto.hlo_module
        entry = next(c for c in module.computations if c.id == module.entry_computation_id)
        source = next(i for i in entry.instructions if i.opcode == "parameter" and len(i.shape.dimensions) == 2)
        planted = entry.instructions.add(name=PLANTED_TRANSPOSE, opcode="transpose", operand_ids=[source.id],
                                         dimensions=[1, 0],
                                         id=max(i.id for c in module.computations for i in c.instructions) + 1)
        planted.shape.CopyFrom(source.shape)
        planted.shape.dimensions[:] = list(reversed(source.shape.dimensions))
        hlo.bytes_value = proto.SerializeToString()


def plant_xla(data: bytes, fraction: float) -> bytes:
    """An XLA CPU profile (XSpace bytes) with a data-formatting op of `fraction` × each step planted before the
    step's device work on every device (module docstring)."""
    from tracesql.readers.proto import messages

    space = messages()["XSpace"].FromString(data)
    host = next(p for p in space.planes if p.name == "/host:CPU")
    events = [(line, e, _stat_values(host, e.stats)) for line in host.lines for e in line.events]
    at = {id(e): line.timestamp_ns * 1000 + e.offset_ps for line, e, _ in events}  # ps on the plane's clock
    steps = sorted((e for _, e, s in events if "step_num" in s), key=lambda e: at[id(e)])
    ops = sorted(((line, e, s) for line, e, s in events if "device_ordinal" in s and "hlo_op" in s),
                 key=lambda x: at[id(x[1])])
    plants = []  # (time, delay, [(line, first op of each device)])
    for step in steps:
        start, end = at[id(step)], at[id(step)] + step.duration_ps
        firsts = {}
        for line, e, s in ops:
            if start <= at[id(e)] < end:
                firsts.setdefault(s["device_ordinal"], (line, e, s))
        if firsts:
            plants.append((min(at[id(e)] for _, e, _ in firsts.values()), round(fraction * step.duration_ps),
                           list(firsts.values())))
    times = [t for t, _, _ in plants]
    delays = [0]
    for _, delay, _ in plants:
        delays.append(delays[-1] + delay)

    def moved(t: int, inclusive: bool) -> int:
        return t + delays[(bisect.bisect_right if inclusive else bisect.bisect_left)(times, t)]

    for line, e, _ in events:  # starts at or after a plant move later; ends after it too (spanning ranges grow)
        t0, t1 = at[id(e)], at[id(e)] + e.duration_ps
        e.offset_ps = moved(t0, True) - line.timestamp_ns * 1000
        e.duration_ps = moved(t1, False) - moved(t0, True) if e.duration_ps else 0
    op_id = max(host.event_metadata) + 1
    host.event_metadata[op_id].id, host.event_metadata[op_id].name = op_id, PLANTED_TRANSPOSE
    stat_id = max(host.stat_metadata) + 1
    host.stat_metadata[stat_id].id, host.stat_metadata[stat_id].name = stat_id, PLANTED_TRANSPOSE
    hlo_op = next(k for k, m in host.stat_metadata.items() if m.name == "hlo_op")
    for (t, delay, firsts), before in zip(plants, delays):
        for line, first, _ in firsts:
            planted = line.events.add(metadata_id=op_id, offset_ps=t + before - line.timestamp_ns * 1000,
                                      duration_ps=delay)
            for stat in first.stats:
                if host.stat_metadata[stat.metadata_id].name == "_p":  # the op's own producer id: not shared
                    continue
                copy = planted.stats.add()
                copy.CopyFrom(stat)
                if stat.metadata_id == hlo_op:
                    copy.ref_value = stat_id
    for line in host.lines:  # events in time order on each line, as profilers write them
        ordered = [e.SerializeToString() for e in sorted(line.events, key=lambda e: e.offset_ps)]
        del line.events[:]
        for event in ordered:
            line.events.add().ParseFromString(event)
    _plant_transpose(space, {s["program_id"] for _, _, firsts in plants for _, _, s in firsts})
    return space.SerializeToString()


def load_job(path: Path, copies: int = 1) -> list[dict]:
    """The rank traces of a job: a folder's, or one trace as `copies` ranks (distributedInfo's rank rewritten)."""
    if path.is_dir():
        return [load(p) for p in sorted(path.glob("*.json*"))]
    text = json.dumps(load(path))
    job = [json.loads(text) for _ in range(copies)]
    for rank, trace in enumerate(job):
        trace["distributedInfo"] = dict(trace.get("distributedInfo", {}), rank=rank, world_size=copies)
    return job


def _communication(events: list[dict]) -> list[dict]:
    """A rank's communication (NCCL) kernels in start order: the n-th of each rank are one collective."""
    return sorted((e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")),
                  key=lambda e: e["ts"])


def _retime_rank(events: list[dict], factor: float, collectives: list, waits_for: dict) -> tuple:
    """One rank's device work replayed (see _retime) given the collectives' arrivals: (new (ts, dur) by
    id(device event), the host's breaks)."""
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    calls = {e["args"]["correlation"]: e for e in events
             if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    synced = {e["args"]["correlation"]: (e["pid"], e["args"].get("stream")) for e in events
              if e.get("cat") == "cuda_sync" and "correlation" in e.get("args", {})}
    syncs = [e for e in calls.values() if e["name"] in SYNC_CALLS]
    streams = {(e["pid"], e["args"].get("stream")) for e in device}
    on_stream: dict[tuple, list[dict]] = {}
    for e in sorted(device, key=lambda e: e["ts"]):
        on_stream.setdefault((e["pid"], e["args"].get("stream")), []).append(e)
    starts = {key: [e["ts"] for e in work] for key, work in on_stream.items()}
    launched = {e["args"]["correlation"]: e for e in device if "correlation" in e["args"]}
    median = {name: statistics.median(e["dur"] for e in calls.values() if e["name"] == name)
              for name in {e["name"] for e in calls.values()}}
    # launches blocked on a full queue (as _shift tells them): they return when a slot frees
    blocked = [c for corr, c in calls.items() if c["name"] in QUEUED_CALLS and corr in launched
               and c["dur"] > 2 * median[c["name"]] and launched[corr]["ts"] - c["ts"] - c["dur"] > DEEP_QUEUE_US]
    order = sorted([(e["ts"], 0, id(e), e) for e in device] + [(e["ts"] + e["dur"], 1, id(e), e) for e in syncs]
                   + [(e["ts"] + e["dur"], 2, id(e), e) for e in blocked], key=lambda x: x[:3])
    new, stream_end, breaks = {}, {}, [(float("-inf"), 0.0)]
    warp = _warp(breaks)
    launched_at = {id(e): calls[e["args"]["correlation"]]["ts"] for e in device
                   if e["args"].get("correlation") in calls}
    for _, is_sync, _, e in order:
        if is_sync == 2:  # a blocked launch returns when the work running as it returned starts the next
            work = launched[e["args"]["correlation"]]
            key, end = (work["pid"], work["args"].get("stream")), e["ts"] + e["dur"]
            k = bisect.bisect_right(starts[key], end) - 1
            running = on_stream[key][k] if k >= 0 else None
            freed = new[id(running)][0] + new[id(running)][1] - running["ts"] - running["dur"] \
                if running is not None and id(running) in new else 0.0
            breaks.append((end, max(warp(e["ts"]) + median[e["name"]], end + freed) - end))
            warp = _warp(breaks)
            continue
        if is_sync:  # it returns when the work it waited for (launched before it, on its stream or all) ends
            corr = e["args"]["correlation"]
            keys = [synced[corr]] if corr in synced else streams
            waited = [d for d in device if (d["pid"], d["args"].get("stream")) in keys
                      and launched_at.get(id(d), e["ts"]) < e["ts"] and id(d) in new]
            was = max((d["ts"] + d["dur"] for d in waited), default=0.0)
            now = max((sum(new[id(d)]) for d in waited), default=0.0)
            end = e["ts"] + e["dur"]
            back = max(warp(e["ts"]) + min(e["dur"], SYNC_RETURN_US), end + now - was)
            breaks.append((end, back - end))
            warp = _warp(breaks)
            continue
        key, start = (e["pid"], e["args"].get("stream")), e["ts"]
        if id(e) in launched_at:
            latency = min(max(e["ts"] - launched_at[id(e)], 0.0), 20.0)
            start = max(start, warp(launched_at[id(e)]) + latency)
        start = max(start, stream_end.get(key, start))
        if id(e) in waits_for:  # a stream wait: after the collective it waits for
            start = max(start, sum(new[id(waits_for[id(e)])]))
        dur = e["dur"] * (factor if e.get("cat") == "kernel" else 1.0)
        if id(e) in collectives:  # it completes its transfer after the last rank's arrival
            latest, last = collectives[id(e)]
            end = e["ts"] + e["dur"]
            if end >= last:  # (else the ranks' clocks disagree: taken as not waiting)
                dur = max(start, latest) + end - last - start
            else:
                dur = e["dur"]
        new[id(e)] = (start, dur)
        stream_end[key] = start + dur
    return new, breaks


def _retime(job: list[dict], slow: int | None = None, waits_for: dict | None = None) -> None:
    """Replay the job's device work after a change on the device: rank `slow`'s kernels take SLOW_FACTOR × their
    time, and/or device events wait for a collective (waits_for: id(event) -> the collective kernel). Each
    device event starts at the earliest its stream, its launch (moved as the host moved) and what it waits for
    allow, never earlier than it did; the n-th collective of each rank completes its transfer (its time after
    the last arrival) after the last rank's new arrival; a synchronize returns when the work it waited for
    ends, moving the host after it (as in _shift). The ranks wait for each other: four rounds settle it."""
    ranks = [t["traceEvents"] for t in job]
    comm = [_communication(events) for events in ranks]
    count = min(len(c) for c in comm)
    last = [max(c[n]["ts"] for c in comm) for n in range(count)]
    arrivals = [[c[n]["ts"] for n in range(count)] for c in comm]
    for _ in range(4):
        done = []
        for r, events in enumerate(ranks):
            others = [max(a[n] for q, a in enumerate(arrivals) if q != r) if len(ranks) > 1 else float("-inf")
                      for n in range(count)]
            collectives = {id(comm[r][n]): (others[n], last[n]) for n in range(count)}
            done.append(_retime_rank(events, SLOW_FACTOR if r == slow else 1.0, collectives, waits_for or {}))
        arrivals = [[done[r][0][id(comm[r][n])][0] for n in range(count)] for r in range(len(ranks))]
    for events, (new, breaks) in zip(ranks, done):
        warp = _warp(breaks)
        calls = {}
        for e in events:
            if e.get("cat") in DEVICE_CATS:
                e["ts"], e["dur"] = new[id(e)]
            elif e.get("cat") not in ("cuda_sync", "gpu_user_annotation"):
                end = e["ts"] + e.get("dur", 0)
                shift = warp(e["ts"]) - e["ts"]
                e["ts"] += shift
                if e.get("ph") == "X":
                    e["dur"] += warp(end) - end - shift
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {}):
                    calls[e["args"]["correlation"]] = e
        for e in events:
            if e.get("cat") == "cuda_sync" and e["args"].get("correlation") in calls:
                call = calls[e["args"]["correlation"]]
                e["ts"] = call["ts"] + call["dur"] - e["dur"]


def _hidden_collective(events: list[dict]) -> list[tuple]:
    """Per step, the collective most hidden under compute: (collective kernel, the first kernel launched after
    it on the busiest other stream of its device, which started while it ran), the longest overlap first."""
    launched = _launch_starts(events)
    kernels = [e for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") in launched]
    busiest = {}
    for e in kernels:
        busiest.setdefault(e["pid"], {}).setdefault(e["args"].get("stream"), []).append(e)
    picks = []
    for step in _steps(events):
        best = None
        for c in _communication(events):
            at = launched.get(c["args"].get("correlation"))
            if at is None or not step["ts"] <= at <= step["ts"] + step["dur"]:
                continue
            streams = {k: v for k, v in busiest[c["pid"]].items() if k != c["args"].get("stream")}
            if not streams:
                continue
            compute = max(streams.values(), key=len)
            after = [k for k in compute if launched[k["args"]["correlation"]] > at]
            first = min(after, key=lambda k: launched[k["args"]["correlation"]], default=None)
            if first is not None and c["ts"] < first["ts"] < c["ts"] + c["dur"]:
                overlap = c["ts"] + c["dur"] - first["ts"]
                if best is None or overlap > best[0]:
                    best = (overlap, c, first)
        if best is not None:
            picks.append(best[1:])
    return picks


def plant_job(job: list[dict], cause: str) -> list[dict]:
    """`job` (one Kineto trace per rank) with `cause` added: slow_rank, the last rank's kernels SLOW_FACTOR × as
    long; exposed_collective, on every rank, each step's collective most hidden under compute made to hold the
    compute stream (a cudaEventRecord after its launch and a cudaStreamWaitEvent on the compute stream, with the
    cuda_sync record Kineto writes for it: the next kernel launched there waits until the collective ends)."""
    if cause == "slow_rank":
        _retime(job, slow=len(job) - 1)
        return job
    if cause != "exposed_collective":
        raise ValueError(f"unknown cause {cause!r} (known: {', '.join(JOB_CAUSES)})")
    waits_for = {}
    for trace in job:
        events = trace["traceEvents"]
        correlation = max((e.get("args", {}).get("correlation", 0) for e in events), default=0) + 1_000_000
        calls = {e["args"]["correlation"]: e for e in events
                 if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
        for collective, first in _hidden_collective(events):
            launch, next_launch = calls[collective["args"]["correlation"]], calls[first["args"]["correlation"]]
            # the two calls fit between the collective's launch and the next event on the thread
            t0 = launch["ts"] + launch["dur"]
            room = min([e["ts"] for e in events if e.get("tid") == launch["tid"] and e.get("pid") == launch["pid"]
                        and e["ts"] >= t0] + [next_launch["ts"]]) - t0
            length = room / 3
            record, wait = correlation, correlation + 1
            correlation += 2
            stream, waiting = collective["args"]["stream"], first["args"]["stream"]
            events += [{"ph": "X", "cat": "cuda_runtime", "name": name, "pid": launch["pid"], "tid": launch["tid"],
                        "ts": t0 + k * length, "dur": length / 2, "args": {"correlation": corr}}
                       for k, (name, corr) in enumerate((("cudaEventRecord", record), ("cudaStreamWaitEvent", wait)))]
            events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": first["pid"],
                           "tid": waiting, "ts": t0 + length, "dur": length / 2,
                           "args": {"cuda_sync_kind": "Stream Wait Event", "stream": waiting, "device": first["pid"],
                                    "wait_on_stream": stream, "wait_on_cuda_event_record_corr_id": record,
                                    "correlation": wait}})
            waits_for[id(first)] = collective
    _retime(job, waits_for=waits_for)
    return job


def write(trace: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    return path


_CACHE: dict = {}


def _variants(original: Path, cause: str, fraction: float, scratch: Path, copies: int) -> tuple[str, dict]:
    """The name, and the original's and the variant's trace files or folders (written under scratch)."""
    name = original.name.split(".")[0] + (f"x{copies}" if copies > 1 else "")
    if cause in XLA_CAUSES:
        name = original.parent.name  # the XPlanes' own names (vm, ffn) do not say which profile
        variant = scratch / "traces" / f"{name}-{cause}" / original.name
        variant.parent.mkdir(parents=True, exist_ok=True)
        variant.write_bytes(plant_xla(original.read_bytes(), fraction))
        return name, {"original": original, "variant": variant}
    if cause in CAUSES:
        return name, {"original": original, "variant": write(plant(load(original), cause, fraction),
                                                             scratch / "traces" / f"{name}-{cause}.json.gz")}
    folders = {"original": original if original.is_dir() else scratch / "traces" / name,
               "variant": scratch / "traces" / f"{name}-{cause}"}
    if not folders["original"].exists():
        for rank, trace in enumerate(load_job(original, copies)):
            write(trace, folders["original"] / f"rank-{rank}.json.gz")
    for rank, trace in enumerate(plant_job(load_job(original, copies), cause)):
        write(trace, folders["variant"] / f"rank-{rank}.json.gz")
    return name, folders


def evaluate(original: Path, cause: str, fraction: float, scratch: Path, copies: int = 1) -> dict:
    """Plant `cause` in `original` (a job's folder or trace, taken as `copies` ranks, for the causes across
    ranks), run findings on both, and score the variant's top finding per rank and step."""
    import tracesql
    from tracesql import findings

    name, sources = _variants(original, cause, fraction, scratch, copies)
    runs = {}
    for label, source in sources.items():
        out = scratch / "runs" / f"{name}-{label if label == 'original' else cause}"
        if not out.exists():
            tracesql.ingest([source], out)
        runs[label] = out
    spans, found = {}, {}
    for label, run in runs.items():
        if (run, "found") not in _CACHE:  # the original's, once for all its variants
            steps = tracesql.query("what_if", run)
            starts = tracesql.connect(run).sql("SELECT rank, step, ts FROM steps").df().set_index(["rank", "step"])
            steps = steps.set_index(["rank", "step"]).join(starts)
            ends = (steps.ts + steps.measured_ns).groupby(level="rank").max()
            _CACHE[run, "spans"] = (ends - steps.ts.groupby(level="rank").min(), steps.measured_ns)
            _CACHE[run, "found"] = findings.run(tracesql.connect(run), str(run)).df()
        spans[label], found[label] = _CACHE[run, "spans"], _CACHE[run, "found"]
    rule, rows = {**CAUSES, **JOB_CAUSES, **XLA_CAUSES}[cause], []
    for rank, span in spans["original"][0].items():
        steps = spans["original"][1].loc[rank]
        cost = (spans["variant"][0][rank] - span) / len(steps)  # per step: queued work may move it to the next
        mine = found["variant"][found["variant"]["rank"] == rank]
        tops = [mine[mine.step == s].iloc[0] if (mine.step == s).any() else None for s in steps.index]
        planted = {"host_stall": "planted::host_stall", "layout_transpose": PLANTED_TRANSPOSE}.get(cause, "")
        hits = [t is not None and t.finding == rule and planted in t.evidence for t in tops]
        saving = sum(int(t.saving_ns) for t, hit in zip(tops, hits) if hit) / len(steps)
        if cost < 0.05 * steps.mean():  # the cause costs this trace (almost) nothing: right when no rule says so
            hits = [t is None or t.finding != rule for t in tops]
            cost = saving = 0.0
        rows.append({"rank": rank, "steps": len(steps), "hits": sum(hits), "cost_ns": round(cost),
                     "saving_ns": round(saving), "error": (saving - cost) / cost if cost else None})
    original = found["original"].join(spans["original"][1], on=["rank", "step"])
    false = int((original.saving_ns > 0.05 * original.measured_ns).sum())
    return {"trace": name, "cause": cause, "rows": rows, "false": false}


def summary(results: list[dict]) -> list[dict]:
    table = []
    for r in results:
        for x in r["rows"]:
            table.append({"trace": r["trace"], "cause": r["cause"], "rank": x["rank"], "steps": x["steps"],
                          "hits": x["hits"], "cost_ms": round(x["cost_ns"] / 1e6, 2),
                          "saving_ms": round(x["saving_ns"] / 1e6, 2),
                          "error_pct": None if x["error"] is None else round(100 * x["error"], 1),
                          "false_findings_original": r["false"]})
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path,
                        help="Kineto traces or XLA CPU XPlanes (default: the bundled and corpus ones)")
    parser.add_argument("--fraction", type=float, default=0.3, help="host stall length, × the step's (0.3)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the docs)")
    parser.add_argument("--cause", action="append", choices=list(CAUSES) + list(JOB_CAUSES) + list(XLA_CAUSES),
                        help="only this cause (repeatable; default: all)")
    args = parser.parse_args(argv)
    given = [t for t in (args.traces or TRACES + XLA_TRACES) if t.exists()]
    xla = [t for t in given if t.name.endswith(".xplane.pb")]
    traces = [t for t in given if t not in xla]
    jobs = [(path, copies) for path, copies in ([] if args.traces else JOBS) if path.exists()]
    causes = args.cause or list(CAUSES) + list(JOB_CAUSES) + list(XLA_CAUSES)
    with tempfile.TemporaryDirectory() as tmp:
        results = [evaluate(t, cause, args.fraction, Path(tmp)) for t in traces for cause in CAUSES
                   if cause in causes]
        results += [evaluate(path, cause, args.fraction, Path(tmp), copies) for path, copies in jobs
                    for cause in JOB_CAUSES if cause in causes]
        results += [evaluate(t, cause, args.fraction, Path(tmp)) for t in xla for cause in XLA_CAUSES
                    if cause in causes]
    table = summary(results)
    columns = list(table[0])
    if args.markdown:
        print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
        for row in table:
            print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    else:
        for row in table:
            print("  ".join(f"{c}={row[c]}" for c in columns))
    steps = sum(r["steps"] for r in table)
    priced = [r for r in table if r["error_pct"] is not None]
    print(f"hit rate {sum(r['hits'] for r in table)}/{steps} steps; saving within ±25 % of the cost: "
          f"{sum(abs(r['error_pct']) <= 25 for r in priced)}/{len(priced)} pairs; false findings on the originals: "
          f"{sum({r['trace']: r['false_findings_original'] for r in table}.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
