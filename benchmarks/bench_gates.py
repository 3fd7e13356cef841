#!/usr/bin/env python3
"""Gate benchmark (issue 30): do noise-aware gates trip on noise? A fleet made from a real bundled run by scaling
its timeline step by step, then every replicate gated against the others, and runs with planted regressions.

The fleet: the bundled torch_gloo_2rank run (2 ranks, gloo, 3 ProfilerSteps), tiled --copies times in time
(benchmarks/tile_trace.py: 3 × copies steps) and ingested once with the label config=gloo2. Each run of the fleet
is that run with its timeline warped per step: every timestamp of step k (of every table, each rank's ProfilerStep
ranges as the knots) is stretched by f_k = R · (1 + e_k), e_k ~ Normal(0, s), s drawn per run from 1–2 % (the
step noise), R = 1 for the --replicates replicates and 1.03, 1.10 for the two planted regressions; durations
follow (dur' = W(ts + dur) − W(ts)), so the steps, slices and ops agree as in a recorded run.

Gate: --gate (default step_time_p50>+1%), as `tracesql report --fail-on` evaluates it, on each replicate against
the other replicates (its label set), and on each regressed run against all the replicates:
  noise-aware (the default; --confidence 0.99) and threshold-only (--strict), false alarms and catches of each.

    python benchmarks/bench_gates.py                      # 50 replicates, 4 copies (12 steps per run)
    python benchmarks/bench_gates.py --replicates 10 --json out.json
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(HERE)]

import tracesql  # noqa: E402
from copies import ABSOLUTE  # noqa: E402
from tile_trace import tile  # noqa: E402
from tracesql import engine, schema, store  # noqa: E402
from tracesql.report import collect_grouped, gate_run, gates  # noqa: E402

SOURCE = REPO / "datasets" / "torch_gloo_2rank"
PAIRED = {"dur": "ts", "cpu_dur": "cpu_ts", "device_dur": "device_ts"}  # a duration and the time it starts at
SCALED = {"self_dur": "ts", "device_self_ns": "ts", "device_total_ns": "ts", "kernel_dur": "cpu_ts"}  # by slope
REGRESSIONS = (0.03, 0.10)


def base_run(scratch: Path, copies: int) -> Path:
    """The bundled run tiled `copies` times (3 · copies steps), ingested once with the label config=gloo2."""
    raw = scratch / f"gloo2-x{copies}"
    run = scratch / f"gloo2-x{copies}-run"
    if store.is_run(run):
        return run
    raw.mkdir(parents=True, exist_ok=True)
    for src in sorted(SOURCE.glob("*.json.gz")):
        size = len(gzip.decompress(src.read_bytes()))
        out = raw / src.name.removesuffix(".gz")
        tile(str(src), str(out), min_bytes=size * (copies - 1) + 1, quiet=True)
        Path(str(out) + ".meta.json").unlink()
    tracesql.ingest([raw], run, label=["config=gloo2"])
    return run


class Warp:
    """A rank's timeline stretched step by step: knots at its steps' starts (and the last step's end), step k's
    stretch factors[k]; before the first step nothing moves, after the last everything shifts by the total."""

    def __init__(self, starts: np.ndarray, end: int, factors: np.ndarray):
        self.x0 = int(starts[0])
        x = np.append(starts, end).astype("int64") - self.x0
        y = np.concatenate([[0.0], np.cumsum(np.diff(x) * factors)])
        self.x, self.y, self.factors = x.astype("float64"), y, factors

    def __call__(self, t: np.ndarray) -> np.ndarray:
        rel = (t - self.x0).astype("float64")
        inside = np.interp(rel, self.x, self.y)
        out = np.where(rel < 0, rel, np.where(rel > self.x[-1], rel + self.y[-1] - self.x[-1], inside))
        return np.round(out).astype("int64") + self.x0

    def slope(self, t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(self.x, (t - self.x0).astype("float64"), side="right") - 1
        return np.where((k >= 0) & (k < len(self.factors)), self.factors[np.clip(k, 0, len(self.factors) - 1)], 1.0)


def _warped(table: pa.Table, run_id: str, warp: Warp) -> pa.Table:
    columns = {}
    for name in table.column_names:
        col = table.column(name)
        if name == "run_id":
            col = pa.array([run_id] * len(table), col.type)
        elif name in PAIRED or name in SCALED or name in ABSOLUTE:
            t = table.column(PAIRED.get(name) or SCALED.get(name) or name).to_numpy(zero_copy_only=False)
            valid = ~np.isnan(t.astype("float64"))
            t_int = np.where(valid, t, 0).astype("int64")
            v = col.to_numpy(zero_copy_only=False).astype("float64")
            if name in PAIRED:
                new = warp(t_int + np.nan_to_num(v).astype("int64")) - warp(t_int)
            elif name in SCALED:
                new = np.round(np.nan_to_num(v) * warp.slope(t_int)).astype("int64")
            else:
                new = warp(t_int)
            keep = valid & ~np.isnan(v)
            col = pa.array(np.where(keep, new, 0), pa.int64(), mask=~keep).cast(col.type)
        columns[name] = col
    return pa.Table.from_pydict(columns, schema=table.schema)


def make_run(base: Path, out: Path, run_id: str, factors: dict[int, float]) -> Path:
    """A copy of `base` named run_id, each step's timeline stretched by factors[step]."""
    manifest = store.load_manifest(base)
    con = tracesql.connect(base)
    steps = con.sql("SELECT rank, step, ts, dur FROM steps ORDER BY rank, step").df()
    con.close()
    staging = store.new_staging(out)
    for rel in store.parquet_files(base):
        table_name = rel.split("/")[0]
        data = pq.read_table(base / rel)
        if table_name in schema.RUN_TABLES or "rank" not in data.column_names or len(data) == 0:
            data = data.set_column(data.column_names.index("run_id"), "run_id",
                                   pa.array([run_id] * len(data), data.column("run_id").type))
        else:
            (rank,) = set(data.column("rank").to_pylist())
            mine = steps[steps["rank"] == rank]
            warp = Warp(mine.ts.to_numpy("int64"), int((mine.ts + mine.dur).iloc[-1]),
                        np.array([factors[int(s)] for s in mine.step]))
            data = _warped(data, run_id, warp)
        (staging / table_name).mkdir(exist_ok=True)
        pq.write_table(data, staging / rel)
    store.publish(staging, out, {**{k: manifest[k] for k in ("sources", "warnings", "labels")}, "run_id": run_id},
                  engine.init_sql)
    return out


def make_fleet(scratch: Path, replicates: int, copies: int, seed: int) -> tuple[list[Path], list[str], list[str]]:
    base = base_run(scratch, copies)
    con = tracesql.connect(base)
    step_numbers = [int(r[0]) for r in con.sql("SELECT DISTINCT step FROM steps ORDER BY 1").fetchall()]
    con.close()
    rng = np.random.default_rng(seed)
    fleet = scratch / f"fleet-{replicates}-{copies}-{seed}"
    shutil.rmtree(fleet, ignore_errors=True)
    runs, reps, regressed = [], [], []
    plan = [(f"rep-{i:03d}", 1.0) for i in range(replicates)] + [(f"reg-{int(r * 100)}pct", 1 + r) for r in REGRESSIONS]
    for run_id, stretch in plan:
        noise = rng.uniform(0.01, 0.02)
        factors = {s: stretch * (1 + rng.normal(0, noise)) for s in step_numbers}
        runs.append(make_run(base, fleet / run_id, run_id, factors))
        (reps if stretch == 1.0 else regressed).append(run_id)
    return runs, reps, regressed


def evaluate(runs: list[Path], reps: list[str], regressed: list[str], gate_text: str, confidence: float) -> dict:
    gate = gates.parse(gate_text)
    fleet = collect_grouped(runs)
    result = {"gate": gate_text, "confidence": confidence, "replicates": len(reps),
              "steps_per_run": int(fleet.runs.steps.median())}
    for mode, strict in (("noise_aware", False), ("threshold_only", True)):
        alarms = [r for r in reps if not gate_run([gate], fleet, r, [o for o in reps if o != r], confidence,
                                                  strict)[0].passed]
        caught = {r: gate_run([gate], fleet, r, reps, confidence, strict)[0] for r in regressed}
        result[mode] = {"false_alarms": len(alarms), "alarmed": alarms,
                        "caught": {r: not v.passed for r, v in caught.items()},
                        "reasons": {r: v.reason for r, v in caught.items()}}
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=50)
    parser.add_argument("--copies", type=int, default=4, help="tiles of the bundled run: 3 steps each")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gate", default="step_time_p50>+1%")
    parser.add_argument("--confidence", type=float, default=0.99)
    parser.add_argument("--scratch", type=Path, help="where the fleet is written (default: a temporary folder)")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="bench-gates-"))
    t0 = time.process_time()
    runs, reps, regressed = make_fleet(scratch, args.replicates, args.copies, args.seed)
    made = time.process_time() - t0
    result = evaluate(runs, reps, regressed, args.gate, args.confidence)
    result["cpu_s"] = {"fleet": round(made, 1), "gates": round(time.process_time() - t0 - made, 1)}
    print(f"fleet: {len(reps)} replicates + {len(regressed)} planted regressions "
          f"({', '.join(f'+{r:.0%}' for r in REGRESSIONS)}), {result['steps_per_run']} steps per run, "
          f"step noise 1–2 %; gate {args.gate}")
    print(f"{'gate':<16} {'false alarms':>14} " + " ".join(f"{r:>10}" for r in regressed))
    for mode in ("noise_aware", "threshold_only"):
        row = result[mode]
        print(f"{mode.replace('_', '-'):<16} {row['false_alarms']:>6} of {len(reps):<5} "
              + " ".join(f"{'caught' if row['caught'][r] else 'MISSED':>10}" for r in regressed))
    for r in regressed:
        print(f"  {result['noise_aware']['reasons'][r]}")
    print(f"CPU s: fleet {result['cpu_s']['fleet']}, gates {result['cpu_s']['gates']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
