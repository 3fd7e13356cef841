#!/usr/bin/env python3
"""MCP server start-up: wall time from spawning `tracesql mcp RUN` to the answer of the client's `initialize`
(the first thing an agent client waits for; also the server's CPU seconds by then, which a busy machine
inflates less than wall time), and then of the first `tools/call` (list_runs, which finds the run)
and of a first SQL call (run_sql: DuckDB imported, the sandbox opened). Target (issue 31): initialize answered
within 1 s wall, median of the repeats.

The client is plain JSON-RPC over the server's stdin/stdout (one message per line, as the MCP stdio transport
frames them), so that the time is the server's, not a client library's import.

Usage:
    python benchmarks/bench_mcp.py                         # on datasets/hta_trace_filter, 5 repeats
    python benchmarks/bench_mcp.py RUN --repeat 9
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TARGET = REPO / "datasets" / "hta_trace_filter"
PROTOCOL = "2025-11-25"


def request(proc, seq: int, method: str, params: dict) -> dict:
    """Send one request; wait for its answer (skipping notifications and log lines)."""
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": seq, "method": method, "params": params}) + "\n")
    proc.stdin.flush()
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the server ended before answering {method}: {proc.stderr.read()[-2000:]}")
        message = json.loads(line)
        if message.get("id") == seq:
            if "error" in message:
                raise RuntimeError(f"{method}: {message['error']}")
            return message["result"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used so far (Linux: /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_start(target: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "tracesql", "mcp", str(target)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        request(proc, 1, "initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                        "clientInfo": {"name": "bench_mcp", "version": "1"}})
        times = {"initialize": time.perf_counter() - t0, "initialize (server CPU s)": cpu_seconds(proc.pid)}
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        request(proc, 2, "tools/call", {"name": "list_runs", "arguments": {}})
        times["list_runs"] = time.perf_counter() - t0
        answer = request(proc, 3, "tools/call", {"name": "run_sql", "arguments": {
            "run": target.name, "sql": "SELECT count(*) FROM slices"}})
        assert not answer.get("isError"), answer
        times["run_sql"] = time.perf_counter() - t0
        return times
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)


def floor(code: str) -> dict[str, float]:
    """Wall and CPU seconds of `python -c CODE`: what the machine's load makes of an interpreter's start (`pass`)
    and of importing the SDK alone, next to the server's figures."""
    t0 = time.perf_counter()
    before = os.times()
    subprocess.run([sys.executable, "-c", code], check=True)
    after = os.times()
    return {"wall": time.perf_counter() - t0,
            "cpu": after.children_user + after.children_system - before.children_user - before.children_system}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", type=Path, default=DEFAULT_TARGET, help="a run, or raw traces")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    one_start(args.target)  # once before: a raw-trace target is ingested into the cache, .pyc files are written
    runs, empty, sdk = [], [], []
    for _ in range(args.repeat):  # interleaved, so that a change of load touches each alike
        runs.append(one_start(args.target))
        empty.append(floor("pass"))
        sdk.append(floor("import mcp.server.mcpserver"))
    print(f"`tracesql mcp {args.target.name}`, seconds from spawning the server (median of {args.repeat}; "
          f"load {os.getloadavg()[0]:.1f}):\n")
    print("| answer to | median s | min s | max s |\n|---|---:|---:|---:|")
    for step in runs[0]:
        values = [r[step] for r in runs]
        print(f"| {step} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |")
    for name, values in (("`python -c pass`", empty), ("`python -c 'import mcp.server.mcpserver'`", sdk)):
        for kind in ("wall", "cpu"):
            got = [v[kind] for v in values]
            print(f"| {name} ({kind}) | {statistics.median(got):.3f} | {min(got):.3f} | {max(got):.3f} |")
    met = statistics.median(r["initialize"] for r in runs) <= 1.0
    print(f"\ntarget initialize <= 1 s: {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
