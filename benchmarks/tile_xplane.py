#!/usr/bin/env python3
"""Make a big, valid XPlane by tiling a real one (the XPlane counterpart of tile_trace.py).

    python benchmarks/tile_xplane.py IN.xplane.pb OUT.xplane.pb --copies 50

Every line's events are written `--copies` times, copy i shifted by i * (span + 1 µs), span being the line
set's extent (max end - min start over all lines of all planes), so that copies follow one another without
overlapping. Metadata (event/stat metadata, the HLO modules) is kept once: every copy runs the same ops.
Prints the number of events written. The file is written to OUT.tmp and renamed.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tracesql.readers import read_bytes, xplane  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--copies", type=int, required=True)
    args = p.parse_args(argv)
    space = xplane.parse(Path(args.input), read_bytes(Path(args.input)))
    ends = [line.timestamp_ns * 1000 + e.offset_ps + e.duration_ps
            for plane in space.planes for line in plane.lines for e in line.events]
    starts = [line.timestamp_ns * 1000 + e.offset_ps for plane in space.planes for line in plane.lines
              for e in line.events]
    shift = max(ends) - min(starts) + 1_000_000
    events = 0
    for plane in space.planes:
        for line in plane.lines:
            originals = list(line.events)
            for i in range(1, args.copies):
                for event in originals:
                    copy = line.events.add()
                    copy.CopyFrom(event)
                    if copy.WhichOneof("data") != "num_occurrences":
                        copy.offset_ps += i * shift
            events += len(line.events)
    tmp = args.output + ".tmp"
    with open(tmp, "wb") as f:
        f.write(space.SerializeToString())
    os.replace(tmp, args.output)
    print(events)
    return 0


if __name__ == "__main__":
    sys.exit(main())
