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
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _rss_anon(pid: int) -> int:
    """RssAnon of pid and its children, bytes."""
    total = 0
    pids = [pid]
    try:
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def measure(trace: Path, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="tracesql-bench-") as d:
        out = Path(d) / "run"
        cmd = [sys.executable, "-m", "tracesql", "ingest", "-q", str(trace), "-o", str(out), "-j", "1"]
        if args.memory_limit:
            cmd += ["--memory-limit", args.memory_limit]
        if args.max_events:
            cmd += ["--max-events", str(args.max_events)]
        env = {**os.environ, "PYTHONPATH": args.pythonpath or str(REPO), "TMPDIR": d}
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, cwd=d)  # not the repo root: `-m` would import its tracesql first
        peak_anon = 0
        done = threading.Event()

        def sample():
            nonlocal peak_anon
            while not done.wait(0.05):
                peak_anon = max(peak_anon, _rss_anon(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
        done.set()
        sampler.join()
        return {"label": args.label, "trace": trace.name, "json_bytes": trace.stat().st_size,
                "memory_limit": args.memory_limit, "max_events": args.max_events, "exit": status >> 8,
                "wall_s": round(wall, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024),
                "peak_anon_mb": round(peak_anon / 2**20)}


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
