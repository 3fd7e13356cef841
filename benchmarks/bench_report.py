#!/usr/bin/env python3
"""Report benchmark: `tracesql report` over a fleet of N runs × R ranks made of copies of a small bundled run.

The fleet is made by benchmarks/copies.py (run i: the source's tables with run_id and rank rewritten, i hours
later, its times stretched by 1 ± 1.5 %, by +12 % on every tenth run, so the report finds a trend and
regressions); it is reused when a fleet of the same shape is already in the scratch folder. Then, each in a
fresh process (interpreter start and imports included), measured with wait4 (CPU seconds, peak RSS):
  (a) `tracesql report` on one run of the fleet (R ranks): the baseline of this table, measured in the same run;
  (b) `tracesql report` on the whole fleet, with a baseline run and two gates (it writes the linked Perfetto
      traces too: the latest run's, the baseline's and the 10 most regressed runs' slowest steps);
  (c) `tracesql diff` of two runs of the fleet (the report runs one per regressed run, at most 20).
Targets (issue 15): (b) well under a minute at 100 runs × 8 ranks, under 5 minutes and bounded memory at 1,000.

Usage:
    python benchmarks/bench_report.py                                  # 100 runs × 8 ranks of hta_trace_filter
    python benchmarks/bench_report.py --runs 1000                      # 1,000 runs × 8 ranks
    python benchmarks/bench_report.py datasets/torch_gloo_2rank --runs 3 --ranks 3   # a smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

from bench_ingest import run_measured  # noqa: E402
import copies  # noqa: E402
from copies import make_fleet  # noqa: E402

DEFAULT_SOURCE = REPO / "datasets" / "hta_trace_filter"  # two sampled ranks of a 128-rank NCCL job (HTA's test data)


def fleet_for(source: Path, runs: int, ranks: int, scratch: Path) -> tuple[Path, float | None]:
    fleet = scratch / f"fleet-{source.name}-{runs}x{ranks}"
    marker = fleet / "fleet.json"
    if marker.exists() and json.loads(marker.read_text()) == copies.marker(source, runs, ranks, True):
        return fleet, None
    start = time.perf_counter()
    make_fleet(source, fleet, runs, ranks, scratch=scratch)
    return fleet, time.perf_counter() - start


def measured(cmd: list[str], log: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = run_measured(cmd, timeout=3600, mem_limit=0, log_path=str(log), env=env)
    if result["returncode"] not in (0, 3):  # 3: a gate failed, as intended
        sys.exit(f"{' '.join(cmd)} failed ({result['returncode']}):\n{log.read_text()[-3000:]}")
    result["cpu_s"] = result["user_s"] + result["sys_s"]
    return result


def bench(source: Path, runs: int, ranks: int, scratch: Path) -> tuple[list[tuple[str, dict]], dict]:
    """The fleet (made, or reused), then (a), (b) and (c), each measured in a fresh process: ([(name, measured)],
    (b)'s metrics.json)."""
    scratch.mkdir(parents=True, exist_ok=True)
    source = source.resolve()
    fleet, built = fleet_for(source, runs, ranks, scratch)
    files = sum(1 for _ in fleet.rglob("*.parquet"))
    print(f"fleet {fleet}: {runs} runs × {ranks} ranks of {source.name}, {files:,} Parquet files, "
          + (f"made in {built:.1f} s" if built is not None else "reused") + f" ({os.cpu_count()} CPUs)\n",
          flush=True)
    fleet_runs = sorted(p for p in fleet.iterdir() if p.is_dir())
    first, last = fleet_runs[0], fleet_runs[-1]
    tool = [sys.executable, "-m", "tracesql"]
    rows = [
        (f"(a) report over one run × {ranks} ranks",
         measured(tool + ["report", str(first), "-o", str(scratch / "report-one")], scratch / "a.log")),
        (f"(b) report over {runs} runs × {ranks} ranks",
         measured(tool + ["report", str(fleet), "-o", str(scratch / "report-fleet"), "--baseline", str(first),
                          "--fail-on", "step_time_p50>+5%", "--fail-on", "overlap<-10pp"], scratch / "b.log")),
        (f"(c) diff of two runs × {ranks} ranks",
         measured(tool + ["diff", str(first), str(last)], scratch / "c.log")),
    ]
    return rows, json.loads((scratch / "report-fleet" / "metrics.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", type=Path, default=DEFAULT_SOURCE,
                        help="a run folder or raw traces to copy (default: datasets/hta_trace_filter)")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/tracesql-bench/report"))
    args = parser.parse_args()
    rows, report = bench(args.source, args.runs, args.ranks, args.scratch)
    base_cpu = rows[0][1]["cpu_s"]
    print("| command | wall s | CPU s | peak RSS MiB | CPU ratio to (a) |\n|---|---:|---:|---:|---:|")
    for name, r in rows:
        print(f"| {name} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['rss_mb']:.0f} | {r['cpu_s'] / base_cpu:.1f} |")
    print(f"\n(b) found {len(report['regressions'])} regressed runs and wrote {len(report['traces'])} Perfetto traces; "
          f"per run: {rows[1][1]['cpu_s'] / args.runs:.3f} CPU s")


if __name__ == "__main__":
    main()
