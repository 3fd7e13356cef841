#!/usr/bin/env python3
"""Make a big, valid Kineto (PyTorch profiler) JSON trace by tiling a real one.

    python benchmarks/tile_trace.py IN.json.gz OUT.json --min-bytes 1e9

The events of IN (`traceEvents`) are written k times, k being as small as possible
for OUT to reach --min-bytes (uncompressed). Copy i (i = 0 .. k-1):

* has every `ts` shifted by i * ceil(span + gap), span = max(ts + dur) - min(ts) over the
  non-metadata events, so that the copies follow one another in time without overlapping;
* has its ids made unique: `args.correlation`, `args["External id"]`, `args["Python id"]`,
  `args["Python parent id"]` and the `id` of flow events (`ph` in s/f/t) are offset by
  i * (max id + 1), one max over all of these fields (so correlation == flow id
  stays true within each copy);
* has its steps renumbered: `ProfilerStep#N` becomes `ProfilerStep#<N + i * (max N + 1)>`, as in one longer
  recording (copies that repeat step numbers would each get the device window of every copy's step N);
* omits the `ph: "M"` metadata events (process/thread names, sort indices): they are
  written once, with copy 0.

All other top-level keys (schemaVersion, deviceProperties, distributedInfo, traceName,
baseTimeNanoseconds, ...) are kept unchanged and in their original order.

The output is written streaming (one orjson.dumps per event, written in batches), so memory
stays bounded by the size of the *input* trace, whatever the size of the output. orjson
writes floats in their shortest round-trip form, so float timestamps keep their precision.
The file is written to OUT.tmp and renamed at the end, and a small sidecar OUT.meta.json
records the event count, byte size and copy count (bench_ingest.py reads it).
OUT may end in .gz (gzip level 1), but plain .json is preferred for big files.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import sys
import time

try:
    import orjson

    def _dumps(obj) -> bytes:
        return orjson.dumps(obj)

    def _loads(raw: bytes):
        return orjson.loads(raw)

except ImportError:  # pragma: no cover - fallback, slower
    def _dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()

    def _loads(raw: bytes):
        return json.loads(raw)


ID_ARG_KEYS = ("correlation", "External id", "Python id", "Python parent id")
STEP = re.compile(r"ProfilerStep#(\d+)")
FLOW_PHASES = ("s", "f", "t")
BATCH = 20_000


def read_trace(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as fh:
        return _loads(fh.read())


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def analyse(events: list) -> tuple[float, float, int, int]:
    """Return (min ts, max end, max id, max step number) over the non-metadata events."""
    t_min = math.inf
    t_max = -math.inf
    max_id = -1
    max_step = -1
    for e in events:
        if e.get("ph") == "M":
            continue
        name = e.get("name")
        step = STEP.fullmatch(name) if isinstance(name, str) and name.startswith("ProfilerStep#") else None
        if step:
            max_step = max(max_step, int(step[1]))
        ts = e.get("ts")
        if _is_num(ts):
            t_min = min(t_min, ts)
            dur = e.get("dur")
            end = ts + dur if _is_num(dur) else ts
            t_max = max(t_max, end)
        args = e.get("args")
        if isinstance(args, dict):
            for k in ID_ARG_KEYS:
                v = args.get(k)
                if isinstance(v, int) and not isinstance(v, bool):
                    max_id = max(max_id, v)
        if e.get("ph") in FLOW_PHASES:
            v = e.get("id")
            if isinstance(v, int) and not isinstance(v, bool):
                max_id = max(max_id, v)
    if t_min is math.inf:
        t_min = t_max = 0
    return t_min, t_max, max_id, max_step


def shifted(e: dict, dt: int, did: int, dstep: int = 0) -> dict:
    """A copy of event e with ts shifted by dt, ids offset by did and step numbers by dstep (e is not modified)."""
    e2 = dict(e)
    ts = e2.get("ts")
    if _is_num(ts):
        e2["ts"] = ts + dt
    name = e2.get("name")
    step = STEP.fullmatch(name) if dstep and isinstance(name, str) and name.startswith("ProfilerStep#") else None
    if step:
        e2["name"] = f"ProfilerStep#{int(step[1]) + dstep}"
    if did:
        if e2.get("ph") in FLOW_PHASES:
            v = e2.get("id")
            if isinstance(v, int) and not isinstance(v, bool):
                e2["id"] = v + did
        args = e2.get("args")
        if isinstance(args, dict):
            new_args = None
            for k in ID_ARG_KEYS:
                v = args.get(k)
                if isinstance(v, int) and not isinstance(v, bool):
                    if new_args is None:
                        new_args = dict(args)
                    new_args[k] = v + did
            if new_args is not None:
                e2["args"] = new_args
    return e2


def _header_item(key: str, value) -> bytes:
    """A top-level key: value, written Kineto-style with ': ' and ', ' separators.

    Matters: HTA finds a file's rank with the regex '"rank":\\s+(\\d+)' (whitespace required),
    reading the file line by line until it matches -- the whole file if it never does."""
    return (json.dumps(key) + ": " + json.dumps(value, ensure_ascii=False)).encode()


class CountingWriter:
    def __init__(self, fh):
        self.fh = fh
        self.n = 0

    def write(self, b: bytes) -> None:
        self.fh.write(b)
        self.n += len(b)


def tile(inp: str, out: str, min_bytes: float, gap_us: float = 1000.0,
         max_copies: int = 100_000, quiet: bool = False) -> dict:
    t0 = time.perf_counter()
    trace = read_trace(inp)
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise SystemExit(f"{inp}: not a Kineto trace (no traceEvents list)")
    events = trace["traceEvents"]
    t_min, t_max, max_id, max_step = analyse(events)
    span = t_max - t_min
    dt_step = int(math.ceil(span + gap_us))
    did_step = max_id + 1
    n_meta = sum(1 for e in events if e.get("ph") == "M")
    non_meta = [e for e in events if e.get("ph") != "M"]

    tmp = out + ".tmp"
    if out.endswith(".gz"):
        raw_fh = gzip.open(tmp, "wb", compresslevel=1)
    else:
        raw_fh = open(tmp, "wb", buffering=8 << 20)
    n_events = 0
    copies = 0
    with raw_fh:
        w = CountingWriter(raw_fh)
        w.write(b"{\n")
        keys = list(trace.keys())
        for ki, key in enumerate(keys):
            sep = b",\n" if ki < len(keys) - 1 else b"\n"
            if key != "traceEvents":
                w.write(_header_item(key, trace[key]) + sep)
                continue
            w.write(b'"traceEvents": [\n')
            # Bytes still to come after the events: the remaining top-level keys.
            tail = sum(len(_header_item(k, trace[k])) + 2 for k in keys[ki + 1:]) + 4
            first = True
            while copies < max_copies:
                i = copies
                src = events if i == 0 else non_meta
                dt, did, dstep = i * dt_step, i * did_step, i * (max_step + 1)
                buf = []
                for e in src:
                    buf.append(_dumps(shifted(e, dt, did, dstep) if i else e))
                    if len(buf) >= BATCH:
                        w.write((b"" if first else b",\n") + b",\n".join(buf))
                        first = False
                        n_events += len(buf)
                        buf = []
                if buf:
                    w.write((b"" if first else b",\n") + b",\n".join(buf))
                    first = False
                    n_events += len(buf)
                copies += 1
                if not quiet:
                    print(f"  copy {copies}: {w.n / 1e9:.3f} GB, {n_events:,} events",
                          file=sys.stderr, flush=True)
                if w.n + tail >= min_bytes:
                    break
            w.write(b"\n]" + sep)
        w.write(b"}\n")
        total = w.n
    os.replace(tmp, out)
    meta = {
        "source": os.path.abspath(inp),
        "output": os.path.abspath(out),
        "copies": copies,
        "events": n_events,
        "metadata_events": n_meta,
        "source_events": len(events),
        "bytes_uncompressed": total,
        "bytes_on_disk": os.path.getsize(out),
        "ts_shift_per_copy": dt_step,
        "id_offset_per_copy": did_step,
        "gap_us": gap_us,
        "min_bytes": min_bytes,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    with open(out + ".meta.json", "wb") as fh:
        fh.write(_dumps(meta) + b"\n")
    return meta


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", help="Kineto trace, .json or .json.gz")
    p.add_argument("output", help="output trace (.json preferred; .gz is gzip level 1)")
    p.add_argument("--min-bytes", type=float, default=1e9,
                   help="minimum uncompressed size of the output (default 1e9)")
    p.add_argument("--gap-us", type=float, default=1000.0,
                   help="idle gap between consecutive copies, in trace time units (default 1000)")
    p.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    meta = tile(a.input, a.output, a.min_bytes, a.gap_us, quiet=a.quiet)
    print(f"wrote {meta['output']}: {meta['bytes_uncompressed']:,} bytes uncompressed "
          f"({meta['bytes_uncompressed'] / 1e9:.3f} GB), {meta['events']:,} events "
          f"({meta['copies']} copies of {meta['source_events']:,} events, "
          f"{meta['metadata_events']} metadata events kept once), {meta['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
