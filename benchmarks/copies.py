#!/usr/bin/env python3
"""A fleet of N runs × R ranks made from copies of one small ingested run, for the report benchmark.

Run i is a copy of the source run with every table's `run_id` and `rank` rewritten (rank r copies source rank
r mod the source's ranks), written in the run layout (one Parquet part per rank and table, a manifest, init.sql),
so the fleet is a folder of ordinary runs that `tracesql report` reads as it reads ingested ones. With --vary
(default), run i is moved i hours later and its times stretched by a factor: 1 ± 1.5 % (deterministic noise),
and +12 % for every tenth run (i mod 10 = 7), so the report has a trend and regressions to find; each rank 0–1 %
more, one straggler rank +6 % (the heatmaps show it); absolute times
(ts, *_ts, trace_start/end) are stretched around the source's first timestamp, durations (dur, *_dur, *_ns
sums) scaled, everything else kept.

    python benchmarks/copies.py datasets/hta_trace_filter /tmp/fleet --runs 100 --ranks 8

The source may be a run folder or raw traces (ingested first). Tables are read once with pyarrow and each part
written directly (no SQL per file), runs spread over one process per core.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tracesql import engine, schema, store  # noqa: E402

ABSOLUTE = {"ts", "cpu_ts", "device_ts", "trace_start_ns", "trace_end_ns"}
DURATIONS = {"dur", "self_dur", "cpu_dur", "device_dur", "kernel_dur", "device_self_ns", "device_total_ns"}


def factor(i: int, vary: bool, rank: int = 0, ranks: int = 1) -> float:
    """The stretch of run i's rank: deterministic noise of ±1.5 % per run, +12 % on every tenth run (i mod 10 =
    7); per rank 0–1 % more, and one straggler rank (two thirds down the ranks) +6 %."""
    if not vary:
        return 1.0
    noise = ((i * 7919) % 31 - 15) / 1000  # -1.5 % .. +1.5 %
    per_rank = ((rank * 2654435761) % 101) / 10000 + (0.06 if ranks > 1 and rank == ranks * 2 // 3 else 0.0)
    return 1.0 + noise + (0.12 if i % 10 == 7 else 0.0) + per_rank


def source_parts(source: Path, scratch: Path) -> tuple[Path, list[tuple[int, str]], dict]:
    """The source run (ingested into scratch if raw traces), its (rank, part) pairs and its manifest."""
    runs = engine.resolve(source) if store.is_run(source) else None
    if runs is None:
        import tracesql

        run = scratch / f"source-{source.name.split('.')[0]}"
        tracesql.ingest([source], run)
        runs = [run]
    run = runs[0]
    manifest = store.load_manifest(run)
    parts = sorted((rank, part) for entry in manifest["sources"].values()
                   for rank, part in zip(entry["ranks"], entry["parts"]))
    return run, parts, manifest


def _retimed(table: pa.Table, run_id: str, rank: int, t0: int, f: float, shift: int) -> pa.Table:
    columns = []
    for name in table.column_names:
        col = table.column(name)
        if name == "run_id":
            col = pa.array([run_id] * len(table), col.type)
        elif name == "rank":
            col = pa.array([rank] * len(table), col.type)
        elif f != 1.0 and name in DURATIONS:
            col = pc.cast(pc.round(pc.multiply(pc.cast(col, pa.float64()), f)), col.type)
        elif name in ABSOLUTE and (f != 1.0 or shift):
            rel = pc.cast(pc.subtract(pc.cast(col, pa.int64()), t0), pa.float64())  # ns from the source's start
            col = pc.cast(pc.add(pc.cast(pc.round(pc.multiply(rel, f)), pa.int64()), t0 + shift), col.type)
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=table.schema)


def _write_runs(run: Path, parts: list, entries: dict, out: Path, ids: list[int], ranks: int, vary: bool) -> None:
    tables = {(table, rank): pq.read_table(run / table / part) for rank, part in parts for table in schema.TABLES
              if (run / table / part).exists()}
    # the tables written once per run (runs, op_costs): one file each, its rows copied for every run (and rank)
    whole = {table: pq.read_table(files[0]) for table in schema.RUN_TABLES
             if (files := sorted((run / table).glob("run-*.parquet")))}
    bounds = [(pc.min(t.column("trace_start_ns")).as_py(), pc.max(t.column("trace_end_ns")).as_py())
              for (name, _), t in tables.items() if name == "ranks"]
    t0 = min(a for a, _ in bounds)
    span = max(b for _, b in bounds) - t0
    init = engine.init_sql()
    hour = 3600 * 10**9
    for i in ids:
        run_id = f"run-{i:04d}"
        staging = store.new_staging(out / run_id)
        shift = i * max(hour, 2 * span)
        sources = {}
        for rank in range(ranks):
            f = factor(i, vary, rank, ranks)
            source_rank, source_part = parts[rank % len(parts)]
            part = store.part_name(rank, f"copy{rank:05d}")
            for table in schema.TABLES:
                data = tables.get((table, source_rank))
                if data is None:
                    continue
                (staging / table).mkdir(exist_ok=True)
                pq.write_table(_retimed(data, run_id, rank, t0, f, shift), staging / table / part,
                               compression="zstd")
            sources[f"rank-{rank}.json.gz"] = {**entries[source_rank], "ranks": [rank], "parts": [part]}
        for table, data in whole.items():
            if "rank" in data.column_names:
                copied = pa.concat_tables(
                    _retimed(data.filter(pc.equal(data.column("rank"), parts[rank % len(parts)][0])), run_id, rank,
                             t0, factor(i, vary, rank, ranks), shift) for rank in range(ranks))
            else:
                copied = _retimed(data, run_id, 0, t0, factor(i, vary), shift)
            (staging / table).mkdir(exist_ok=True)
            pq.write_table(copied, staging / table / f"run-{store.generation(staging)}.parquet", compression="zstd")
        store.publish(staging, out / run_id, {"run_id": run_id, "sources": sources, "warnings": []}, init)


def marker(source: Path, runs: int, ranks: int, vary: bool) -> dict:
    """What fleet.json records: a fleet is reused only when all of it (the schema version included) matches."""
    return {"source": str(source), "runs": runs, "ranks": ranks, "vary": vary, "schema_version": schema.SCHEMA_VERSION}


def make_fleet(source: Path, out: Path, runs: int, ranks: int, *, vary: bool = True,
               scratch: Path | None = None, jobs: int | None = None) -> Path:
    """Write `runs` runs of `ranks` ranks into `out` (replaced), in `jobs` processes (default: one per core)."""
    scratch = scratch or out.parent
    run, parts, manifest = source_parts(source, scratch)
    entries = {e_rank: entry for entry in manifest["sources"].values() for e_rank in entry["ranks"]}
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    jobs = max(1, min(jobs or os.cpu_count() or 1, runs))
    chunks = [list(range(k, runs, jobs)) for k in range(jobs)]
    if jobs == 1:
        _write_runs(run, parts, entries, out, chunks[0], ranks, vary)
    else:
        with ProcessPoolExecutor(jobs) as pool:
            for done in [pool.submit(_write_runs, run, parts, entries, out, c, ranks, vary) for c in chunks]:
                done.result()
    (out / "fleet.json").write_text(json.dumps(marker(source, runs, ranks, vary)) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="a run folder, or raw traces (ingested first)")
    parser.add_argument("out", type=Path)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("-j", "--jobs", type=int, help="processes (default: one per core)")
    parser.add_argument("--no-vary", dest="vary", action="store_false", help="exact copies (no time stretch)")
    args = parser.parse_args()
    start = time.perf_counter()
    make_fleet(args.source, args.out, args.runs, args.ranks, vary=args.vary, jobs=args.jobs)
    files = sum(1 for _ in args.out.rglob("*.parquet"))
    print(f"{args.out}: {args.runs} runs × {args.ranks} ranks from {args.source}, {files:,} Parquet files, "
          f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
