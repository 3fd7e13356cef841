#!/usr/bin/env python3
"""CLI fixed cost (issue 15): `tracesql --help` and `tracesql query overlap` on a bundled run, whole process, against
`python -c pass` measured in the same run.

Every command runs in a fresh child process (interpreter start, imports, work), the commands interleaved round by
round so that a change in the machine's load hits them alike; the median over --repeat rounds is reported, as wall
seconds, CPU seconds (user + system of the child) and the ratio of the wall time to the baseline's. On a machine
shared with other work the ratios are the numbers to compare; the targets (≤ 0.15 s for --help, ≤ 0.4 s for a query)
are for an idle machine, where `python -c pass` takes about 0.012 s.

With --compare OLD (the root of another tracesql checkout, e.g. main before a change) the same commands also run
with PYTHONPATH=OLD, in the same rounds.

Usage:
    python benchmarks/bench_cli.py                          # hta_trace_filter, 15 rounds
    python benchmarks/bench_cli.py --repeat 5 --compare /path/to/old/checkout
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATASET = REPO / "datasets" / "hta_trace_filter"
TARGETS = {"--help": 0.15, "query overlap RUN": 0.4}


#: The query alone, as tracesql.query runs it on an open connection (the child reports its own time): what the
#: whole process costs beyond this is the command's fixed cost.
IN_PROCESS = """
import sys, time, warnings
warnings.simplefilter("ignore")
from tracesql import engine, queries
con = engine.connect(sys.argv[1])
start = time.perf_counter()
queries.run(con, queries.find("overlap")).fetchall()
print(time.perf_counter() - start, file=sys.stderr)
"""


def timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall s, CPU s) of one child process; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}\n{done.stderr[-2000:]}")
    if cmd[-2:-1] == [IN_PROCESS]:  # the child timed the query itself
        wall = float(done.stderr.strip().splitlines()[-1])
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(dataset: Path, repeat: int, scratch: Path, compare: Path | None = None,
            warm: bool = True) -> dict[str, tuple[float, float]]:
    """Every command's median (wall s, CPU s) over `repeat` interleaved rounds, by name, in the order run: `python
    -c pass`, then per checkout (this one, and `compare` as "(old)") --help, query overlap and the query alone.
    `warm`: a first round, not counted, fills the page cache and the raw-trace cache (a smoke run skips it)."""
    scratch.mkdir(parents=True, exist_ok=True)
    checkouts = {"new": REPO} | ({"old": compare.resolve()} if compare else {})
    base_env = {**os.environ, "COLUMNS": "100"}

    def env_of(root: Path | None) -> dict:  # each checkout its own cache (runs of its own schema version)
        label = next((k for k, v in checkouts.items() if v == root), "new")
        return {**base_env, "PYTHONPATH": str(root or REPO), "TRACESQL_CACHE": str(scratch / f"cache-{label}")}

    runs = {}
    for label, root in checkouts.items():  # each checkout reads a run it wrote (its schema version)
        env = env_of(root)
        runs[label] = scratch / f"run-{label}"
        subprocess.run([sys.executable, "-m", "tracesql", "ingest", str(dataset), "-o", str(runs[label]), "-q"],
                       env=env, check=True)
    commands = [("python -c pass", None, [sys.executable, "-c", "pass"])]
    for label, root in checkouts.items():
        tag = "" if len(checkouts) == 1 else f" ({label})"
        commands += [
            ("--help" + tag, root, [sys.executable, "-m", "tracesql", "--help"]),
            ("query overlap RUN" + tag, root, [sys.executable, "-m", "tracesql", "query", "overlap", str(runs[label])]),
            ("query overlap RUN -f csv" + tag, root,
             [sys.executable, "-m", "tracesql", "query", "overlap", str(runs[label]), "-f", "csv"]),
            ("query overlap TRACES" + tag, root,  # raw traces, already in the cache: only checked for changes
             [sys.executable, "-m", "tracesql", "query", "overlap", str(dataset)]),
            ("in-process query overlap" + tag, root, [sys.executable, "-c", IN_PROCESS, str(runs[label])]),
        ]
    for _, root, cmd in commands if warm else []:
        timed(cmd, env_of(root))
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in commands}
    for _ in range(repeat):
        for name, root, cmd in commands:
            samples[name].append(timed(cmd, env_of(root)))
    return {name: (statistics.median(x[0] for x in xs), statistics.median(x[1] for x in xs))
            for name, xs in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", nargs="?", type=Path, default=DEFAULT_DATASET,
                        help="trace file or folder to ingest as the run (default: the bundled hta_trace_filter)")
    parser.add_argument("--repeat", type=int, default=15, help="rounds (default 15)")
    parser.add_argument("--compare", type=Path, metavar="OLD", help="another checkout to time alongside")
    parser.add_argument("--scratch", type=Path, help="folder for the run and the cache (default: a temporary one)")
    args = parser.parse_args()

    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="tracesql-bench-cli-"))
    medians = measure(args.dataset, args.repeat, scratch, args.compare)
    checkouts = ["new"] + (["old"] if args.compare else [])

    def median(name: str, i: int) -> float:
        return medians[name][i]

    base = median("python -c pass", 0)
    print(f"CLI fixed cost: {args.dataset.name}, median of {args.repeat} interleaved rounds, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print("| command | wall s | CPU s | × python -c pass | target (idle machine) |")
    print("|---|---:|---:|---:|---|")
    for name in medians:
        if name.startswith("in-process"):
            continue
        target = next((f"≤ {t} s" for key, t in TARGETS.items() if name.startswith(key) and "csv" not in name), "")
        print(f"| `{name}` | {median(name, 0):.3f} | {median(name, 1):.3f} | {median(name, 0) / base:.1f} | {target} |")
    print("\n| | the query alone (in-process) s | fixed cost of `query overlap RUN` s (whole − query) |")
    print("|---|---:|---:|")
    for label in checkouts:
        tag = "" if len(checkouts) == 1 else f" ({label})"
        alone = median("in-process query overlap" + tag, 0)
        print(f"| {label} | {alone:.3f} | {median('query overlap RUN' + tag, 0) - alone:.3f} |")
    if len(checkouts) > 1:
        print("\n| command | new ÷ old, wall | new ÷ old, CPU |\n|---|---:|---:|")
        for name in medians:
            if name.endswith("(new)") and not name.startswith("in-process"):
                old = name.replace("(new)", "(old)")
                print(f"| `{name.replace(' (new)', '')}` | {median(name, 0) / median(old, 0):.2f} | "
                      f"{median(name, 1) / median(old, 1):.2f} |")


if __name__ == "__main__":
    main()
