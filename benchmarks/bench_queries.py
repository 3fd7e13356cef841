#!/usr/bin/env python3
"""Query benchmark: the wall time of every curated query on one ingested run, as a Markdown table.

The trace (default: HTA's df_index_resolver, rank 1 of 2: 216k events, 2,020 NCCL all-reduces) is ingested once
into a scratch run under /tmp/tracesql-bench/; each query then runs --repeat times on a fresh connection, with its
default parameters (and the extra variants below, which take other code paths), and the best time is reported.
The target is under 1 s per query.

Usage:
    python benchmarks/bench_queries.py                          # df_index_resolver from ../shared/corpus
    python benchmarks/bench_queries.py path/to/traces --repeat 5
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import tracesql
from tracesql import queries

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TRACESQL_CORPUS", REPO.parent / "shared" / "corpus"))
DEFAULT_TRACE = CORPUS / "hta" / "tests" / "data" / "df_index_resolver"
HTA = {"class_scheme": "hta", "analysis_window": "hta", "time_unit_ns": 1000}
# parameter sets that take another path through a query than its defaults
VARIANTS = {
    "overlap": [{"per": "step"}, {"per": "process_group"}, HTA],
    "temporal_breakdown": [{"per": "step"}, HTA],
    "bubbles": [{"scope": "device"}, HTA],
    "hotspots": [{"levels": "kernel_family,op_args"}],
}


def best_of(repeat: int, run, query, params) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(repeat):
        con = tracesql.connect(run)
        start = time.perf_counter()
        rows = len(queries.run(con, query, params).fetchall())
        times.append(time.perf_counter() - start)
        con.close()
    return min(times), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("/tmp/tracesql-bench/query-run"))
    args = parser.parse_args()

    start = time.perf_counter()
    tracesql.ingest([args.trace], args.out)
    print(f"ingested {args.trace} in {time.perf_counter() - start:.2f} s ({os.cpu_count()} CPUs)\n")
    print("| query | parameters | rows | best of {} (s) |\n|---|---|---|---|".format(args.repeat))
    for query in queries.catalogue():
        for params in [{}] + VARIANTS.get(query.name, []):
            seconds, rows = best_of(args.repeat, args.out, query, params)
            shown = ", ".join(f"{k}={v}" for k, v in params.items()) or "defaults"
            print(f"| `{query.name}` | {shown} | {rows} | {seconds:.3f} |", flush=True)


if __name__ == "__main__":
    main()
