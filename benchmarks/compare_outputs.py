#!/usr/bin/env python3
"""Every table and every curated query's rows on every bundled and corpus trace, snapshotted and compared.

Any change to how numbers are computed is checked with it: snapshot with the code before the change, snapshot
with the code after, diff the two, and explain each difference.

    # the code to snapshot is the tracesql that Python imports: point PYTHONPATH at a checkout of the old commit
    git worktree add /tmp/before <commit>
    PYTHONPATH=/tmp/before python benchmarks/compare_outputs.py snapshot /tmp/snap-before
    python benchmarks/compare_outputs.py snapshot /tmp/snap-after
    python benchmarks/compare_outputs.py diff /tmp/snap-before /tmp/snap-after

A snapshot holds, per trace (each folder of `datasets/` is one run, each corpus trace file one run):
`tables/<trace>/<table>.parquet` and `queries/<trace>/<query>[__<variant>].parquet`, plus `timings.csv`
(ingest and query seconds). Queries run with their defaults and with each variant of VARIANTS whose parameters the
query takes (new parameters of the code under test are picked up, old snapshots simply lack them); `findings` (all
rules, ranked) is saved as the query `findings`, with its defaults and with FINDINGS_VARIANTS. `--queries REGEX`
keeps the queries (and `findings`) whose name matches and skips the tables.

`diff` compares each file present in both snapshots as a multiset of rows (order is ignored; doubles are rounded
to 9 significant digits) over the columns both have, and reports added/removed columns, tables, queries and
traces. Exit status 0 when everything is identical, 1 otherwise.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import re
import shutil
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(os.environ.get("TRACESQL_CORPUS", REPO.parent / "shared" / "corpus"))

HTA = {"class_scheme": "hta", "analysis_window": "hta", "time_unit_ns": 1000}
#: parameter sets that take another path through a query than its defaults; a set is used for a query when the
#: query takes all its parameters (and the query is listed in ONLY, for sets that only some accept)
VARIANTS = {
    "step": {"per": "step"},
    "pg": {"per": "process_group"},
    "hta": HTA,
    "device": {"scope": "device"},
    "levels": {"levels": "kernel,kernel_family,op,op_args"},
    "top": {"op_level": "top"},
    "mfu": {"model_flops_per_step": 1e13},
    "formula": {"model_flops_per_step": 1e13, "flops_source": "formula"},
    "torch": {"attention_convention": "torch"},
    "class": {"per": "class"},
    "whatif": {"faster": "gemm|aten::mm", "faster_pct": 30, "hide_communication": 1, "no_launch_overhead": 1},
    "syncs": {"remove_syncs": 1},
    "straggler": {"straggler_to_median": 1},
}
#: findings' variants: every rule that fires, also below the default saving threshold
FINDINGS_VARIANTS = {"all": {"min_saving_pct": 0}}
ONLY = {"pg": ("overlap",)}


def traces() -> dict[str, Path]:
    """name -> source: every bundled dataset folder and every corpus trace file."""
    from tracesql.readers import trace_suffixes

    found = {f"datasets/{p.name}": p for p in sorted((REPO / "datasets").iterdir())
             if p.is_dir() and p.name != "generators"}
    if CORPUS.exists():
        for p in sorted(CORPUS.rglob("*")):
            if p.is_file() and p.name.endswith(trace_suffixes()):
                found[f"corpus/{p.relative_to(CORPUS)}"] = p
    return found


def _key(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _forget_walks(critical_path) -> None:
    """Each query's rows as a process of its own gets them: the critical path's walks and plans a process keeps
    (tracesql/critical_path.py) are forgotten before each query."""
    critical_path._WALKED.clear()
    critical_path._PLANS.clear()


def snapshot(out: Path, only: str | None, only_queries: str | None = None) -> None:
    import tracesql
    from tracesql import critical_path, findings, queries, schema

    print(f"tracesql from {Path(tracesql.__file__).parent}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    runs = out / "runs"
    timings = []
    for name, source in traces().items():
        if only and not re.search(only, name):
            continue
        key = _key(name)
        run = runs / key
        shutil.rmtree(run, ignore_errors=True)
        start = time.perf_counter()
        try:
            tracesql.ingest([source], run)
        except Exception as e:  # a trace the code refuses is a result too
            (out / "errors").mkdir(exist_ok=True)
            (out / "errors" / f"{key}.txt").write_text(f"ingest: {type(e).__name__}: {e}\n")
            print(f"{name}: ingest failed: {e}", flush=True)
            continue
        timings.append((name, "ingest", time.perf_counter() - start))
        con = tracesql.connect(run)  # one session per trace: each query sets every one of its parameters
        if only_queries is None:
            tables = out / "tables" / key
            tables.mkdir(parents=True, exist_ok=True)
            for table in schema.TABLES:
                con.execute(f"COPY (SELECT * FROM {table}) TO '{tables / table}.parquet' (FORMAT parquet)")
        results = out / "queries" / key
        results.mkdir(parents=True, exist_ok=True)
        for query in queries.catalogue():
            if only_queries and not re.search(only_queries, query.name):
                continue
            # a variant applies where the query takes its parameters with these values (modules: per = type|instance)
            variants = {"": {}} | {v: p for v, p in VARIANTS.items()
                                   if set(p) <= set(query.params) and query.name in ONLY.get(v, (query.name,))
                                   and not any(query.params[k].check(x) for k, x in p.items())}
            for variant, params in variants.items():
                file = results / (query.name + (f"__{variant}" if variant else "") + ".parquet")
                _forget_walks(critical_path)
                start = time.perf_counter()
                try:
                    rel = queries.run(con, query, params)
                    rel.write_parquet(str(file))
                except Exception as e:
                    file.with_suffix(".error.txt").write_text(f"{type(e).__name__}: {e}\n")
                timings.append((name, file.stem, time.perf_counter() - start))
        for variant, params in ({"": {}} | FINDINGS_VARIANTS).items():
            if only_queries and not re.search(only_queries, "findings"):
                break
            file = results / ("findings" + (f"__{variant}" if variant else "") + ".parquet")
            _forget_walks(critical_path)
            start = time.perf_counter()
            try:
                findings.run(con, "RUN", params).write_parquet(str(file))
            except Exception as e:
                file.with_suffix(".error.txt").write_text(f"{type(e).__name__}: {e}\n")
            timings.append((name, file.stem, time.perf_counter() - start))
        con.close()
        print(f"{name}: done", flush=True)
        shutil.rmtree(run, ignore_errors=True)
    with open(out / "timings.csv", "a", newline="") as f:
        csv.writer(f).writerows(timings)


def _columns(con, file: Path) -> dict[str, str]:
    return {r[0]: r[1] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet('{file}')").fetchall()}


def _normalized(name: str, type_: str) -> str:
    """The column as compared: doubles to 9 significant digits (sums in another order differ in the last bits)."""
    q = f'"{name}"'
    if type_ in ("DOUBLE", "FLOAT"):
        return (f"CASE WHEN {q} IS NULL OR isnan({q}) OR isinf({q}) OR {q} = 0 THEN {q} "
                f"ELSE round({q}, 8 - CAST(floor(log10(abs({q}))) AS INTEGER)) END AS {q}")
    return q


def diff(a: Path, b: Path, examples: int) -> int:
    import duckdb

    con = duckdb.connect()
    differences = 0

    def files(root: Path) -> set[str]:
        return {str(p.relative_to(root)) for p in root.rglob("*.parquet") if not p.is_relative_to(root / "runs")}

    def errors(root: Path) -> dict[str, str]:
        return {str(p.relative_to(root)): p.read_text().strip() for p in root.rglob("*.txt")}

    fa, fb = files(a), files(b)
    ea, eb = errors(a), errors(b)
    for rel in sorted(set(ea) | set(eb)):
        if ea.get(rel) != eb.get(rel):
            differences += 1
            print(f"~ {rel}: error before: {ea.get(rel)!r}; after: {eb.get(rel)!r}")
    for rel in sorted(fa - fb):
        differences += 1
        print(f"- {rel}: only before")
    for rel in sorted(fb - fa):
        print(f"+ {rel}: only after (new)")
    for rel in sorted(fa & fb):
        ca, cb = _columns(con, a / rel), _columns(con, b / rel)
        common = [c for c in ca if c in cb]
        notes = []
        if set(ca) - set(cb):
            notes.append(f"columns removed: {sorted(set(ca) - set(cb))}")
        if set(cb) - set(ca):
            notes.append(f"columns added: {sorted(set(cb) - set(ca))}")
        if not common:
            print(f"~ {rel}: no common columns; {'; '.join(notes)}")
            differences += 1
            continue
        sel_a = ", ".join(_normalized(c, ca[c]) for c in common)
        sel_b = ", ".join(_normalized(c, cb[c]) for c in common)
        left = f"SELECT {sel_a} FROM read_parquet('{a / rel}')"
        right = f"SELECT {sel_b} FROM read_parquet('{b / rel}')"
        only_a = con.execute(f"SELECT count(*) FROM ({left} EXCEPT ALL {right})").fetchone()[0]
        only_b = con.execute(f"SELECT count(*) FROM ({right} EXCEPT ALL {left})").fetchone()[0]
        n_a = con.execute(f"SELECT count(*) FROM ({left})").fetchone()[0]
        n_b = con.execute(f"SELECT count(*) FROM ({right})").fetchone()[0]
        if only_a or only_b:
            differences += 1
            print(f"~ {rel}: {n_a} -> {n_b} rows, {only_a} only before, {only_b} only after"
                  + (f"; {'; '.join(notes)}" if notes else ""))
            for label, x, y in (("before", left, right), ("after", right, left)):
                for row in con.execute(f"SELECT * FROM ({x} EXCEPT ALL {y}) LIMIT {examples}").fetchall():
                    print(f"    {label}: {dict(zip(common, row))}"[:400])
        elif notes:
            print(f"= {rel}: same rows; {'; '.join(notes)}")
    print(f"\n{len(fa & fb)} files compared, {differences} differ; {len(fb - fa)} new, {len(fa - fb)} gone")
    return 1 if differences else 0


def timings(a: Path, b: Path) -> None:
    """Side by side: total seconds per query variant (over all traces) and ingest, before and after."""
    def load(root: Path) -> dict[str, float]:
        totals: dict[str, float] = {}
        with open(root / "timings.csv") as f:
            for _trace, what, seconds in csv.reader(f):
                totals[what] = totals.get(what, 0.0) + float(seconds)
        return totals

    ta, tb = load(a), load(b)
    print("| work | before s | after s | ratio |\n|---|---|---|---|")
    for what in sorted(set(ta) | set(tb), key=lambda w: -max(ta.get(w, 0), tb.get(w, 0))):
        x, y = ta.get(what, math.nan), tb.get(what, math.nan)
        print(f"| {what} | {x:.2f} | {y:.2f} | {y / x if x else math.nan:.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("snapshot", help="ingest every trace and save every table and query result")
    s.add_argument("out", type=Path)
    s.add_argument("--only", help="regular expression: only traces whose name matches")
    s.add_argument("--queries", help="regular expression: only the queries (and findings) whose name matches, "
                                     "no tables")
    d = sub.add_parser("diff", help="compare two snapshots")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    d.add_argument("--examples", type=int, default=3, help="differing rows shown per file and side")
    t = sub.add_parser("timings", help="ingest and query seconds of two snapshots side by side")
    t.add_argument("before", type=Path)
    t.add_argument("after", type=Path)
    args = parser.parse_args()
    try:
        if args.command == "snapshot":
            snapshot(args.out, args.only, args.queries)
            return 0
        if args.command == "timings":
            timings(args.before, args.after)
            return 0
        return diff(args.before, args.after, args.examples)
    except Exception:
        traceback.print_exc()
        return 2


if __name__ == "__main__":
    sys.exit(main())
