"""The long fuzz run: every reader in turn, for a share of --minutes, with fresh random mutations.

    python -m tests.fuzz --minutes 10            # all readers, from the repository root
    python -m tests.fuzz --minutes 3 --reader kineto --failures /tmp/fuzz-failures

Prints, per reader, the inputs tried and the distinct failures (saved with their reply under --failures).
Exit status 1 if any failure was found.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .harness import Worker, failure_key, mutants, save, seeds


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--reader", action="append", help="only this reader (FORMAT); repeatable")
    parser.add_argument("--failures", type=Path, default=Path("fuzz-failures"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracesql-fuzz-") as d:
        scratch = Path(d)
        by_reader = {fmt: s for fmt, s in seeds(scratch).items() if s and (not args.reader or fmt in args.reader)}
        share = args.minutes * 60 / max(1, len(by_reader))
        report = []
        for fmt, reader_seeds in by_reader.items():
            worker = Worker(scratch)
            found: dict[str, Path] = {}
            deadline = time.monotonic() + share

            @settings(max_examples=20, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(st.data())
            def explore(data):
                seed = data.draw(st.sampled_from(reader_seeds))
                mutant = data.draw(mutants(seed))
                reply = worker.run(mutant, seed.suffix)
                key = failure_key(reply)
                if key and key not in found:
                    found[key] = save(args.failures, seed, mutant, reply)
                    print(f"  {fmt}: NEW {key} -> {found[key]}", flush=True)

            while time.monotonic() < deadline:  # batches of 20 inputs, until the reader's share is spent
                explore()
            worker.stop()
            report.append((fmt, len(reader_seeds), worker.inputs, found))
            print(f"{fmt}: {worker.inputs} inputs from {len(reader_seeds)} seeds, {len(found)} distinct failures",
                  flush=True)
    print("\nreader     seeds   inputs  distinct failures")
    for fmt, n_seeds, inputs, found in report:
        print(f"{fmt:10s} {n_seeds:5d} {inputs:8d}  {len(found)}" + "".join(f"\n    {k}" for k in found))
    return 1 if any(found for *_, found in report) else 0


if __name__ == "__main__":
    raise SystemExit(main())
