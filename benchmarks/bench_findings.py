"""The planted-cause benchmark of `tracesql findings` (issue 27): does the top finding name a cause planted in a
real trace, and is its saving the step time the cause costs?

Each variant is a real Kineto trace with one cause added to every step, by surgery on its events (`plant`):
- host_stall: a host op (`planted::host_stall`) of `fraction` × the step's length on the step's thread, at the
  step's start, before its launches;
- sync_d2h: a `.item()` at the middle of the step: aten::item → aten::_local_scalar_dense → cudaMemcpyAsync (a
  4-byte device-to-host copy on the stream of the last kernel launched before it) and cudaStreamSynchronize (with
  its cuda_sync event), the host waiting until the copy ends.
The host events after the cause move later by the time it takes (ranges that span it grow), and each device event
launched after it starts at the earliest time its stream and its new launch allow (never earlier than it did):
a device that was behind its host absorbs the delay, as a real one would. Host calls that wait for the device
later in the step keep their length (the one approximation). The measured cost of the cause is the step's
measured time (the what_if query's measured_ns) in the variant minus the original's, per rank and step.

A finding hits when the variant's top finding of that rank and step is the cause's rule (host_op naming the
planted op, host_sync), its saving error is (saving_ns − cost) / cost. False findings: the unmodified trace's
findings above 5 % of the step.

    python benchmarks/bench_findings.py [TRACE ...] [--fraction 0.3] [--markdown]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
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
CAUSES = {"host_stall": "host_op", "sync_d2h": "host_sync"}
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_LATENCY_US = 5.0  # a launch's latency when the plant adds a launch or its old one is not known


def load(path: Path) -> dict:
    with (gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open)(path, "rt") as f:
        return json.load(f)


def _steps(events: list[dict]) -> list[dict]:
    return sorted((e for e in events if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")),
                  key=lambda e: e["ts"])


def _delay_host(events: list[dict], t0: float, delay: float) -> None:
    """Host events from t0 on move `delay` later; host ranges that span t0 grow by it."""
    for e in events:
        if e.get("cat") in DEVICE_CATS or e.get("cat") in ("cuda_sync", "gpu_user_annotation"):
            continue
        if e["ts"] >= t0:
            e["ts"] += delay
        elif e.get("ph") == "X" and e["ts"] + e.get("dur", 0) > t0:
            e["dur"] += delay


def _replay_device(events: list[dict], before: dict[int, float]) -> None:
    """Each device event starts at the earliest its stream and its (moved) launch allow, never earlier than it
    did: `before` holds each launch's old start, by correlation id. cuda_sync records follow their host call."""
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    stream_end: dict[tuple, float] = {}
    for e in sorted((e for e in events if e.get("cat") in DEVICE_CATS), key=lambda e: e["ts"]):
        corr, key = e["args"].get("correlation"), (e["pid"], e["args"].get("stream"))
        launch = launches.get(corr)
        if launch is not None and corr in before:
            latency = min(max(e["ts"] - before[corr], 0.0), 20.0)
            e["ts"] = max(e["ts"], launch["ts"] + latency, stream_end.get(key, e["ts"]))
        stream_end[key] = max(stream_end.get(key, 0.0), e["ts"] + e["dur"])
    for e in events:
        if e.get("cat") == "cuda_sync" and e["args"].get("correlation") in launches:
            call = launches[e["args"]["correlation"]]
            e["ts"] = call["ts"] + call["dur"] - e["dur"]


def _launch_starts(events: list[dict]) -> dict[int, float]:
    return {e["args"]["correlation"]: e["ts"] for e in events
            if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}


def plant(trace: dict, cause: str, fraction: float) -> dict:
    """`trace` (Kineto JSON) with `cause` added to each step (see the module's doc)."""
    events = trace["traceEvents"]
    correlation = max((e.get("args", {}).get("correlation", 0) for e in events), default=0) + 1_000_000
    for step in _steps(events):  # in time order: each plant sees the timeline the earlier ones made
        before = _launch_starts(events)
        pid, tid = step["pid"], step["tid"]
        if cause == "host_stall":
            t0, length = step["ts"] + 1, fraction * step["dur"]
            _delay_host(events, t0, length)
            events.append({"ph": "X", "cat": "cpu_op", "name": "planted::host_stall", "pid": pid, "tid": tid,
                           "ts": t0, "dur": length, "args": {}})
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
            _delay_host(events, t0, length)
            c_copy, c_sync = correlation, correlation + 1
            correlation += 2
            host = [("cpu_op", "aten::item", t0, length, {}),
                    ("cpu_op", "aten::_local_scalar_dense", t0 + 2, length - 4, {}),
                    ("cuda_runtime", "cudaMemcpyAsync", t0 + 4, 6, {"correlation": c_copy}),
                    ("cuda_runtime", "cudaStreamSynchronize", t0 + 12, length - 16, {"correlation": c_sync})]
            events += [{"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur,
                        "args": args} for cat, name, ts, dur, args in host]
            events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": device,
                           "tid": stream, "ts": copy_ts, "dur": 2,
                           "args": {"device": device, "stream": stream, "correlation": c_copy, "bytes": 4}})
            events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": device, "tid": stream,
                           "ts": t0 + length - 6, "dur": 2,
                           "args": {"cuda_sync_kind": "Stream Sync", "stream": stream, "correlation": c_sync,
                                    "device": device}})
            before[c_copy] = copy_ts  # its own start stays
        else:
            raise ValueError(f"unknown cause {cause!r} (known: {', '.join(CAUSES)})")
        _replay_device(events, before)
    return trace


def write(trace: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    return path


_CACHE: dict = {}


def evaluate(original: Path, cause: str, fraction: float, scratch: Path) -> dict:
    """Plant `cause` in `original`, run findings on both, and score the variant's top finding per step."""
    import tracesql
    from tracesql import findings

    name = original.name.split(".")[0]
    variant = write(plant(load(original), cause, fraction), scratch / "traces" / f"{name}-{cause}.json.gz")
    runs = {}
    for label, source in (("original", original), ("variant", variant)):
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
    rule, rows = CAUSES[cause], []
    for rank, span in spans["original"][0].items():
        steps = spans["original"][1].loc[rank]
        cost = (spans["variant"][0][rank] - span) / len(steps)  # per step: queued work may move it to the next
        mine = found["variant"][found["variant"]["rank"] == rank]
        tops = [mine[mine.step == s].iloc[0] if (mine.step == s).any() else None for s in steps.index]
        hits = [t is not None and t.finding == rule and (cause != "host_stall" or "planted::host_stall" in t.evidence)
                for t in tops]
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
    parser.add_argument("traces", nargs="*", type=Path, help="Kineto traces (default: the bundled and corpus ones)")
    parser.add_argument("--fraction", type=float, default=0.3, help="host stall length, × the step's (0.3)")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the docs)")
    args = parser.parse_args(argv)
    traces = [t for t in (args.traces or TRACES) if t.exists()]
    with tempfile.TemporaryDirectory() as tmp:
        results = [evaluate(t, cause, args.fraction, Path(tmp)) for t in traces for cause in CAUSES]
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
