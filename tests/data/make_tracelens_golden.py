"""Regenerate tests/data/tracelens_golden.json: TraceLens' own per-op FLOPs and bytes, from the per-op perf report
CSVs committed in its repository's tests (github.com/AMD-AGI/TraceLens, MIT licence).

    git clone https://github.com/AMD-AGI/TraceLens /tmp/TraceLens
    python tests/data/make_tracelens_golden.py /tmp/TraceLens

TraceLens' perf report has one CSV per op category (GEMM.csv, BinaryElementwise.csv, Reduce_fwd.csv, ...) with, per
unique op call, the Kineto arguments it read ('Input Dims_first', 'Input type_first', 'Concrete Inputs_first') and
what its perf model made of them ('GFLOPS_first' in 1e9 FLOPs, 'Data Moved (MB)_first' in MiB). Each unique
(op, arguments) is kept once, with at most PER_OP calls per op name and category so the file stays small;
tests/test_cost_model.py runs tracesql's op_flops/op_bytes on the same arguments and compares.
"""

from __future__ import annotations

import ast
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).with_name("tracelens_golden.json")
CATEGORIES = ("GEMM", "CONV_fwd", "CONV_bwd", "SDPA_fwd", "SDPA_bwd", "BinaryElementwise", "UnaryElementwise",
              "Reduce_fwd", "Reduce_bwd", "Normalization", "Normalization_fwd", "RMSNorm_fwd")
PER_OP = 4


def _literal(text: str):
    return ast.literal_eval(text) if text else None


def main(repo: Path) -> None:
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    files = [str(f.relative_to(repo)) for f in (repo / "tests" / "traces").rglob("*.csv")]
    rows, seen, per_op = [], set(), {}
    for path in sorted(files):
        parts = Path(path)
        if not parts.parent.name.endswith("perf_report_csvs") or parts.stem not in CATEGORIES:
            continue
        text = (repo / path).read_text()
        for r in csv.DictReader(io.StringIO(text)):
            dims, types, concrete = (r.get("Input Dims_first"), r.get("Input type_first"),
                                     r.get("Concrete Inputs_first"))
            if not dims or not r.get("GFLOPS_first") or not r.get("Data Moved (MB)_first"):
                continue
            if parts.stem.endswith("_bwd") and "backward" not in r["name"]:
                continue  # TraceLens models the backward of this forward op: not what the op itself costs
            key = (r["name"], dims, types, concrete)
            if key in seen or per_op.get((parts.stem, r["name"]), 0) >= PER_OP:
                continue
            seen.add(key)
            per_op[(parts.stem, r["name"])] = per_op.get((parts.stem, r["name"]), 0) + 1
            rows.append({
                "source": path, "category": parts.stem, "name": r["name"],
                "input_dims": _literal(dims), "input_types": _literal(types),
                "concrete_inputs": _literal(concrete) if concrete else None,
                "tracelens_flops": float(r["GFLOPS_first"]) * 1e9,
                "tracelens_bytes": float(r["Data Moved (MB)_first"]) * 2**20,
            })
    OUT.write_text(json.dumps({"tracelens_commit": commit, "rows": rows}, indent=1) + "\n")
    print(f"{OUT}: {len(rows)} op calls from TraceLens {commit[:10]}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/TraceLens"))
