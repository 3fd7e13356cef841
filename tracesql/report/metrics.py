"""The report's metrics: what each one is, and its values per run and per rank, taken from the curated queries.

Every number here comes out of a query in queries/ run on the fleet (all runs in one DuckDB session); this module
only picks columns and aggregates ranks into a run (sums of nanoseconds before ratios, maxima of peaks).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .. import labels, queries, steady

DIFFS_SHOWN = 20  # regressed runs explained with a diff (the most regressed first)


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # 'time' (ns), 'percent', 'bytes', 'bandwidth' (GB/s)
    worse: str | None  # 'higher' or 'lower': the direction of a regression; None: no direction
    doc: str
    per_rank: bool = True


METRICS = {m.name: m for m in [
    Metric("step_time_p50", "time", "higher", "median step time: per step the slowest rank's device window "
           "(`steps` query: device_ns, else cpu_ns), median over steps"),
    Metric("step_time_p90", "time", "higher", "90th percentile of the same step times"),
    Metric("overlap", "percent", "lower", "communication time hidden under compute (`overlap`: "
           "Σ overlap_ns / Σ comm_ns over ranks)"),
    Metric("exposed_comm", "percent", "higher", "communication not hidden by compute, share of the device window "
           "(`temporal_breakdown`: Σ exposed_comm_ns / Σ window_ns)"),
    Metric("idle", "percent", "higher", "device idle time, share of the window (`temporal_breakdown`)"),
    Metric("compute", "percent", None, "device time with compute running, share of the window "
           "(`temporal_breakdown`)"),
    Metric("largest_bubble", "time", "higher", "longest idle gap of any device (`bubbles_largest`, scope device)"),
    Metric("busbw", "bandwidth", "lower", "bus bandwidth of the collectives, GB/s, weighted by their duration "
           "(`collectives`: Σ busbw·duration / Σ duration over instances with a size)", per_rank=False),
    Metric("peak_memory", "bytes", "higher", "highest allocated device memory (`memory`: peak_allocated_bytes, "
           "accelerator devices, else host)"),
    Metric("mfu", "percent", "lower", "model FLOPs utilization, mean over steps (`mfu`; needs --model-flops or "
           "--params with --tokens-per-step)", per_rank=False),
    Metric("hfu", "percent", "lower", "hardware FLOPs utilization from the FLOPs in the trace, mean over steps (`mfu`; computed with the MFU options)",
           per_rank=False),
]}


def display(metric: str, value) -> str:
    """A value in the unit people read it in (ms, GB, %)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "–"
    kind = METRICS[metric].kind
    if kind == "time":
        return f"{value / 1e6:,.2f} ms" if value >= 1e5 else f"{value / 1e3:,.1f} µs"
    if kind == "percent":
        return f"{value:.2f} %"
    if kind == "bytes":
        return f"{value / 2**30:,.2f} GiB" if value >= 2**30 else f"{value / 2**20:,.1f} MiB"
    return f"{value:,.3g} GB/s"


def change(metric: str, value, base) -> str:
    """The change from `base` to `value` as people read it: relative for amounts, points for percentages."""
    if value is None or base is None or pd.isna(value) or pd.isna(base):
        return "–"
    if METRICS[metric].kind == "percent":
        return f"{value - base:+.2f} pp"
    return f"{(value - base) / abs(base) * 100:+.1f} %" if base else "–"


@dataclass
class FleetMetrics:
    runs: pd.DataFrame  # one row per run: run_id, ranks, start_ns, formats, devices + a column per metric
    ranks: pd.DataFrame  # one row per (run_id, rank): the per-rank metrics
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # query outputs kept for the report's tables

    @classmethod
    def concat(cls, parts: list["FleetMetrics"]) -> "FleetMetrics":
        """The metrics of several groups of runs as one (the groups hold different runs)."""
        if len(parts) == 1:
            return parts[0]

        def stack(frames):
            kept = [f for f in frames if len(f)] or frames[:1]
            return pd.concat(kept, ignore_index=True)

        return cls(runs=stack([p.runs for p in parts]), ranks=stack([p.ranks for p in parts]),
                   tables={k: stack([p.tables[k] for p in parts]) for k in parts[0].tables})


def _run(con, name: str, **params) -> pd.DataFrame:
    return queries.run(con, queries.find(name), params).df()


def _quantiles(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """step_time_p50 and step_time_p90 of step_ns per group (linear interpolation, as Series.quantile), in one
    vectorized pass rather than a Python call per group."""
    grouped = frame.groupby(keys).step_ns
    return pd.DataFrame({"step_time_p50": grouped.quantile(0.5), "step_time_p90": grouped.quantile(0.9)})


PER_STEP = {"step_time_p50": "step_ns", "step_time_p90": "step_ns", "exposed_comm": "exposed_comm",
            "idle": "idle", "compute": "compute"}  # the metrics with a value per step: their within-run noise


def run_labels(con) -> pd.DataFrame:
    """run_id, labels (dict), given (dict: the labels that identify a configuration, tracesql.labels.GIVEN)."""
    import json

    rows = con.sql("SELECT run_id, CAST(labels AS VARCHAR), CAST(label_sources AS VARCHAR) FROM runs").fetchall()
    out = []
    for run_id, text, sources in rows:
        found, origin = json.loads(text or "{}"), json.loads(sources or "{}")
        out.append({"run_id": run_id, "labels": found,
                    "given": {k: v for k, v in found.items() if origin.get(k) in labels.GIVEN}})
    return pd.DataFrame(out, columns=["run_id", "labels", "given"])


def _per_step_shares(con) -> pd.DataFrame:
    """run_id, step, and the shares of each step's device window (ranks summed): the per-step values of
    exposed_comm, idle and compute."""
    rows = _run(con, "temporal_breakdown", per="step")
    rows = rows[rows.step.notna()]
    sums = rows.groupby(["run_id", "step"], as_index=False)[["window_ns", "compute_ns", "exposed_comm_ns",
                                                             "idle_ns"]].sum()
    window = sums.window_ns.where(sums.window_ns > 0)
    return pd.DataFrame({"run_id": sums.run_id, "step": sums.step, **{
        name: 100 * sums[f"{name}_ns"] / window for name in ("exposed_comm", "idle", "compute")}})


def collect(con, *, mfu_params: dict | None = None, top: int = 10,
            steps: steady.Steps = steady.Steps("all")) -> FleetMetrics:
    """Run the curated queries on `con` (a fleet), restricted to the steps that count (`steps`), and derive every
    metric per run and per rank."""
    used = steady.apply(con, steps)
    info = con.sql("""
        SELECT r.run_id, count(DISTINCT r.rank) AS ranks, min(r.trace_start_ns) AS start_ns,
            max(r.trace_end_ns) AS end_ns,
            string_agg(DISTINCT r.source_format, ', ' ORDER BY r.source_format) AS formats,
            (SELECT string_agg(DISTINCT d.name, ', ' ORDER BY d.name) FROM devices d WHERE d.run_id = r.run_id)
                AS devices
        FROM ranks r GROUP BY r.run_id""").df()
    steps = _run(con, "steps")
    breakdown = _run(con, "temporal_breakdown")
    overlap = _run(con, "overlap")
    bubbles = _run(con, "bubbles_largest", top=top)
    hotspots = _run(con, "hotspots", top=top)
    collectives = _run(con, "collectives")
    memory = _run(con, "memory")
    mfu = _run(con, "mfu", **mfu_params) if mfu_params else pd.DataFrame(columns=["run_id", "mfu", "hfu"])

    ranks = info[["run_id"]].merge(con.sql("SELECT DISTINCT run_id, rank FROM ranks").df(), on="run_id")

    # steps: per step the slowest rank sets the pace; per rank its own steps
    steps["step_ns"] = steps.device_ns.astype("float64").fillna(steps.cpu_ns.astype("float64"))
    per_step = steady.step_times(steps)
    run_steps = _quantiles(per_step, ["run_id"]).join(per_step.groupby("run_id").step_ns.count().rename("steps"))
    rank_steps = _quantiles(steps, ["run_id", "rank"])

    sums = breakdown.groupby("run_id")[["window_ns", "compute_ns", "exposed_comm_ns", "idle_ns"]].sum()
    run_time = pd.DataFrame({name: 100 * sums[f"{name}_ns"] / sums.window_ns.where(sums.window_ns > 0)
                             for name in ("exposed_comm", "idle", "compute")})
    rank_time = breakdown.groupby(["run_id", "rank"])[["window_ns", "compute_ns", "exposed_comm_ns", "idle_ns"]].sum()
    rank_time = pd.DataFrame({name: 100 * rank_time[f"{name}_ns"] / rank_time.window_ns.where(rank_time.window_ns > 0)
                              for name in ("exposed_comm", "idle", "compute")})

    ov = overlap.groupby("run_id")[["overlap_ns", "comm_ns"]].sum()
    run_overlap = (100 * ov.overlap_ns / ov.comm_ns.where(ov.comm_ns > 0)).rename("overlap")
    ov_rank = overlap.groupby(["run_id", "rank"])[["overlap_ns", "comm_ns"]].sum()
    rank_overlap = (100 * ov_rank.overlap_ns / ov_rank.comm_ns.where(ov_rank.comm_ns > 0)).rename("overlap")

    run_bubble = bubbles.groupby("run_id").dur.max().rename("largest_bubble")
    rank_bubble = bubbles.groupby(["run_id", "rank"]).dur.max().rename("largest_bubble")

    sized = collectives.dropna(subset=["busbw_gbps"])
    sized = sized.assign(weighted=sized.busbw_gbps * sized.duration_ns)
    bw = sized.groupby("run_id")[["weighted", "duration_ns"]].sum()
    run_busbw = (bw.weighted / bw.duration_ns.where(bw.duration_ns > 0)).rename("busbw")

    # an accelerator's memory when the trace has it, else the host's
    memory["accelerator"] = memory.device_type != "cpu"
    mem = memory[memory.accelerator == memory.groupby("run_id").accelerator.transform("max")]
    run_memory = mem.groupby("run_id").peak_allocated_bytes.max().rename("peak_memory")
    rank_memory = mem.groupby(["run_id", "rank"]).peak_allocated_bytes.max().rename("peak_memory")

    run_flops = (100 * mfu.groupby("run_id")[["mfu", "hfu"]].mean()) if len(mfu) else pd.DataFrame(
        columns=["mfu", "hfu"], dtype="float64")

    runs = info.set_index("run_id").join([run_steps, run_time, run_overlap, run_bubble, run_busbw, run_memory,
                                          run_flops]).reset_index()
    ranks = ranks.set_index(["run_id", "rank"]).join([rank_steps, rank_time, rank_overlap, rank_bubble,
                                                      rank_memory]).reset_index()
    for frame in (runs, ranks):
        for name in METRICS:
            if name in frame:
                frame[name] = frame[name].astype("float64")
    runs["steps"] = runs["steps"].fillna(0).astype("int64")
    runs["steps_used"] = runs.run_id.map(used).fillna("no steps")
    found = run_labels(con).set_index("run_id")
    runs["labels"] = [found.labels.get(r, {}) for r in runs.run_id]  # older runs (no runs row): none
    runs["given"] = [found.given.get(r, {}) for r in runs.run_id]
    samples = per_step.merge(_per_step_shares(con), on=["run_id", "step"], how="outer")
    return FleetMetrics(runs=runs, ranks=ranks, tables={
        "hotspots": hotspots, "bubbles": bubbles, "collectives": collectives, "memory": memory,
        "breakdown": breakdown, "steps": steps, "mfu": mfu, "per_step": samples})
