#!/usr/bin/env python3
"""Report benchmark: `tracesql report` over a fleet of N runs × R ranks built from copies of real runs.

Each source trace folder (default: corpus runs, cycled) is ingested once; run i of the fleet is a copy of source
i mod len(sources), its ranks copies of the source's ranks (rank r from source rank r mod ranks), with `run_id` and
`rank` rewritten in every table (DuckDB COPY, Parquet parts in the run layout, a manifest and init.sql), so the fleet
is a folder of ordinary runs. Then, each in a fresh process (interpreter start and imports included), best of
--repeat:
  (a) `tracesql report` on one run of the fleet (R ranks): the baseline;
  (b) `tracesql report` on the whole fleet, with a baseline run and two gates;
  (c) `tracesql diff` of two runs of the fleet (the report runs one per regressed run, at most 20).
The target: (b) under a minute on the 2-core development machine, once ingested. Scratch goes to
/tmp/tracesql-bench/report/.

Usage:
    python benchmarks/bench_report.py                       # 100 runs × 8 ranks from corpus runs
    python benchmarks/bench_report.py --runs 20 --ranks 4 datasets/hta_trace_filter
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb

import tracesql
from tracesql import engine, schema, store

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TRACESQL_CORPUS", REPO.parent / "shared" / "corpus")) / "hta" / "tests" / "data"
DEFAULT_SOURCES = [CORPUS / "trace_filter"]  # two sampled ranks of a 128-rank NCCL job (HTA's test data)


def build_fleet(sources: list[Path], runs: int, ranks: int, scratch: Path) -> Path:
    ingested = []
    for src in sources:
        run = scratch / "sources" / src.name
        tracesql.ingest([src], run)
        manifest = store.load_manifest(run)
        # a source file may hold several ranks (one part each): the fleet's ranks cycle over all of them
        parts = sorted((rank, part, entry) for entry in manifest["sources"].values()
                       for rank, part in zip(entry["ranks"], entry["parts"]))
        ingested.append((run, parts))
    fleet = scratch / f"fleet-{runs}x{ranks}"
    shutil.rmtree(fleet, ignore_errors=True)
    fleet.mkdir(parents=True)
    con = duckdb.connect()
    for i in range(runs):
        run_id = f"run-{i:03d}"
        source, parts = ingested[i % len(ingested)]
        staging = store.new_staging(fleet / run_id)
        entries = {}
        for rank in range(ranks):
            source_rank, source_part, entry = parts[rank % len(parts)]
            part = store.part_name(rank, f"copy{rank:05d}")
            for table in schema.TABLES:
                (staging / table).mkdir(exist_ok=True)
                con.execute(f"COPY (SELECT * REPLACE ('{run_id}' AS run_id, {rank}::INTEGER AS rank) "
                            f"FROM read_parquet('{source / table / source_part}') WHERE rank = {source_rank}) "
                            f"TO '{staging / table / part}' (FORMAT parquet, COMPRESSION zstd)")
            entries[f"rank-{rank}.json.gz"] = {**entry, "ranks": [rank], "parts": [part]}
        store.publish(staging, fleet / run_id, {"run_id": run_id, "sources": entries, "warnings": []},
                      engine.init_sql())
    return fleet


def timed(cmd: list[str], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        if done.returncode not in (0, 3):
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sources", nargs="*", type=Path, default=DEFAULT_SOURCES)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/tracesql-bench/report"))
    args = parser.parse_args()

    start = time.perf_counter()
    fleet = build_fleet(args.sources, args.runs, args.ranks, args.scratch)
    con = tracesql.connect(fleet)
    slices, kernels = con.sql("SELECT count(*), count(*) FILTER (WHERE kind = 'kernel') FROM slices").fetchall()[0]
    print(f"fleet {fleet}: {args.runs} runs × {args.ranks} ranks from {', '.join(s.name for s in args.sources)}; "
          f"{slices:,} slices ({kernels:,} kernels); built in {time.perf_counter() - start:.1f} s "
          f"({os.cpu_count()} CPUs)\n")
    tool = [sys.executable, "-m", "tracesql", "report", "--order", "given"]
    one = timed(tool + [str(fleet / "run-000"), "-o", str(args.scratch / "report-one")], args.repeat)
    many = timed(tool + [str(fleet), "-o", str(args.scratch / "report-fleet"), "--baseline", str(fleet / "run-000"),
                         "--fail-on", "step_time_p50>+5%", "--fail-on", "overlap<-10pp"], args.repeat)
    diff = timed([sys.executable, "-m", "tracesql", "diff", str(fleet / "run-000"), str(fleet / f"run-{args.runs - 1:03d}")],
                 args.repeat)
    print(f"| command | seconds (best of {args.repeat}) | ratio to (a) |\n|---|---|---|")
    print(f"| (a) report over one run × {args.ranks} ranks | {one:.2f} | 1.0 |")
    print(f"| (b) report over {args.runs} runs × {args.ranks} ranks | {many:.2f} | {many / one:.1f} |")
    print(f"| (c) diff of two runs × {args.ranks} ranks | {diff:.2f} | {diff / one:.2f} |")


if __name__ == "__main__":
    main()
