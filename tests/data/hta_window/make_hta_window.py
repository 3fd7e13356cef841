#!/usr/bin/env python3
"""Crafted Kineto traces with device work whose launch was not captured, and HTA 0.5.0's own numbers on them.

tests/test_steps.py checks that analysis_window = 'hta' gives HTA's temporal_breakdown and overlap on these traces.
Regenerate (needs `pip install HolisticTraceAnalysis==0.5.0`, which this script imports; tracesql does not):

    python tests/data/hta_window/make_hta_window.py

writes <case>/rank<N>.json per trace set and expected.json with what HTA printed: per case and rank,
get_temporal_breakdown's idle/compute/non-compute/kernel time (µs) and get_comm_comp_overlap's percentage.

The cases (all times in µs; every launch is a cudaLaunchKernel on the host thread, every kernel on device 0):
  one_step        one ProfilerStep per rank (HTA filters nothing): launched GEMMs and an NCCL kernel, kernels with
                  no correlation id before, inside and after the step, and a kernel whose correlation id has no
                  launch in the trace.
  several_steps   three ProfilerSteps: HTA keeps device work launched before the last one began, and kernels with
                  no correlation id that start before it; a kernel with an unmatched correlation id is dropped.
  ranks_disagree  two ranks, one step each but different step numbers: two step names in the trace set, so HTA
                  filters each rank by its own (only) step's start: only work launched before it stays.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def step(n, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur, "pid": 1,
            "tid": 1}


def launch(corr, ts):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 3, "pid": 1, "tid": 1,
            "args": {"correlation": corr}}


def kernel(name, ts, dur, stream=7, corr=None):
    args = {"device": 0, "stream": stream}
    if corr is not None:
        args["correlation"] = corr
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream, "args": args}


def launched(corr, launch_ts, name, ts, dur, stream=7):
    return [launch(corr, launch_ts), kernel(name, ts, dur, stream, corr)]


def trace(rank: int, events: list[dict]) -> dict:
    return {"schemaVersion": 1, "distributedInfo": {"rank": rank, "world_size": 2, "backend": "nccl"},
            "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}], "traceEvents": events}


def one_step() -> dict[int, list[dict]]:
    events = [step(1, 100, 400),
              kernel("gemm_unlaunched_before", 20, 30),             # before the step, no correlation
              *launched(1, 110, "gemm_a", 130, 50),
              *launched(2, 120, "ncclKernel_AllReduce", 150, 120, stream=20),
              kernel("gemm_unlaunched_inside", 200, 40, stream=8),  # inside the step, no correlation
              *launched(3, 300, "gemm_b", 320, 60),
              kernel("gemm_unmatched", 400, 20, corr=99),          # a correlation id no launch has
              kernel("gemm_unlaunched_after", 600, 25, stream=8)]  # after the step
    return {0: events}


def several_steps() -> dict[int, list[dict]]:
    events = [step(1, 100, 200), step(2, 300, 200), step(3, 500, 200),
              kernel("gemm_unlaunched_early", 50, 20, stream=8),
              *launched(1, 110, "gemm_s1", 140, 80),
              *launched(2, 150, "ncclKernel_AllReduce", 160, 100, stream=20),
              kernel("gemm_unlaunched_s1", 250, 30, stream=8),
              *launched(3, 310, "gemm_s2", 330, 90),
              kernel("gemm_unmatched", 420, 10, corr=77),
              *launched(4, 480, "gemm_s2_late", 520, 60),          # launched in step 2, runs in step 3
              kernel("gemm_unlaunched_s2_late", 490, 15, stream=8),  # starts before the last step began
              kernel("gemm_unlaunched_s3", 560, 30, stream=8),      # starts after it
              *launched(5, 510, "gemm_s3", 600, 50),
              *launched(6, 520, "ncclKernel_AllGather", 610, 70, stream=20)]
    return {0: events}


def ranks_disagree() -> dict[int, list[dict]]:
    out = {}
    for rank, n in ((0, 4), (1, 5)):
        out[rank] = [step(n, 100, 300),
                     *launched(1, 50, "gemm_before_step", 60, 30),
                     kernel("gemm_unlaunched_early", 40, 10, stream=8),
                     *launched(2, 120, "gemm_in_step", 140, 100 + 20 * rank),
                     *launched(3, 130, "ncclKernel_AllReduce", 150, 80, stream=20),
                     kernel("gemm_unlaunched_late", 200, 30, stream=8)]
    return out


CASES = {"one_step": one_step, "several_steps": several_steps, "ranks_disagree": ranks_disagree}


def write() -> None:
    for case, make in CASES.items():
        folder = HERE / case
        folder.mkdir(exist_ok=True)
        for old in folder.glob("*.json"):
            old.unlink()
        for rank, events in make().items():
            (folder / f"rank{rank}.json").write_text(json.dumps(trace(rank, events), indent=0) + "\n")


def run_hta() -> dict:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    expected = {}
    for case in CASES:
        analyzer = TraceAnalysis(trace_dir=str(HERE / case))
        temporal = analyzer.get_temporal_breakdown(visualize=False).set_index("rank")
        overlap = analyzer.get_comm_comp_overlap(visualize=False).set_index("rank")
        expected[case] = {
            str(rank): {
                "idle_time_us": float(row["idle_time(us)"]), "compute_time_us": float(row["compute_time(us)"]),
                "non_compute_time_us": float(row["non_compute_time(us)"]),
                "kernel_time_us": float(row["kernel_time(us)"]),
                "comp_comm_overlap_pctg": (None if overlap.loc[rank, "comp_comm_overlap_pctg"] !=
                                           overlap.loc[rank, "comp_comm_overlap_pctg"]
                                           else float(overlap.loc[rank, "comp_comm_overlap_pctg"])),
            }
            for rank, row in temporal.iterrows()
        }
    import hta
    return {"hta_version": getattr(hta, "__version__", "0.5.0"), "cases": expected}


if __name__ == "__main__":
    write()
    result = run_hta()
    (HERE / "expected.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    json.dump(result, sys.stdout, indent=1)
