#!/usr/bin/env python3
"""Make a big, valid torch_npu trace_view.json by tiling a real one (the torch_npu counterpart of tile_trace.py).

    python benchmarks/tile_ascend.py IN/trace_view.json.gz OUT/ASCEND_PROFILER_OUTPUT/trace_view.json --min-bytes 1e9

The events of IN but its metadata (`ph` M: process and thread names, written once) are written k times, k as small
as possible for OUT to reach --min-bytes. Copy i has its `ts` shifted by i * (span + gap) (span: last end - first
start; `ts` written as text stays text, to the ns) and its flow `id`s and `connection_id`s offset by i * (max + 1),
so each copy's torch_to_npu flows and CANN links stay its own. Companion files are not made (trace_view.json
alone). Written streaming (one copy in memory at a time) to OUT.tmp, renamed to OUT; a sidecar OUT.meta.json
records copies, events and bytes.
"""

from __future__ import annotations

import gzip
import json
import math
import time
from decimal import Decimal

from tiling import main, publish


def tile(src: str, out: str, min_bytes: float, gap_ns: int = 1_000_000, copies: int | None = None) -> dict:
    start = time.perf_counter()
    with (gzip.open if src.endswith(".gz") else open)(src, "rb") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    meta = [e for e in events if e.get("ph") == "M"]
    rest = [e for e in events if e.get("ph") != "M"]
    timed = [(Decimal(str(e["ts"])), Decimal(str(e.get("dur", 0)))) for e in rest if "ts" in e]
    shift = max(t + d for t, d in timed) - min(t for t, _ in timed) + Decimal(gap_ns) / 1000
    ids = [e["id"] for e in rest if isinstance(e.get("id"), int)] + [
        (e.get("args") or {}).get("connection_id") for e in rest]
    id_step = max(i for i in ids if isinstance(i, int)) + 1
    one_copy = len(json.dumps(rest, separators=(",", ":")))
    k = copies or max(1, math.ceil((min_bytes - len(json.dumps(meta))) / one_copy))
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(meta, separators=(",", ":"))[:-1])
        for i in range(k):
            f.write("," + json.dumps([_moved(e, i * shift, i * id_step) for e in rest], separators=(",", ":"))[1:-1])
        f.write("]")
    return publish(tmp, out, {"source": src, "copies": k, "shift_us": str(shift), "events": len(meta) + k * len(rest)},
                   start)


def _moved(e: dict, shift: Decimal, ids: int) -> dict:
    e = dict(e)
    if "ts" in e:
        e["ts"] = str(Decimal(e["ts"]) + shift) if isinstance(e["ts"], str) else float(Decimal(str(e["ts"])) + shift)
    if isinstance(e.get("id"), int):
        e["id"] += ids
    if isinstance((e.get("args") or {}).get("connection_id"), int):
        e["args"] = {**e["args"], "connection_id": e["args"]["connection_id"] + ids}
    return e


if __name__ == "__main__":
    main(tile, __doc__)
