#!/usr/bin/env python3
"""What the check of a run's files costs a query (issue 26 item 7: every flipped bit refused at ≤ 10 % of a
query's CPU): for each curated query, the CPU of the check `engine.connect` makes of the files of the tables the
query reads (`store.check_digest`: their XXH3-128), the same check of a run whose manifest records SHA-256 only (a
run of an older tracesql; it was every run's check before XXH3-128), and the query's own CPU with its defaults (on a
fresh connection, the connection not counted). Process CPU seconds (the query's: all of DuckDB's threads), best of
--repeat for each.

Usage:
    python benchmarks/bench_queries.py --tiles 24 --only steps     # makes the 24× run under /tmp/tracesql-bench
    python benchmarks/bench_file_check.py /tmp/tracesql-bench/queries/df_index_resolver-x24-run
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tracesql import engine, functions, queries, schema, store  # noqa: E402


def cpu(work) -> float:
    t0 = time.process_time()
    work()
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="a run folder (its manifest records both digests: ingested by this "
                                           "checkout)")
    ap.add_argument("--only", default="", help="regular expression: the curated queries to measure")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    manifest = store.load_manifest(args.run)
    entries = manifest["files"]
    if not all(store.DIGESTS.keys() <= set(e) for e in entries.values()):
        sys.exit(f"{args.run}: its manifest does not record {' and '.join(store.DIGESTS.values())} of every file "
                 "(ingest it again with this checkout)")
    rels = store.files_of(args.run, manifest)
    print(f"{args.run}: {sum(e['size'] for e in entries.values()) / 1e6:.1f} MB in {len(rels)} files\n")
    print("| query | MB read | XXH3-128 check, CPU s (% of the query) | SHA-256 check, CPU s (%) | query, CPU s |")
    print("|---|---|---|---|---|")
    rows = []
    for query in queries.catalogue():
        if not re.search(args.only, query.name):
            continue
        names = queries.names_used(query)
        _, used = functions.needed({n.lower() for n in names}, set(schema.TABLES))
        read = [r for r in rels if r.split("/")[0] in used]
        check = min(cpu(lambda: [store.check_digest(args.run, r, entries[r]) for r in read])
                    for _ in range(args.repeat))
        older = min(cpu(lambda: [store.check_digest(args.run, r, {"sha256": entries[r]["sha256"]}) for r in read])
                    for _ in range(args.repeat))

        def query_cpu() -> float:  # the query alone, not its connection (which checks the files)
            con = engine.connect(args.run, names=names)
            try:
                return cpu(lambda: queries.run(con, query, {}).to_arrow_table())
            finally:
                con.close()

        own = min(query_cpu() for _ in range(args.repeat))
        mb = sum(entries[r]["size"] for r in read) / 1e6
        rows.append((query.name, check, older, own))
        print(f"| `{query.name}` | {mb:.1f} | {check:.4f} ({100 * check / own:.1f} %) | {older:.4f} "
              f"({100 * older / own:.1f} %) | {own:.3f} |", flush=True)
    total = sum(r[3] for r in rows)
    for label, i in (("XXH3-128", 1), ("SHA-256", 2)):
        shares = [100 * r[i] / r[3] for r in rows]
        over = [f"{r[0]} {s:.1f} %" for r, s in zip(rows, shares) if s > 10]
        print(f"\n{label}: {sum(r[i] for r in rows):.3f} CPU s for {len(rows)} queries' {total:.2f}: "
              f"{100 * sum(r[i] for r in rows) / total:.1f} %; median {statistics.median(shares):.1f} %; "
              f"over 10 %: {', '.join(over) or 'none'}")


if __name__ == "__main__":
    main()
