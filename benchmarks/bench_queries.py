#!/usr/bin/env python3
"""Query benchmark: every curated query (and the parameter variants that take other paths) on runs of 1×, 6×
and 24× a real trace, with each query's growth exponent.

Each trace is tiled k times (benchmarks/tile_trace.py: copies one after another in time, ids made unique) for k in
--tiles, and each tile ingested once into a scratch run under --scratch. Each query then runs --repeat times on a
fresh connection (in this process: no interpreter start), the best time kept. `slope` is the exponent b of
time ∝ events^b between the smallest and the largest tile: 1 is linear, 2 quadratic (a query that is still at its
fixed cost shows less than 1). The targets (issue 15): under 1 s on the largest tile, and no slope well above 1.

Default traces: HTA's df_index_resolver (216k events, NCCL all-reduces, no shapes) from the corpus, and TraceLens's
B200 eager trace (bundled: recorded with shapes, so op_costs' ops-within-ops join, mfu and roofline have work).

Usage:
    python benchmarks/bench_queries.py                              # 1×, 6×, 24× of the two default traces
    python benchmarks/bench_queries.py some/trace.json.gz --tiles 1,4 --repeat 1
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import tracesql
from tracesql import queries

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tile_trace import tile  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TRACESQL_CORPUS", REPO.parent / "shared" / "corpus"))
DEFAULT_TRACES = [CORPUS / "hta/tests/data/df_index_resolver/df_index_resolver.json.gz",
                  REPO / "datasets/tracelens_b200_eager/eager_trace.json.gz"]
HTA = {"class_scheme": "hta", "analysis_window": "hta", "time_unit_ns": 1000}
# parameter sets that take another path through a query than its defaults
VARIANTS = {
    "overlap": [{"per": "step"}, {"per": "process_group"}, HTA],
    "temporal_breakdown": [{"per": "step"}, HTA],
    "bubbles": [{"scope": "device"}, HTA],
    "hotspots": [{"levels": "kernel_family,op_args"}, {"levels": "op", "inclusive": "true"}],
    "mfu": [{"device": "H100-SXM", "params": 1e9, "tokens_per_step": 4096}],
    "roofline": [{"device": "H100-SXM"}],
}


def variants(query) -> list[dict]:
    """The defaults and the variants whose parameters this version of the query declares."""
    return [{}] + [v for v in VARIANTS.get(query.name, []) if set(v) <= set(query.params)]


def best_of(repeat: int, run: Path, query, params: dict) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(repeat):
        con = tracesql.connect(run)
        start = time.perf_counter()
        rows = len(queries.run(con, query, params).fetchall())
        times.append(time.perf_counter() - start)
        con.close()
    return min(times), rows


def tiled_runs(trace: Path, tiles: list[int], scratch: Path) -> list[tuple[int, Path, int]]:
    """(copies, run folder, slices) per tile of `trace`, ingested once (kept between benchmark runs)."""
    out = []
    for k in tiles:
        name = trace.name.split(".")[0]
        tiled = scratch / f"{name}-x{k}.json"
        run = scratch / f"{name}-x{k}-run"
        if not tiled.exists():
            tile(str(trace), str(tiled), math.inf, max_copies=k, quiet=True)
        start = time.perf_counter()
        result = tracesql.ingest([tiled], run)
        note = f"ingested in {time.perf_counter() - start:.1f} s" if result.changed else "already ingested"
        slices = tracesql.connect(run).sql("SELECT count(*) FROM slices").fetchall()[0][0]
        print(f"{name} ×{k}: {slices:,} slices, {note}", flush=True)
        out.append((k, run, slices))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path, default=DEFAULT_TRACES)
    parser.add_argument("--tiles", default="1,6,24", help="copies per tile, comma-separated (default 1,6,24)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", help="comma-separated query names (default: all)")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/tracesql-bench/queries"))
    args = parser.parse_args()
    tiles = sorted(int(k) for k in args.tiles.split(","))
    args.scratch.mkdir(parents=True, exist_ok=True)
    catalogue = [q for q in queries.catalogue() if not args.only or q.name in args.only.split(",")]

    print(f"{os.cpu_count()} CPUs; best of {args.repeat}, in-process, seconds\n")
    for trace in args.traces:
        runs = tiled_runs(trace, tiles, args.scratch)
        growth = math.log(runs[-1][2] / runs[0][2]) if len(runs) > 1 and runs[-1][2] > runs[0][2] else 0
        print(f"\n| query | parameters | rows ×{tiles[0]} | " + " | ".join(f"×{k} (s)" for k in tiles)
              + " | slope |\n|---|---|---|" + "---|" * len(tiles) + "---|")
        for query in catalogue:
            for params in variants(query):
                timings = [best_of(args.repeat, run, query, params) for _, run, _ in runs]
                seconds = [t for t, _ in timings]
                slope = f"{math.log(max(seconds[-1], 1e-4) / max(seconds[0], 1e-4)) / growth:.2f}" if growth else "–"
                shown = ", ".join(f"{k}={v}" for k, v in params.items()) or "defaults"
                print(f"| `{query.name}` | {shown} | {timings[0][1]} | " + " | ".join(f"{t:.3f}" for t in seconds)
                      + f" | {slope} |", flush=True)


if __name__ == "__main__":
    main()
