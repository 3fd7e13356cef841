#!/usr/bin/env python3
"""DuckDB vs Spark: the curated query library on a multi-run fleet, and ingest of a fleet of trace files.

Queries: a fleet of --runs runs, each the same real trace ingested under its own run_id (default: HTA's
df_index_resolver, 216k events; without the corpus, the bundled hta_trace_filter), read as one dataset. Every
curated query runs with its defaults on DuckDB (tracesql.connect) and on Spark (tracesql.spark, one session,
master --master), --repeat times each; the best wall time (result fetched into Arrow) is reported, and the
results are checked equal. Spark's session start and view registration are reported apart.

Ingest: --files copies of a real Kineto trace, each with its own distributedInfo.rank, ingested into one run by
the process pool (tracesql ingest, one process per core) and by Spark tasks (--engine spark), both from scratch.

Usage:
    python benchmarks/bench_spark.py                  # 8 runs of df_index_resolver, 16 files, local[2]
    python benchmarks/bench_spark.py --runs 4 --files 8 --master spark://host:7077
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import tracesql  # noqa: E402
from tracesql import queries  # noqa: E402
from tracesql import spark as tsp  # noqa: E402

CORPUS = Path(os.environ.get("TRACESQL_CORPUS", REPO.parent / "shared" / "corpus"))
FLEET_TRACE = CORPUS / "hta" / "tests" / "data" / "df_index_resolver" / "df_index_resolver.json.gz"
FILE_TRACE = CORPUS / "hta" / "tests" / "data" / "nccl_parser_config" / "nccl_data.json.gz"
FALLBACK = REPO / "datasets" / "hta_trace_filter"
SCRATCH = Path("/tmp/tracesql-bench/spark")


def best(repeat: int, fn) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def bench_queries(args, spark) -> None:
    source = FLEET_TRACE if FLEET_TRACE.exists() else FALLBACK
    fleet = SCRATCH / "fleet"
    shutil.rmtree(fleet, ignore_errors=True)
    start = time.perf_counter()
    for i in range(args.runs):
        tracesql.ingest([source], fleet / f"run{i:02d}", run_id=f"run{i:02d}")
    rows = tracesql.connect(fleet).sql("SELECT count(*) FROM slices").fetchall()[0][0]
    print(f"fleet: {args.runs} runs of {source.name}, {rows:,} slices, "
          f"ingested in {time.perf_counter() - start:.1f} s\n")

    start = time.perf_counter()
    session = tsp.connect(fleet, spark=spark)
    print(f"Spark views and functions registered in {time.perf_counter() - start:.1f} s\n")
    print("| query | rows | DuckDB s | Spark s | Spark ÷ DuckDB |\n|---|---|---|---|---|")
    totals = [0.0, 0.0]
    for q in queries.catalogue():
        duck_s, duck = best(args.repeat, lambda: queries.run(tracesql.connect(fleet), q).to_arrow_table())
        spark_s, result = best(args.repeat, lambda: tsp.to_arrow(tsp.run(session, q)))
        same = result.num_rows == duck.num_rows and result.column_names == duck.column_names
        totals[0] += duck_s
        totals[1] += spark_s
        print(f"| `{q.name}` | {duck.num_rows:,}{'' if same else ' (differs!)'} | {duck_s:.2f} | {spark_s:.2f} | "
              f"{spark_s / duck_s:.0f}× |")
    print(f"| all 16 | | {totals[0]:.2f} | {totals[1]:.2f} | {totals[1] / totals[0]:.0f}× |\n")


def make_files(n: int) -> Path:
    """n copies of a real trace, copy i claiming rank i (so that they make one run of n ranks)."""
    folder = SCRATCH / "files"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    source = FILE_TRACE if FILE_TRACE.exists() else next(FALLBACK.glob("*.json*"))
    with gzip.open(source) if source.suffix == ".gz" else open(source, "rb") as f:
        trace = json.load(f)
    for i in range(n):
        trace["distributedInfo"] = {**trace.get("distributedInfo", {}), "rank": i, "world_size": n}
        with gzip.open(folder / f"rank-{i}.json.gz", "wt", compresslevel=1) as f:
            json.dump(trace, f)
    print(f"ingest: {n} copies of {source.name} ({source.stat().st_size / 1e6:.2f} MB gz each)\n")
    return folder


def bench_ingest(args, spark) -> None:
    folder = make_files(args.files)
    print("| ingest of the files into one run | s |\n|---|---|")
    for label, kwargs in (("process pool (tracesql ingest)", {}), ("Spark tasks (--engine spark)", {"spark": spark})):
        def once():
            out = SCRATCH / "ingested"
            shutil.rmtree(out, ignore_errors=True)
            return tracesql.ingest([folder], out, **kwargs)
        seconds, result = best(args.repeat, once)
        print(f"| {label}: {len(result.ingested)} files, {result.rows['slices']:,} slices | {seconds:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--master", default=None, help="Spark master (default: local[2])")
    args = parser.parse_args()
    start = time.perf_counter()
    spark = tsp.session(args.master)
    print(f"Spark {spark.version} session ({spark.sparkContext.master}) started in "
          f"{time.perf_counter() - start:.1f} s; {os.cpu_count()} CPUs\n")
    bench_queries(args, spark)
    bench_ingest(args, spark)


if __name__ == "__main__":
    main()
