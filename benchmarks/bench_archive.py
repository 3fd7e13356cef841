#!/usr/bin/env python3
"""An archive of many tiny traces (issue 26, item 8): what CI keeps of a 1,024-rank job, one small Kineto trace per
rank in one zip. Times `tracesql ingest ZIP` in a fresh process and prints wall and CPU seconds (the process and
its workers), in all and per member, the peak RSS of its largest process, and the number of slices the run holds
(one kernel and three ops a member).

The target is 60 s for 5,000 members. By default the members are synthetic (four events each, rank in
`distributedInfo`), since what is measured is the cost each member carries, not the events; `--trace` makes them
copies of a real Kineto trace instead (its rank in `distributedInfo` and its process ids changed per member), e.g.
the 75-event ranks of datasets/torch_mesh_dp2_tp2, whose collectives, process groups and steps take every query.

Usage:
    python benchmarks/bench_archive.py                      # 5,000 members, every core
    python benchmarks/bench_archive.py --members 200 --jobs 1
    python benchmarks/bench_archive.py --members 500 --trace datasets/torch_mesh_dp2_tp2/rank-0.pt.trace.json.gz
    PYTHONPATH=/path/to/other/checkout python benchmarks/bench_archive.py ...   # that checkout's tracesql
    python benchmarks/bench_archive.py --members 100 --stages   # then where each member's CPU goes
    python benchmarks/bench_archive.py --members 2000 --merged   # one pass over every member's events

`--merged` ingests one trace holding every member's events instead (their process ids and correlation ids made
distinct per member), as one rank: what one reader pass and one normalize pass over all the members' events cost,
the floor that ingesting members in batches could reach (issue 26, item 8). Its tables are not the archive's (one
rank, not one per member): it measures the cost, not the answer.

`--stages` then ingests the zip again in this process (one job, after a warm-up ingest, as a worker is warm) and
prints the CPU seconds a member costs in each stage (the reader, normalize, the Parquet writes, what is done once
per run), and how many DuckDB statements a member runs: what batching members would have to share.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import gzip
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 60.0


def tiny_trace(rank: int, world: int) -> bytes:
    """Three CPU ops and one kernel, on rank `rank` of `world`."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1000 + 10 * i, "dur": 5,
               "args": {}} for i in range(3)]
    events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1002, "dur": 3,
                   "args": {"device": 0, "stream": 7, "correlation": 1}})
    return json.dumps({"distributedInfo": {"rank": rank, "world_size": world}, "traceEvents": events}).encode()


def copy_of(trace: dict, rank: int, world: int) -> bytes:
    """`trace` (a Kineto trace's JSON) as rank `rank` of `world`: its rank, world size and process ids changed."""
    events = [{**e, "pid": e["pid"] + rank * 100_000} if isinstance(e.get("pid"), int) else e
              for e in trace["traceEvents"]]
    info = {**trace.get("distributedInfo", {}), "rank": rank, "world_size": world}
    return json.dumps({**trace, "distributedInfo": info, "traceEvents": events}).encode()


def merged_trace(path: Path, members: int, trace: Path | None = None) -> Path:
    """One trace holding the events of `members` members (tiny_trace's, or copies of the Kineto trace `trace`),
    member k's process ids and correlation ids moved by k * 100,000 and k * 10,000,000 (kept apart)."""
    doc = _load(trace) if trace is not None else json.loads(tiny_trace(0, 1))
    events = []
    for k in range(members):
        for e in doc["traceEvents"]:
            args = e.get("args")
            if isinstance(args, dict) and isinstance(args.get("correlation"), int):
                e = {**e, "args": {**args, "correlation": args["correlation"] + k * 10_000_000}}
            events.append({**e, "pid": e["pid"] + k * 100_000} if isinstance(e.get("pid"), int) else e)
    path.write_text(json.dumps({**doc, "traceEvents": events}))
    return path


def _load(trace: Path) -> dict:
    with (gzip.open if trace.name.endswith(".gz") else open)(trace, "rb") as f:
        return json.load(f)


def make_zip(path: Path, members: int, trace: Path | None = None) -> Path:
    """A zip of `members` traces (tiny_trace's, or copies of the Kineto trace `trace`), one per rank."""
    if trace is not None:
        doc = _load(trace)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for rank in range(members):
            z.writestr(f"job/rank-{rank}.pt.trace.json",
                       tiny_trace(rank, members) if trace is None else copy_of(doc, rank, members))
    return path


def stages(archive: Path, members: int, scratch: Path) -> None:
    """Ingest `archive` in this process (one job, warm) with each stage's CPU time taken, and print a table of
    them per member, with the DuckDB statements the in-memory connections ran (DuckDB's query log)."""
    import tracesql
    from tracesql import archives, db, ingestion, readers, store
    from tracesql import normalize as normalize_module

    tracesql.ingest([make_zip(scratch / "warm-up.zip", 2)], scratch / "warm-up", jobs=1)  # the imports, the macros
    cpu: collections.Counter = collections.Counter()
    inside: list[str] = []  # the stages being timed, innermost last: a stage's CPU is its own, less the inner ones'
    wrapped = {"unpack the members": [(archives, "members"), (archives, "extract")],
               "read (Kineto reader)": [(readers, "read_trace"), (readers, "read_batch")],
               "normalize (less its writes)": [(normalize_module, "normalize"), (normalize_module, "normalize_batch")],
               "write the parts (and the queries streamed into them)": [
                   (store.PartWriter, "write"), (store.PartWriter, "__exit__"), (store.BatchWriter, "write"),
                   (store.BatchWriter, "__exit__")],
               "run-wide tables": [(ingestion, "_write_run_checks"), (ingestion, "_write_run_labels"),
                                   (ingestion, "_write_op_costs")],
               "publish (hashes, manifest, swap)": [(store, "publish")]}

    def timed(stage: str, f):
        @functools.wraps(f)
        def call(*args, **kwargs):
            t = time.process_time()  # (the process's: DuckDB's threads too)
            inside.append(stage)
            try:
                return f(*args, **kwargs)
            finally:
                inside.pop()
                spent = time.process_time() - t
                cpu[stage] += spent
                if inside:
                    cpu[inside[-1]] -= spent
        return call

    for stage, functions in wrapped.items():
        for owner, name in functions:
            if hasattr(owner, name):  # (an older checkout, measured for comparison, may lack one)
                setattr(owner, name, timed(stage, getattr(owner, name)))
    logged = []
    connect = db.connect

    def logging_connect(threads=None, memory_limit=None, database=None):
        con = connect(threads, memory_limit, database)
        con.execute("CALL enable_logging('QueryLog')")
        logged.append(con)
        return con

    db.connect = logging_connect
    db._kept.clear()  # (connections kept by the warm-up: new ones, logged)
    t0 = time.process_time()
    tracesql.ingest([archive], scratch / "run-in-process", jobs=1)
    total = time.process_time() - t0
    cpu["the rest"] = total - sum(cpu.values())
    statements = sum(map(_statements, logged))
    print(f"\nIn one warm process, one job: {total:.1f} CPU s, {total / members * 1000:.0f} ms a member; "
          f"{statements / members:.0f} DuckDB statements a member")
    print("| stage | CPU ms / member | share |")
    print("|---|---|---|")
    for stage, seconds in cpu.items():
        print(f"| {stage} | {seconds / members * 1000:.1f} | {seconds / total:.0%} |")


def _statements(con) -> int:
    """The statements DuckDB logged on `con` (0 when it is closed: the run-wide tables' connections, not a
    member's)."""
    import duckdb

    try:
        return con.execute("SELECT count(*) FROM duckdb_logs WHERE type = 'QueryLog'").fetchone()[0]
    except duckdb.ConnectionException:
        return 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--members", type=int, default=5000, help="traces in the zip (default 5,000)")
    p.add_argument("--jobs", type=int, help="ingest's --jobs (default: every core)")
    p.add_argument("--trace", type=Path, help="a Kineto trace whose copies are the members (default: synthetic)")
    p.add_argument("--scratch", type=Path, help="folder for the zip and the run (default: a temporary one)")
    p.add_argument("--merged", action="store_true",
                   help="ingest one trace of every member's events instead (one rank: the floor; see above)")
    p.add_argument("--stages", action="store_true", help="then the CPU a member costs in each stage (see above)")
    args = p.parse_args()
    if args.merged and args.stages:
        p.error("--stages measures the archive's members; --merged ingests no archive")
    with tempfile.TemporaryDirectory(prefix="tracesql-bench-") as tmp:
        scratch = (args.scratch or Path(tmp)).resolve()
        scratch.mkdir(parents=True, exist_ok=True)
        archive = (merged_trace(scratch / "merged.json", args.members, args.trace) if args.merged
                   else make_zip(scratch / "artifact.zip", args.members, args.trace))
        run = scratch / "run"
        code = os.environ.get("PYTHONPATH") or str(REPO)  # the tracesql measured (another checkout's: compare)
        cmd = [sys.executable, "-m", "tracesql", "ingest", str(archive), "-o", str(run), "-q",
               *(["-j", str(args.jobs)] if args.jobs else [])]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        # (in the scratch folder: `python -m` puts the working directory first on the path, so run in a checkout
        # it would measure that checkout's tracesql, not PYTHONPATH's)
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": code}, cwd=scratch)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        peak_mb = after.ru_maxrss / 1024  # (Linux: KiB) the largest process's peak: the CLI's or a worker's
        sys.path.insert(0, code)
        import tracesql

        slices = tracesql.connect(run).execute("SELECT count(*) FROM slices").fetchone()[0]
        if args.stages:
            breakdown = io.StringIO()
            with contextlib.redirect_stdout(breakdown):
                stages(archive, args.members, scratch)
    n = args.members
    target = ("met" if wall <= TARGET_S else "not met") if n >= 5000 else f"({TARGET_S:.0f} s for 5,000)"
    target = "(merged: the floor)" if args.merged else target
    load = os.getloadavg()[0]  # the machine's other work, which the wall time includes
    print("| members | jobs | wall s | CPU s | wall s / member | CPU s / member | peak RSS MB | slices | 60 s target "
          "| load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {n:,} | {args.jobs or os.cpu_count()} | {wall:.1f} | {cpu:.1f} | {wall / n:.4f} | {cpu / n:.4f} | "
          f"{peak_mb:,.0f} | {slices:,} | {target} | {load:.1f} |")
    if args.stages:
        print(breakdown.getvalue(), end="")

if __name__ == "__main__":
    main()
