#!/usr/bin/env python3
"""Make a big, valid rocprofv3 JSON trace (`<pid>_results.json`) by tiling a real one.

    python benchmarks/tile_rocprof.py IN_results.json.gz OUT_results.json --min-bytes 1e9 [--gap-ns 1000000]

The `buffer_records` of every process of IN are written k times, k as small as possible for OUT to reach
--min-bytes. Copy i has its `start_timestamp`/`end_timestamp` shifted by i * (span + gap) (span: last end - first
start over all records), so the copies follow one another, and its `correlation_id.internal` and
`dispatch_info.dispatch_id` offset by i * (max + 1), so each copy's ids stay its own. Everything else (metadata,
agents, names, kernel symbols) is written once, as it is. The output is minified, as rocprofv3 writes it, and
written streaming (one copy of the records in memory at a time) to OUT.tmp, renamed to OUT at the end; a sidecar
OUT.meta.json records copies, records and bytes.
"""

from __future__ import annotations

import gzip
import math
import time

import msgspec

from tiling import main, publish


def _load(path: str) -> dict:
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        return msgspec.json.decode(f.read())


def tile(src: str, out: str, min_bytes: float, gap_ns: int = 1_000_000, copies: int | None = None) -> dict:
    start = time.perf_counter()
    doc = _load(src)
    processes = doc["rocprofiler-sdk-tool"]
    records = [r for p in processes for rs in p.get("buffer_records", {}).values() for r in rs]
    first = min(r["start_timestamp"] for r in records)
    last = max(r["end_timestamp"] for r in records)
    shift = last - first + gap_ns
    corr_step = max(r.get("correlation_id", {}).get("internal", 0) for r in records) + 1
    dispatch_step = max((r.get("dispatch_info") or {}).get("dispatch_id", 0) for r in records) + 1
    one_copy = len(msgspec.json.encode([p.get("buffer_records", {}) for p in processes]))
    rest = len(msgspec.json.encode(doc)) - one_copy
    k = copies or max(1, math.ceil((min_bytes - rest) / one_copy))
    encoder = msgspec.json.Encoder()
    tmp = out + ".tmp"
    count = 0
    with open(tmp, "wb") as f:
        f.write(b'{"rocprofiler-sdk-tool":[')
        for n, proc in enumerate(processes):
            f.write(b"," if n else b"")
            f.write(encoder.encode({key: value for key, value in proc.items() if key != "buffer_records"})[:-1])
            f.write(b',"buffer_records":{')
            for d, (domain, rs) in enumerate(proc.get("buffer_records", {}).items()):
                f.write(b"," if d else b"")
                f.write(encoder.encode(domain) + b":[")
                for i in range(k):
                    if rs:
                        f.write(b"," if i else b"")
                        f.write(encoder.encode([_moved(r, i * shift, i * corr_step, i * dispatch_step)
                                                for r in rs])[1:-1])
                        count += len(rs)
                f.write(b"]")
            f.write(b"}}")
        f.write(b"]}")
    return publish(tmp, out, {"source": src, "copies": k, "shift_ns": shift, "records": count, "events": count},
                   start)


def _moved(r: dict, shift: int, corr: int, dispatch: int) -> dict:
    r = {**r, "start_timestamp": r["start_timestamp"] + shift, "end_timestamp": r["end_timestamp"] + shift}
    if "correlation_id" in r:
        r["correlation_id"] = {**r["correlation_id"], "internal": r["correlation_id"].get("internal", 0) + corr}
    if r.get("dispatch_info"):
        r["dispatch_info"] = {**r["dispatch_info"], "dispatch_id": r["dispatch_info"].get("dispatch_id", 0) + dispatch}
    return r


if __name__ == "__main__":
    main(tile, __doc__)
