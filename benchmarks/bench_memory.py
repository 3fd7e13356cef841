#!/usr/bin/env python3
"""Peak memory of `tracesql ingest` against trace size (tiled traces from tile_trace.py), each a fresh process.

    python benchmarks/bench_memory.py /tmp/tracesql-bench/df1g.json /tmp/tracesql-bench/df4g.json \
        [--memory-limit 1GB] [--max-events N] [--pythonpath DIR] [--label NAME]

Reports wall seconds, peak RSS (the kernel's ru_maxrss of the child: every resident page, file-backed ones
included) and peak anonymous RSS (RssAnon of the process, sampled every 50 ms: the memory that cannot be
dropped and re-read from a file). --pythonpath runs another checkout (e.g. an older commit, for a baseline in
the same session). One line of JSON per trace is appended to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from bench_ingest import run_measured  # the same child-process measurement as the ingest benchmark

REPO = Path(__file__).resolve().parent.parent


def measure(trace: Path, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="tracesql-bench-") as d:
        out = Path(d) / "run"
        cmd = [sys.executable, "-m", "tracesql", "ingest", "-q", str(trace), "-o", str(out), "-j", "1"]
        if args.memory_limit:
            cmd += ["--memory-limit", args.memory_limit]
        if args.max_events:
            cmd += ["--max-events", str(args.max_events)]
        env = {**os.environ, "PYTHONPATH": args.pythonpath or str(REPO), "TMPDIR": d}
        log = Path(d) / "ingest.log"
        # run in the scratch folder, not the repository root: `-m` would import the root's tracesql first
        m = run_measured(cmd, float("inf"), 0, str(log), env=env, cwd=d)
        sys.stderr.write(log.read_text())
        return {"label": args.label, "trace": trace.name, "json_bytes": trace.stat().st_size,
                "memory_limit": args.memory_limit, "max_events": args.max_events, "exit": m["returncode"],
                "wall_s": round(m["wall_s"], 2), "peak_rss_mb": round(m["rss_mb"]),
                "peak_anon_mb": round(m["anon_mb"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", type=Path)
    parser.add_argument("--memory-limit")
    parser.add_argument("--max-events", type=int)
    parser.add_argument("--pythonpath", help="the checkout to run (default: this one)")
    parser.add_argument("--label", default="tracesql")
    parser.add_argument("--out", type=Path, default=Path("/tmp/tracesql-bench/memory.jsonl"))
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for trace in args.traces:
        r = measure(trace, args)
        print(json.dumps(r), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
