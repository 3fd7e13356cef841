"""What the format tilers (tile_nsys.py, tile_rocprof.py, tile_perfetto.py) share: their command line, and
publishing the output with its sidecar."""

from __future__ import annotations

import argparse
import json
import os
import time


def publish(tmp: str, out: str, meta: dict, started: float) -> dict:
    """Rename the finished `tmp` to `out` and write `out`.meta.json (meta, plus bytes and seconds)."""
    os.replace(tmp, out)
    meta = {**meta, "bytes": os.path.getsize(out), "seconds": round(time.perf_counter() - started, 1)}
    with open(out + ".meta.json", "w") as f:
        json.dump(meta, f, indent=1)
    return meta


def main(tile, doc: str) -> None:
    """`tile(src, out, min_bytes, gap_ns, copies) -> meta` from the command line."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("src")
    parser.add_argument("out")
    parser.add_argument("--min-bytes", type=float, default=1e9)
    parser.add_argument("--gap-ns", type=int, default=1_000_000)
    parser.add_argument("--copies", type=int, help="exactly this many copies (instead of --min-bytes)")
    args = parser.parse_args()
    print(json.dumps(tile(args.src, args.out, args.min_bytes, args.gap_ns, args.copies)))
