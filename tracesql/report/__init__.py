"""`tracesql report`: metrics of many runs (CI runs, nightlies) from the curated queries, their trend, the
regressions against a baseline with the ops and kernels that explain them (the `diff` query), gates for CI, and
the outputs: an offline HTML page, a Markdown summary, the metrics as JSON and Parquet.

    report = tracesql.report.build(["ci-runs/"], baseline="ci-runs/main-0412", fail_on=["step_time_p50>+5%"])
    report.write("report/")            # index.html, summary.md, metrics.json, metrics.parquet
    report.failed                      # the gates that failed, each with a one-line reason
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .. import engine, findings, labels, queries, steady, store
from ..errors import TraceError
from ..ingestion import find_traces
from . import charts, gates, sweeps
from . import history as kept
from .metrics import DIFFS_SHOWN, METRICS, PER_STEP, FleetMetrics, collect

TRACES_WRITTEN = 10  # regressed runs whose slowest step is written as a Perfetto trace (the most regressed first)
GROUP_RUNS = 50  # runs per DuckDB session when collecting the metrics: memory bounded by a group, not the fleet


def find_runs(targets) -> list[Path]:
    """The runs behind `targets`, in the order given. A run folder is one run; a folder whose subfolders are runs
    or raw trace folders is one run per subfolder (raw ones ingested into the cache, incrementally: only new or
    changed files are read); a folder of trace files is one run."""
    runs: list[Path] = []
    for target in map(Path, targets):
        if not target.exists():
            raise TraceError(target, "no such file or folder")
        subfolders = [] if store.is_run(target) or not target.is_dir() else sorted(
            p for p in target.iterdir() if p.is_dir() and not p.name.startswith("."))
        loose_files = target.is_dir() and any(p.is_file() and not p.name.startswith(".") and _is_trace(p)
                                              for p in target.iterdir())
        if subfolders and not loose_files:
            for sub in subfolders:
                if store.is_run(sub) or any(store.is_run(p) for p in sub.iterdir() if p.is_dir()) or _has_traces(sub):
                    runs += engine.resolve(sub)
        else:
            runs += engine.resolve(target)
    runs = list(dict.fromkeys(r.absolute() for r in runs))
    if not runs:
        raise TraceError(", ".join(map(str, targets)), "no runs and no trace files found")
    return runs


def _is_trace(path: Path) -> bool:
    from ..readers import trace_suffixes

    return path.name.endswith(trace_suffixes())


def _has_traces(folder: Path) -> bool:
    try:
        find_traces([folder])
    except TraceError:
        return False
    return True


@dataclass
class Regression:
    run_id: str
    changes: list[tuple[str, str]]  # (metric, change as read: '+12.3 %', '-11.00 pp') that got worse
    diff: pd.DataFrame | None = None  # the diff query, baseline -> run
    straggler: dict | None = None  # its collective_stragglers row of the rank most often last, when it stands out


@dataclass
class StepTrace:
    """A step written as a Perfetto trace next to the report (perfetto/FILE), and why."""

    why: str  # 'slowest step of the latest run', 'slowest step of a regressed run', ...
    run_id: str
    rank: int
    step: int
    step_ns: float
    file: str  # relative to the report folder
    path: Path  # the run folder
    all_ranks: bool = False  # every rank of the step in one trace (export --all-ranks), not `rank`'s alone


@dataclass
class Report:
    metrics: FleetMetrics
    baseline: str
    focus: str  # the run whose details (timeline, roofline, hotspots) the page shows: the latest
    threshold: float
    gates: list[gates.Gate]
    verdicts: list[gates.Verdict]
    regressions: list[Regression]
    charts: list[tuple[str, str, dict]] = field(default_factory=list)  # (section, title, figure)
    focus_tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    traces: list[StepTrace] = field(default_factory=list)  # written into perfetto/ by write()
    findings: pd.DataFrame | None = None  # the latest run's, largest saving first (tracesql findings)
    steps: str = "all"  # --steps as given
    confidence: float = 0.99
    replicates: dict[str, list[str]] = field(default_factory=dict)  # gated run -> the runs its gates compared with
    sweep: pd.DataFrame | None = None  # one row per configuration (sweeps.table), when runs have given labels
    history: Path | None = None  # --history: write() adds this report's metrics there
    earlier: pd.DataFrame | None = None  # runs of earlier reports (history.earlier_runs) drawn in the trends

    @property
    def failed(self) -> list[gates.Verdict]:
        return [v for v in self.verdicts if not v.passed]

    def write(self, out) -> list[Path]:
        from .render import write

        return write(self, Path(out))


def _straggler(ranks: pd.DataFrame) -> dict | None:
    """The rank most often last at the run's collectives, when it is last at least twice as often as its fair
    share (1 / ranks): a straggler, not chance."""
    if len(ranks) < 2:
        return None
    top = ranks.sort_values("straggler_rank").iloc[0]
    if top.last_share < 2 / len(ranks):
        return None
    return {"rank": int(top["rank"]), "times_last": int(top.times_last), "instances": int(top.instances),
            "ranks": len(ranks), "mean_lateness_ns": float(top.mean_lateness_ns)}


def _findings(path: Path, top: int) -> pd.DataFrame:
    """The run's `top` findings (tracesql findings), largest saving first."""
    con = engine.connect(path, names=findings.names_used())
    try:
        return findings.run(con, str(path)).df().head(top)
    finally:
        con.close()


def baseline_labels(baseline) -> dict[str, str] | None:
    """--baseline as a label set ('dp=4,remat=full'), or None when it names a run (an existing path)."""
    if baseline is None or Path(baseline).exists() or "=" not in str(baseline):
        return None
    return labels.parse_set(str(baseline))


def replicates_of(runs: pd.DataFrame, gated: str, base_id: str | None = None,
                  label_set: dict | None = None) -> list[str]:
    """The runs a gate on `gated` compares with (docs/guides/ci.md): every other run with the gated run's given
    labels; with a baseline run, the runs with that run's labels (the gated run left out, unless it is the only
    one); with a label set, the runs whose labels include it. A run alone in its report is its own baseline."""
    given = runs.set_index("run_id").given
    if label_set is not None:
        found = [r for r in runs.run_id if label_set.items() <= given[r].items()]
    else:
        want = given[base_id if base_id is not None else gated]
        found = [r for r in runs.run_id if given[r] == want]
    others = [r for r in found if r != gated]
    return others or ([gated] if base_id == gated or len(runs) == 1 else [])


def gate_run(parsed: list[gates.Gate], fleet: FleetMetrics, gated: str, replicates: list[str],
             confidence: float, strict: bool) -> list[gates.Verdict]:
    """Every gate on the run `gated` against `replicates` (their pooled steps and their spread)."""
    rows = fleet.runs.set_index("run_id", drop=False)
    samples = fleet.tables["per_step"]
    mine, pooled = samples[samples.run_id == gated], samples[samples.run_id.isin(replicates)]
    verdicts = []
    for g in parsed:
        if g.mode != "value" and not replicates:
            verdicts.append(gates.Verdict(g, gated, False, f"{gated}: no baseline: no other run has its labels "
                                          f"{rows.given[gated] or '{}'} (name one with --baseline RUN or KEY=VALUE)"))
            continue
        base_row = rows.loc[replicates[0]] if replicates else rows.loc[gated]
        noise = None
        if g.mode != "value":
            column = PER_STEP.get(g.metric)
            noise = gates.judge(g, rows.at[gated, g.metric], mine[column] if column else [],
                                pooled[column] if column else [], rows.loc[replicates, g.metric], confidence)
        name = (f"baseline {replicates[0]}" if len(replicates) == 1 else
                f"{len(replicates)} replicate runs ({', '.join(replicates[:3])}{', …' if len(replicates) > 3 else ''})")
        verdicts.append(gates.evaluate(g, rows.loc[gated], base_row, noise, strict, name))
    return verdicts


def build(targets, *, baseline=None, fail_on=(), order: str = "time", gate_runs: str = "latest",
          threshold: float = 5.0, mfu_params: dict | None = None, device: str | None = None,
          top: int = 10, steps: str | None = None, confidence: float = 0.99, strict: bool = False,
          history=None) -> Report:
    """Collect the metrics of every run under `targets` over the steps that count (`steps`: tracesql.steady),
    compare them with the baseline (a run path, or a label set KEY=VALUE,...; default the first run in order)
    and evaluate the gates (`fail_on`, see gates.py) on the latest run (gate_runs='latest') or on every run but
    the baseline ('all'), each against its replicates at `confidence` (see replicates_of, gates.judge).
    `history`: a folder keeping each report's metrics (report.history)."""
    steps_spec = steady.parse(steps)
    if not 0.5 <= confidence < 1:
        raise TraceError(f"--confidence {confidence}", "expected a probability from 0.5 to below 1, e.g. 0.99")
    label_set = baseline_labels(baseline)
    if label_set is not None:
        baseline = None
    parsed = [gates.parse(g) for g in fail_on]
    if any(g.metric in ("mfu",) for g in parsed) and not mfu_params:
        raise TraceError("--fail-on mfu", "MFU needs the model's FLOPs: --model-flops, or --params with "
                                          "--tokens-per-step")
    runs = find_runs(targets)
    base_path = None
    if baseline is not None:
        base_runs = engine.resolve(baseline)
        if len(base_runs) != 1:
            raise TraceError(baseline, f"the baseline must be one run, this holds {len(base_runs)}")
        base_path = base_runs[0].absolute()
        runs = list(dict.fromkeys([base_path, *runs]))
    run_ids = {}
    for run in runs:
        run_id = store.load_manifest(run)["run_id"]
        if run_id in run_ids:
            raise TraceError(run, f"run_id {run_id!r} is also the run_id of {run_ids[run_id]}; runs compared in "
                                  "one report need different run_ids (ingest with --run-id)")
        run_ids[run_id] = run
    paths = {rid: p for rid, p in run_ids.items()}

    flops = dict(mfu_params or {})
    if flops and device:
        flops["device"] = device
    fleet = collect_grouped(runs, mfu_params=flops or None, top=top, steps=steps_spec)
    given = {rid: i for i, rid in enumerate(run_ids)}
    key = fleet.runs.run_id.map(given) if order == "given" else fleet.runs.start_ns
    fleet.runs = fleet.runs.assign(_key=key).sort_values(["_key", "run_id"]).drop(columns="_key")
    fleet.runs.insert(1, "order", range(1, len(fleet.runs) + 1))
    focus = fleet.runs.run_id.iloc[-1]
    if label_set is not None:
        in_set = replicates_of(fleet.runs, focus, label_set=label_set)
        if not in_set:
            raise TraceError(f"--baseline {label_set}", "no run has these labels")
        base_id = in_set[0]
    elif base_path:
        base_id = next(rid for rid, p in paths.items() if p == base_path)
    else:  # the first run sharing the latest run's labels (every run when none has labels), else the first run
        base_id = (replicates_of(fleet.runs, focus) or list(fleet.runs.run_id))[0]
    rows = fleet.runs.set_index("run_id", drop=False)
    base_row = rows.loc[base_id]

    gated = [focus] if gate_runs == "latest" else [r for r in fleet.runs.run_id if r != base_id] or [base_id]
    replicates = {rid: replicates_of(fleet.runs, rid, base_id=base_id if base_path else None, label_set=label_set)
                  for rid in gated}
    verdicts = [v for rid in gated for v in gate_run(parsed, fleet, rid, replicates[rid], confidence, strict)]

    regressions = []
    failed_runs = {v.run_id for v in verdicts if not v.passed}
    for rid in fleet.runs.run_id:
        if rid == base_id:
            continue
        worse = _worse(rows.loc[rid], base_row, threshold)
        if worse or rid in failed_runs:
            regressions.append(Regression(rid, worse))
    # the most regressed (by step time, else in order) are explained with a diff against the baseline
    by_step = sorted(regressions, key=lambda r: -_relative(rows.loc[r.run_id], base_row, "step_time_p50"))
    diff = queries.find("diff")
    explained = by_step[:DIFFS_SHOWN]
    if explained:  # one session for the baseline and the explained runs (not one per pair: a session costs)
        con = engine.connect([paths[base_id]] + [paths[r.run_id] for r in explained])
        try:
            for reg in explained:
                reg.diff = queries.run(con, diff, {"before": base_id, "after": reg.run_id, "top": top}).df()
            stragglers = queries.run(con, queries.find("collective_stragglers")).df()
            for reg in explained:
                reg.straggler = _straggler(stragglers[stragglers.run_id == reg.run_id])
        finally:
            con.close()

    report = Report(fleet, base_id, focus, threshold, parsed, verdicts, regressions, steps=str(steps_spec),
                    confidence=confidence, replicates=replicates)
    _focus_details(report, paths[focus], device, top)
    report.findings = _findings(paths[focus], top)
    _step_traces(report, paths, by_step)
    report.sweep = sweeps.table(fleet.runs)
    if report.sweep is not None:
        figure = charts.sweep(report.sweep)
        if figure:
            report.charts.append(("sweep", "sweep", figure))
    trend_runs = fleet.runs
    if history is not None:
        report.history = Path(history)
        report.earlier = kept.earlier_runs(kept.read(report.history), set(fleet.runs.run_id))
        if len(report.earlier):
            trend_runs = pd.concat([report.earlier, fleet.runs], ignore_index=True).sort_values(
                ["start_ns", "run_id"], kind="stable")
    earlier = set() if report.earlier is None else set(report.earlier.run_id)
    for name in METRICS:
        if name in trend_runs:
            figure = charts.trend(name, trend_runs, base_id, threshold, earlier)
            if figure:
                report.charts.append(("trend", name, figure))
    return report


def collect_grouped(runs: list[Path], *, mfu_params: dict | None = None, top: int = 10,
                    group: int | None = None, steps: steady.Steps = steady.Steps("all")) -> FleetMetrics:
    """collect() over the runs GROUP_RUNS at a time, each group in its own DuckDB session: the same rows as one
    session over the whole fleet (every query is per run), with memory bounded by a group however many runs."""
    group = group or GROUP_RUNS
    parts = []
    for k in range(0, len(runs), group):
        con = engine.connect(runs[k:k + group])
        try:
            parts.append(collect(con, mfu_params=mfu_params, top=top, steps=steps))
        finally:
            con.close()
    return FleetMetrics.concat(parts)


def _slowest_step(steps: pd.DataFrame, run_id: str):
    """(step, rank, step_ns) of the run's slowest step (the slowest rank in it sets its time), or None."""
    mine = steps[(steps.run_id == run_id) & steps.step_ns.notna()]
    if mine.empty:
        return None
    row = mine.sort_values(["step_ns", "step", "rank"], ascending=[False, True, True]).iloc[0]
    return int(row.step), int(row["rank"]), float(row.step_ns)


def _step_traces(report: Report, paths: dict, regressed: list[Regression]) -> None:
    """The steps the report links to a Perfetto trace: the latest run's slowest step, the baseline's (to open
    beside it), and the slowest step of each of the TRACES_WRITTEN most regressed runs."""
    steps = report.metrics.tables["steps"]
    wanted = [("slowest step of the latest run", report.focus), ("slowest step of the baseline", report.baseline)]
    wanted += [("slowest step of a regressed run", r.run_id) for r in regressed[:TRACES_WRITTEN]]
    seen, files = set(), set()
    for why, rid in wanted:
        if rid in seen:
            continue
        seen.add(rid)
        found = _slowest_step(steps, rid)
        if found is None:
            continue
        step, rank, ns = found
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in rid)[:80].lstrip(".") or "run"
        file = f"perfetto/{safe}-rank{rank}-step{step}.pftrace"
        if file in files:  # two run_ids that read the same once made safe for a file name
            file = f"perfetto/{safe}-{len(files)}-rank{rank}-step{step}.pftrace"
        files.add(file)
        report.traces.append(StepTrace(why, rid, rank, step, ns, file, paths[rid]))
        if rid == report.focus and len(report.metrics.ranks[report.metrics.ranks.run_id == rid]) > 1:
            report.traces.append(StepTrace("every rank in the slowest step of the latest run", rid, rank, step, ns,
                                           file.replace(f"-rank{rank}-", "-all-ranks-"), paths[rid], True))


def _relative(run, base, metric) -> float:
    value, before = run.get(metric), base.get(metric)
    if pd.isna(value) or pd.isna(before) or not before:
        return float("-inf")
    return (value - before) / abs(before)


def _worse(run, base, threshold: float) -> list[tuple[str, str]]:
    """The metrics of `run` worse than the baseline's by more than threshold (% of it, or pp for percentages)."""
    from .metrics import change

    out = []
    for name, m in METRICS.items():
        value, before = run.get(name), base.get(name)
        if m.worse is None or pd.isna(value) or pd.isna(before):
            continue
        delta = value - before if m.kind == "percent" else ((value - before) / abs(before) * 100 if before else 0)
        if (delta > threshold) if m.worse == "higher" else (delta < -threshold):
            out.append((name, change(name, value, before)))
    return out


def _heatmaps(report: Report, con, steps: pd.DataFrame, rid: str) -> None:
    """Rank × step heatmaps of the latest run: step time (each rank's own), exposed communication and idle (shares
    of the step's device window, `temporal_breakdown per=step`, devices of a rank summed)."""
    if steps.empty:
        return
    figure = charts.heatmap(steps[["rank", "step", "step_ns"]].rename(columns={"step_ns": "value"}),
                            f"{rid}: step time per rank and step", "time")
    if figure:
        report.charts.append(("heatmap", "heatmap_step_time", figure))
    per_step = queries.run(con, queries.find("temporal_breakdown"), {"per": "step"}).df()
    per_step = per_step[per_step.step.notna()]
    if per_step.empty:
        return
    sums = per_step.groupby(["rank", "step"], as_index=False)[["window_ns", "exposed_comm_ns", "idle_ns"]].sum()
    window = sums.window_ns.where(sums.window_ns > 0)
    for name, column, title in (("exposed_comm", "exposed_comm_ns", "exposed communication"),
                                ("idle", "idle_ns", "device idle")):
        cells = sums.assign(value=100 * sums[column] / window)[["rank", "step", "value"]]
        figure = charts.heatmap(cells, f"{rid}: {title} per rank and step, % of the step's device window", "percent")
        if figure:
            report.charts.append(("heatmap", f"heatmap_{name}", figure))


def parallel_tables(con, rid: str) -> dict[str, pd.DataFrame]:
    """The report's parallelism section for run `rid`: per dimension (`parallelism`, the mean per step over the
    steps), per pipeline stage (`pipeline`, the mean over steps; limiting_steps: the steps it limited), and the
    ranks whose clock offsets are flagged (`clock_offsets` rows with a warning). Empty tables where the run has
    none of it."""
    dims = queries.run(con, queries.find("parallelism")).df()
    dims = dims[(dims.run_id == rid) & dims.step.notna()]
    dims = dims.groupby("dimension", as_index=False).agg(
        steps=("step", "nunique"), group_size=("group_size", "max"), intra_node=("intra_node", "min"),
        bytes=("bytes", "mean"), comm_ns=("comm_ns", "mean"), exposed_ns=("exposed_ns", "mean"),
        busbw_gbps=("busbw_gbps", "median"), step_share=("step_share", "mean"),
        exposed_step_share=("exposed_step_share", "mean")).sort_values("comm_ns", ascending=False)
    dims["intra_node"] = ["–" if pd.isna(v) else "yes" if v else "no" for v in dims.intra_node]  # as shown
    stages = queries.run(con, queries.find("pipeline")).df()
    stages = stages[stages.run_id == rid].groupby(["pipeline", "stage", "rank"], as_index=False).agg(
        steps=("step", "nunique"), microbatches=("microbatches", "max"), chunks=("chunks", "max"),
        compute_ns=("compute_ns", "mean"), p2p_blocked_ns=("p2p_blocked_ns", "mean"),
        bubble_pct=("bubble_pct", "mean"), ideal_bubble_pct=("ideal_bubble_pct", "mean"),
        overhead_ns=("overhead_ns", "mean"), limiting_steps=("limiting", "sum"))
    clocks = queries.run(con, queries.find("clock_offsets")).df()
    return {"dimensions": dims, "stages": stages, "clocks": clocks[(clocks.run_id == rid) & clocks.warning.notna()]}


def _focus_details(report: Report, path: Path, device: str | None, top: int) -> None:
    """Charts and tables of the latest run: step timeline, per-rank breakdown, hotspots, roofline."""
    rid = report.focus
    tables = report.metrics.tables
    con = engine.connect(path)
    steps = tables["steps"][tables["steps"].run_id == rid]
    params, title = {}, f"{rid}: device timeline"
    if len(steps):
        per_step = steps.groupby("step").step_ns.max()
        median = (per_step - per_step.median()).abs().idxmin()
        params = {"step": int(median), "resolution_ns": max(1, int(per_step[median] // 500))}
        title = f"{rid}: step {median} (the median step), device timeline per rank"
    else:
        window = tables["breakdown"].loc[tables["breakdown"].run_id == rid, "window_ns"]
        if len(window):
            params = {"resolution_ns": max(1, int(window.max() // 800))}
    lanes = queries.run(con, queries.find("timeline"), params).df()
    shown_ranks = sorted(lanes["rank"].unique())[:8]
    figure = charts.timeline(lanes[lanes["rank"].isin(shown_ranks)], title)
    if figure:
        report.charts.append(("focus", "timeline", figure))
    _heatmaps(report, con, steps, rid)
    per_rank = tables["breakdown"][tables["breakdown"].run_id == rid].sort_values("rank")
    figure = charts.breakdown(per_rank, f"{rid}: where each device's time went")
    if figure:
        report.charts.append(("focus", "breakdown", figure))
    hot = tables["hotspots"][tables["hotspots"].run_id == rid]
    for level in ("kernel", "op"):
        figure = charts.hotspots(hot[hot.level == level], f"{rid}: top {level}s by device time")
        if figure:
            report.charts.append(("focus", f"hotspots_{level}", figure))
    roof = queries.run(con, queries.find("roofline"), {"top": 30, **({"device": device} if device else {})}).df()
    peaks = con.sql("SELECT DISTINCT r.device, r.dtype, r.peak_flops_per_s, r.peak_bytes_per_s, p.source "
                    "FROM rank_device_peaks(device_key := $1) r LEFT JOIN device_peaks p USING (device) "
                    "WHERE r.peak_flops_per_s IS NOT NULL ORDER BY r.device, r.dtype",
                    params=[device]).df()
    peaks = peaks[peaks.dtype.isin(roof.dtype.dropna().unique()) & peaks.device.isin(roof.device.dropna().unique())]
    roofline = charts.roofline(roof, peaks, f"{rid}: roofline (ops by shape)")
    if roofline:
        report.charts.append(("focus", "roofline", roofline))
    # what the roofline cannot rate: compute time under no op with a cost, per rank
    coverage = queries.run(con, queries.find("cost_coverage")).df()
    bubbles = tables["bubbles"][tables["bubbles"].run_id == rid].nlargest(top, "dur")
    coll = tables["collectives"][tables["collectives"].run_id == rid]
    report.focus_tables = {
        "kernels": hot[hot.level == "kernel"], "ops": hot[hot.level == "op"], "bubbles": bubbles,
        "collectives": coll.groupby("collective", as_index=False).agg(
            instances=("seq", "size"), size_bytes=("size_bytes", "sum"), busbw_gbps=("busbw_gbps", "median"),
            max_skew_ns=("max_skew_ns", "max")) if len(coll) else coll,
        "ranks": report.metrics.ranks[report.metrics.ranks.run_id == rid],
        "cost_coverage": coverage[coverage.run_id == rid],
        "peaks": peaks if roofline else peaks.iloc[:0],  # what the roofline rated against
        **parallel_tables(con, rid),
    }
