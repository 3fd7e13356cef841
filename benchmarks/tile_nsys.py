#!/usr/bin/env python3
"""Make a big, valid Nsight Systems SQLite export by tiling a real one.

    python benchmarks/tile_nsys.py IN.sqlite OUT.sqlite --min-bytes 1e9 [--gap-ns 1000000]

The CUDA and NVTX records of IN (kernels, copies, memsets, synchronizations, runtime/driver calls, NVTX events)
are copied k times, k as small as possible for OUT to reach --min-bytes. Copy i has its `start`/`end` shifted by
i * (span + gap) (span: last end - first start over those tables), so the copies follow one another, and its
`correlationId` offset by i * (max correlation id + 1), so each launch keeps its own kernels. Every other table
(strings, threads, processes, devices, ...) is kept once, as it is. SQLite does the copying (INSERT ... SELECT),
so the tiler needs no memory beyond SQLite's cache. Written to OUT.tmp, renamed to OUT at the end; a sidecar
OUT.meta.json records copies, rows and bytes.
"""

from __future__ import annotations

import math
import os
import shutil
import sqlite3
import time

from tiling import main, publish

TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
          "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")


def tile(src: str, out: str, min_bytes: float, gap_ns: int = 1_000_000, copies: int | None = None) -> dict:
    tmp = out + ".tmp"
    shutil.copyfile(src, tmp)
    con = sqlite3.connect(tmp, isolation_level=None)
    con.execute("PRAGMA journal_mode = OFF")
    con.execute("PRAGMA synchronous = OFF")
    present = {t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} & set(TABLES)
    columns = {t: [c[1] for c in con.execute(f'PRAGMA table_info("{t}")')] for t in present}
    rows = {t: con.execute(f'SELECT max(rowid) FROM "{t}"').fetchone()[0] or 0 for t in present}
    spans = con.execute(" UNION ALL ".join(f'SELECT min(start), max(COALESCE("end", start)) FROM "{t}"'
                                           for t in present)).fetchall()
    first = min(s for s, _ in spans if s is not None)
    last = max(e for _, e in spans if e is not None)
    shift = last - first + gap_ns
    max_corr = max((con.execute(f'SELECT max(correlationId) FROM "{t}"').fetchone()[0] or 0)
                   for t in present if "correlationId" in columns[t])
    corr_step = max_corr + 1

    def add_copy(i: int) -> None:
        for t in sorted(present):
            moved = {"start": f"start + {i * shift}", "end": f'"end" + {i * shift}',
                     "correlationId": f"correlationId + {i * corr_step}"}
            values = ", ".join(moved.get(c, f'"{c}"') for c in columns[t])
            con.execute(f'INSERT INTO "{t}" SELECT {values} FROM "{t}" WHERE rowid <= {rows[t]}')

    start = time.perf_counter()
    base_bytes = os.path.getsize(tmp)
    con.execute("BEGIN")
    add_copy(1)
    con.execute("COMMIT")
    per_copy = max(1, os.path.getsize(tmp) - base_bytes)
    k = copies or max(2, math.ceil((min_bytes - base_bytes) / per_copy) + 1)
    for i in range(2, k):
        con.execute("BEGIN")
        add_copy(i)
        con.execute("COMMIT")
    counts = {t: con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in sorted(present)}
    con.close()
    return publish(tmp, out, {"source": src, "copies": k, "shift_ns": shift, "correlation_step": corr_step,
                              "rows": counts, "events": sum(counts.values())}, start)


if __name__ == "__main__":
    main(tile, __doc__)
