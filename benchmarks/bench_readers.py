#!/usr/bin/env python3
"""The Nsight SQLite, rocprofv3, Perfetto, XPlane and torch_npu readers on big inputs, against reading the same file's
bytes.

    python benchmarks/bench_readers.py --nsys BIG.sqlite --rocprof BIG_results.json --perfetto BIG.perfetto-trace \
        --xplane BIG.xplane.pb --ascend BIG/ASCEND_PROFILER_OUTPUT/trace_view.json [--memory-limit 1GB] [--repeat 1] \
        [--base CHECKOUT [--base-memory-limit 12GB]] [--json OUT]
    python benchmarks/bench_readers.py --smoke        # tiny crafted inputs: that it runs (CI), no timing claims

Make the inputs with the tilers (benchmarks/tile_nsys.py, tile_rocprof.py, tile_perfetto.py, tile_xplane.py,
tile_ascend.py). With --base, (c) the reader of that checkout (e.g. a worktree of the commit before a change) runs
on the same file in the same run, under --base-memory-limit (default: --memory-limit); a refusal is reported as
such. For each file, each
in a fresh process: (a) the baseline, reading the file's bytes (gunzipped when gzip) in 16 MB chunks; (b) the
reader (`tracesql.readers.read_trace`, the slices streamed to their memory-mapped scratch file) under
--memory-limit. Reported: wall seconds, CPU seconds (user + system, from wait4), CPU-s per million events (events:
the reader's event count), peak RSS (ru_maxrss: file-backed pages of the mapped slices included) and peak anonymous
RSS (RssAnon, sampled every 50 ms: the heap), and (b)/(a) ratios of time and CPU. Scratch files (the
reader's, and TMPDIR of the children) go to a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench_ingest import run_measured  # the same child-process measurement as the other benchmarks

REPO = Path(__file__).resolve().parent.parent

_BASELINE = """
import gzip, sys
path = sys.argv[1]
with open(path, 'rb') as f:
    gz = f.read(2) == b'\\x1f\\x8b'
n = 0
with (gzip.open if gz else open)(path, 'rb') as f:
    while chunk := f.read(16 << 20):
        n += len(chunk)
print(n)
"""
_READER = """
import sys
from pathlib import Path
from tracesql import limits
from tracesql.readers import read_trace
with limits.using(limits.Limits.make(sys.argv[2])):
    traces = read_trace(Path(sys.argv[1]))
print(sum(t.event_count for t in traces), sum(t.slices.num_rows for t in traces))
"""


def measure(code: str, args: list[str], repo: Path = REPO) -> dict:
    """A fresh `python -c code args...` importing tracesql from `repo`: wall, CPU (user + system), peak RSS, peak
    RssAnon, and the words of its last line of output (a failure: `failed` and its last line)."""
    with tempfile.TemporaryDirectory(prefix="tracesql-bench-") as d:
        log = Path(d) / "out.log"
        m = run_measured([sys.executable, "-c", code, *args], float("inf"), 0, str(log),
                         env={**os.environ, "PYTHONPATH": str(repo), "TMPDIR": d}, cwd=d)
        lines = log.read_text().splitlines()
    return {"wall_s": m["wall_s"], "cpu_s": m["user_s"] + m["sys_s"], "peak_rss_mb": m["rss_mb"],
            "peak_anon_mb": m["anon_mb"], "output": lines[-1].split() if lines else [],
            "failed": m["returncode"] != 0 and (lines[-1] if lines else f"exit {m['returncode']}")}


def bench(fmt: str, path: Path, memory_limit: str, repeat: int, base: Path | None = None,
          base_memory_limit: str | None = None) -> dict:
    best = {}
    runs = [("raw read", _BASELINE, [str(path)], REPO), ("reader", _READER, [str(path), memory_limit], REPO)]
    if base:
        runs.append(("base", _READER, [str(path), base_memory_limit or memory_limit], base))
    for label, code, args, repo in runs:
        measured = [measure(code, args, repo) for _ in range(repeat)]
        if label != "base" and measured[0]["failed"]:
            raise SystemExit(f"failed: {' '.join(args)}: {measured[0]['failed']}")
        best[label] = min(measured, key=lambda r: r["wall_s"]) | {
            "peak_anon_mb": max(r["peak_anon_mb"] for r in measured)}
    events, slices = map(int, best["reader"]["output"])
    raw, reader = best["raw read"], best["reader"]
    with_base = {}
    if base:
        b = best["base"]
        with_base = {"base_memory_limit": base_memory_limit or memory_limit, "base_failed": b["failed"] or None,
                     "base_cpu_s": round(b["cpu_s"], 3), "base_wall_s": round(b["wall_s"], 3),
                     "base_peak_rss_mb": round(b["peak_rss_mb"]), "base_peak_anon_mb": round(b["peak_anon_mb"])}
    return with_base | {"format": fmt, "file": path.name, "bytes": path.stat().st_size,
                        "content_bytes": int(raw["output"][0]),
            "events": events, "slices": slices, "memory_limit": memory_limit,
            "raw_wall_s": round(raw["wall_s"], 3), "raw_cpu_s": round(raw["cpu_s"], 3),
            "reader_wall_s": round(reader["wall_s"], 3), "reader_cpu_s": round(reader["cpu_s"], 3),
            "reader_cpu_s_per_M_events": round(reader["cpu_s"] / max(events, 1) * 1e6, 2),
            "time_ratio": round(reader["wall_s"] / raw["wall_s"], 1),
            "cpu_ratio": round(reader["cpu_s"] / raw["cpu_s"], 1),
            "reader_peak_rss_mb": round(reader["peak_rss_mb"]), "reader_peak_anon_mb": round(reader["peak_anon_mb"]),
            "raw_peak_rss_mb": round(raw["peak_rss_mb"])}


FORMATS = ("nsys", "rocprof", "perfetto", "xplane", "ascend")


def smoke_inputs(folder: Path) -> dict[str, Path]:
    sys.path.insert(0, str(REPO / "tests"))
    from crafted import ascend_trace, nsys_export, perfetto_trace, rocprof_trace

    return {"nsys": nsys_export(folder / "smoke.sqlite", 200, huge=100),
            "rocprof": rocprof_trace(folder / "1_results.json", 200, huge=100),
            "perfetto": perfetto_trace(folder / "smoke.pftrace", 200, huge=100, unended=3),
            "xplane": REPO / "datasets" / "jax_cpu_mlp" / "vm.xplane.pb",  # a real one, small
            "ascend": ascend_trace(folder / "smoke_ascend_pt", 200, huge=100, flows=True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for fmt in FORMATS:
        parser.add_argument(f"--{fmt}", type=Path, action="append", default=[])
    parser.add_argument("--smoke", action="store_true", help="tiny crafted inputs (what CI runs)")
    parser.add_argument("--memory-limit", default="1GB")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--base", type=Path, help="a checkout whose reader also runs on each file (before/after)")
    parser.add_argument("--base-memory-limit", help="--memory-limit of the --base reader (default: --memory-limit)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracesql-bench-") as scratch:
        inputs = [(fmt, p) for fmt in FORMATS for p in getattr(args, fmt)]
        if args.smoke:
            inputs += list(smoke_inputs(Path(scratch)).items())
        if not inputs:
            parser.error("give --smoke or at least one of --nsys/--rocprof/--perfetto/--xplane/--ascend")
        results = []
        print("| format | file | MB | events | raw read s | reader s | reader CPU-s | CPU-s / M events | time ratio "
              "| CPU ratio | reader peak RSS MB | reader peak anon MB |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for fmt, path in inputs:
            r = bench(fmt, path, args.memory_limit, args.repeat, args.base, args.base_memory_limit)
            results.append(r)
            print(f"| {fmt} | {r['file']} | {r['content_bytes'] / 1e6:,.0f} | {r['events']:,} | {r['raw_wall_s']} | "
                  f"{r['reader_wall_s']} | {r['reader_cpu_s']} | {r['reader_cpu_s_per_M_events']} | "
                  f"{r['time_ratio']}x | {r['cpu_ratio']}x | {r['reader_peak_rss_mb']} | {r['reader_peak_anon_mb']} |",
                  flush=True)
            if args.base:
                print(f"|   base reader ({args.base}, --memory-limit {r['base_memory_limit']}): "
                      f"{r['base_failed'] or 'read'} | | | | | {r['base_wall_s']} | {r['base_cpu_s']} | | | | "
                      f"{r['base_peak_rss_mb']} | {r['base_peak_anon_mb']} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
