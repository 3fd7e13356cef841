"""The report's files: index.html (one offline page: plotly.js embedded, no network), summary.md (a CI job
summary or PR comment), metrics.json and metrics.parquet. Each file is written aside and renamed into place.

Escaping: the HTML template autoescapes every value (jinja2); figure JSON is embedded in a non-executed
<script type="application/json"> with <, > and & written as \\u003c, \\u003e, \\u0026, so no trace string can close
it; a Content-Security-Policy admits only the page's own two scripts (by hash) and no network at all.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import html
import json
import os
import uuid
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..version import __version__
from ..errors import TraceError
from .gates import __doc__ as GATE_GRAMMAR
from . import history
from .metrics import DIFFS_SHOWN, METRICS, change, display

MARKDOWN_RUNS = 20  # rows of the Markdown runs table (the baseline and the latest runs)

_INIT_JS = """
document.querySelectorAll('div.chart').forEach(function (div) {
  var figure = JSON.parse(document.getElementById(div.dataset.figure).textContent);
  Plotly.newPlot(div, figure.data, figure.layout, {displaylogo: false, responsive: true});
});
"""


def script_json(value) -> str:
    """JSON safe inside <script>: no '<', '>' or '&' characters at all (nor the JS line separators)."""
    text = json.dumps(value, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                    ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def md(value, width: int | None = None) -> str:
    """A trace-derived string for Markdown tables: HTML special characters as entities, Markdown ones escaped."""
    s = " ".join(str(value).split())
    if width and len(s) > width:
        s = s[: width - 1] + "…"
    s = html.escape(s, quote=False)
    for ch in "\\`*_[]|":
        s = s.replace(ch, "\\" + ch)
    return s


def _records(df: pd.DataFrame) -> list[dict]:
    return json.loads(df.to_json(orient="records", double_precision=15)) if len(df) else []


def _sha256(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"


def _fmt_ns(ns) -> str:
    if pd.isna(ns) or ns == 0:
        return "–" if pd.isna(ns) else "0"
    return f"{ns / 1e6:,.3f} ms" if abs(ns) >= 1e5 else f"{ns / 1e3:,.1f} µs"


def _signed_ns(ns) -> str:
    return ("+" if ns >= 0 else "−") + _fmt_ns(abs(ns))


def _signed_share(share) -> str:
    """A row's part of its level's total change, signed: '+39 %' adds to it, '−69 %' went the other way."""
    if pd.isna(share):
        return "–"
    return ("+" if share >= 0 else "−") + f"{abs(share) * 100:.0f} %"


def diff_summary(diff: pd.DataFrame) -> str:
    """What the diff table's shares are parts of: each level's total change per rank, and how to read them."""
    basis = diff.time_basis.iloc[0]
    op_time = "device time of the kernels each launched" if basis == "device" else "host self time"
    totals = [f"{what} {_signed_ns(diff[diff.level == level].level_delta_ns.iloc[0])}"
              for level, what in (("kernel", "kernels (device time)"), ("op", f"ops ({op_time})"))
              if (diff.level == level).any()]
    return (f"Total change per rank: {', '.join(totals)}. Each row: its change Δ and its part of its level's "
            "total (+ adds to it, − went the other way; over all names the parts add up to 100 %), largest |Δ| "
            "first.")


def straggler_summary(straggler: dict) -> str:
    """'Straggler: rank 2, last to start at 23 of 27 collectives (by chance 1 in 4), 7.102 ms late on average.'"""
    return (f"Straggler: rank {straggler['rank']}, last to start at {straggler['times_last']} of "
            f"{straggler['instances']} collectives (by chance 1 in {straggler['ranks']}), "
            f"{_fmt_ns(straggler['mean_lateness_ns'])} late on average (from the collective_stragglers query).")


def label_keys(runs: pd.DataFrame, given_only: bool = False) -> list[str]:
    """The label columns of the runs table: the given labels (a run's configuration) first, then the recorded."""
    given = sorted({k for g in runs.given for k in g})
    if given_only:
        return given
    return given + sorted({k for found in runs.labels for k in found} - set(given))


def _spread(name: str, mean, sd) -> str:
    """'12.40 ms ± 0.08 ms' (± only when replicates give a spread)."""
    text = display(name, mean)
    return text if pd.isna(sd) or pd.isna(mean) else f"{text} ± {display(name, sd)}"


def sweep_markdown(sweep: pd.DataFrame) -> list[str]:
    """The sweep table (sweeps.table) in Markdown, the best configuration in bold with a ★."""
    keys = sweep.attrs["keys"]
    lines = ["| " + " | ".join(md(k) for k in keys) + " | runs | step time | MFU | exposed comm | peak memory |",
             "|" + "---|" * len(keys) + "---:|---:|---:|---:|---:|"]
    for r in sweep.itertuples():
        cells = [md(sweep.at[r.Index, k]) for k in keys]
        values = [_spread(m, sweep.at[r.Index, m], sweep.at[r.Index, f"{m}_sd"])
                  for m in ("step_time_p50", "mfu", "exposed_comm", "peak_memory")]
        if r.best:
            values[0] = f"**{values[0]}** ★"
        lines.append("| " + " | ".join(cells) + f" | {r.runs} | " + " | ".join(values) + " |")
    return lines


def html_page(report) -> str:
    import jinja2
    from plotly.offline import get_plotlyjs

    env = jinja2.Environment(loader=jinja2.PackageLoader("tracesql.report", "."),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters.update(ns=_fmt_ns, signed_ns=_signed_ns, signed_share=_signed_share,
                       metric=lambda v, name: display(name, v),
                       pct=lambda v: "–" if pd.isna(v) else f"{v:.1f} %",
                       num=lambda v: "–" if pd.isna(v) else f"{v:,.4g}",
                       short=lambda v: v if v is None or len(str(v)) <= 160 else str(v)[:159] + "…")
    plotly_js = get_plotlyjs()
    runs = report.metrics.runs
    base = runs.set_index("run_id").loc[report.baseline]
    shown = [m for m in METRICS if m in runs and runs[m].notna().any()]
    charts = [{"section": s, "name": n, "id": f"chart-{i}", "json": script_json(fig)}
              for i, (s, n, fig) in enumerate(report.charts)]
    csp = ("default-src 'none'; script-src " + _sha256(plotly_js) + " " + _sha256(_INIT_JS)
           + "; style-src 'unsafe-inline'; img-src data: blob:; font-src data:")
    return env.get_template("report.html.j2").render(
        report=report, runs=runs, base=base, shown=shown, metrics=METRICS, charts=charts,
        label_keys=label_keys(runs), spread=_spread, change=change, display=display, worse={(r.run_id, m) for r in report.regressions for m, _ in r.changes}, plotly_js=plotly_js, init_js=_INIT_JS, csp=csp,
        generated=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        start=lambda ns: "–" if pd.isna(ns) else datetime.datetime.fromtimestamp(
            ns / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        traces={t.run_id: t for t in report.traces if not t.all_ranks}, merged=[t for t in report.traces if t.all_ranks],
        diff_summary=diff_summary, straggler_summary=straggler_summary,
        version=__version__, diffs_shown=DIFFS_SHOWN, grammar=GATE_GRAMMAR.split("\n\n", 1)[1].strip())


def findings_markdown(report) -> list[str]:
    """The Findings section of summary.md: the latest run's, largest saving first."""
    found = report.findings
    if found is None or found.empty:
        return [f"**Findings ({md(report.focus)}):** none above the rules' thresholds.", ""]
    lines = [f"### Findings: what limits the steps of {md(report.focus)}", "",
             "| rank | step | finding | saving | evidence |", "|---:|---:|---|---:|---|"]
    lines += [f"| {f.rank} | {f.step} | {f.finding} | {_fmt_ns(f.saving_ns)} ({f.saving_pct:.1f} %) | {md(f.evidence, 200)} |"
              for f in found.itertuples()]
    return lines + [""]


def parallel_markdown(report) -> list[str]:
    """The Parallelism section of summary.md: the latest run's communication per dimension, its pipeline stages
    with the limiting one, its flagged clock offsets and its all-ranks trace."""
    ft = report.focus_tables
    dims, stages, clocks = ft.get("dimensions"), ft.get("stages"), ft.get("clocks")
    merged = [t for t in report.traces if t.all_ranks]
    if not any(x is not None and len(x) for x in (dims, stages, clocks)) and not merged:
        return []
    lines = [f"### Parallelism: {md(report.focus)}", ""]
    if dims is not None and len(dims):
        lines += ["Communication per dimension (`parallelism`), mean per step over ranks:", "",
                  "| dimension | group size | intra-node | bytes | time | exposed | busbw | share of step | exposed share |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {d.dimension} | {'–' if pd.isna(d.group_size) else int(d.group_size)} | "
                  f"{d.intra_node} | {d.bytes:,.0f} | "
                  f"{_fmt_ns(d.comm_ns)} | {_fmt_ns(d.exposed_ns)} | "
                  f"{'–' if pd.isna(d.busbw_gbps) else f'{d.busbw_gbps:,.4g} GB/s'} | {100 * d.step_share:.1f} % | "
                  f"{100 * d.exposed_step_share:.1f} % |" for d in dims.itertuples()]
        lines.append("")
    if stages is not None and len(stages):
        for name, rows in stages.groupby("pipeline"):
            limit = rows.sort_values(["limiting_steps", "compute_ns"], ascending=False).iloc[0]
            lines += [f"Pipeline{f' on group {md(name)}' if name else ''} (`pipeline`): {len(rows)} stages, "
                      f"{limit.microbatches} microbatches, {limit.chunks} model chunk(s) per rank; stage {limit.stage} "
                      f"(rank {limit['rank']}) limits it in {int(limit.limiting_steps)} of {int(limit.steps)} steps "
                      f"(computes longest). Mean per step:", "",
                      "| stage | rank | compute | blocked in p2p | bubble | ideal bubble | beyond the formula | limits |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|"]
            lines += [f"| {r.stage} | {r.rank} | {_fmt_ns(r.compute_ns)} | {_fmt_ns(r.p2p_blocked_ns)} | "
                      f"{r.bubble_pct:.1f} % | {'–' if pd.isna(r.ideal_bubble_pct) else f'{r.ideal_bubble_pct:.1f} %'} | "
                      f"{_fmt_ns(r.overhead_ns)} | {int(r.limiting_steps)} |" for r in rows.itertuples()]
            lines.append("")
    if clocks is not None and len(clocks):
        lines += [f"Clock offsets (`clock_offsets`): rank {c.rank}: {md(c.warning)}." for c in clocks.itertuples()]
        lines += ["Cross-rank skews of this run need `-p align_clocks=true`.", ""]
    for t in merged:
        lines += [f"Every rank of step {t.step} (the slowest, {_fmt_ns(t.step_ns)}) on one timeline: `{t.file}`", ""]
    return lines


def markdown(report) -> str:
    runs = report.metrics.runs
    rows = runs.set_index("run_id", drop=False)
    base = rows.loc[report.baseline]
    lines = [f"## tracesql report: {len(runs)} run(s), baseline {md(report.baseline)}, latest {md(report.focus)}", ""]
    lines += findings_markdown(report)
    if report.verdicts:
        failed = report.failed
        lines.append(f"**Gates: {len(failed)} of {len(report.verdicts)} failed**" if failed else
                     f"**Gates: all {len(report.verdicts)} passed**")
        lines += [f"- {'❌ FAIL' if not v.passed else '✅ pass'} `{v.gate.text.replace('`', '')}`: {md(v.reason)}"
                  for v in report.verdicts]
        lines.append("")
    shown = [m for m in METRICS if m in runs and runs[m].notna().any()]
    picked = runs if len(runs) <= MARKDOWN_RUNS else pd.concat(
        [runs[runs.run_id == report.baseline], runs[runs.run_id != report.baseline].tail(MARKDOWN_RUNS - 1)])
    if len(picked) < len(runs):
        lines.append(f"The baseline and the latest {len(picked) - 1} of {len(runs)} runs (all in index.html):")
        lines.append("")
    keys = label_keys(runs, given_only=True)
    lines.append("| # | run | " + "".join(f"{md(k)} | " for k in keys) + "ranks | steps | " + " | ".join(shown) + " |")
    lines.append("|---:|---|" + "---|" * len(keys) + "---:|---|" + "---:|" * len(shown))
    for r in picked.itertuples():
        cells = []
        for m in shown:
            value = getattr(r, m)
            delta = "" if r.run_id == report.baseline else f" ({change(m, value, base[m])})"
            cells.append(display(m, value) + (delta if delta != " (–)" else ""))
        mark = " (baseline)" if r.run_id == report.baseline else ""
        labels = "".join(f"{md(r.given.get(k, ''), 30)} | " for k in keys)
        lines.append(f"| {r.order} | {md(r.run_id, 50)}{mark} | {labels}{r.ranks} | {md(r.steps_used)} | "
                     + " | ".join(cells) + " |")
    lines.append("")
    if report.sweep is not None:
        lines += ["### Sweep: configurations (replicates merged: mean ± spread)", ""]
        lines += sweep_markdown(report.sweep) + [""]
    if report.regressions:
        lines.append(f"### Regressions against {md(report.baseline)} (threshold {report.threshold:g} % / pp)")
        lines.append("")
        for reg in report.regressions:
            what = ", ".join(f"{m} {c}" for m, c in reg.changes) or "failed a gate"
            lines.append(f"**{md(reg.run_id)}**: {what}")
            lines.append("")
            if reg.straggler:
                lines += [straggler_summary(reg.straggler), ""]
            if reg.diff is not None and len(reg.diff):
                lines += [diff_summary(reg.diff), ""]
                lines.append("| level | name | status | count/rank before → after | time/rank before → after | Δ "
                             "| part of the level's Δ |")
                lines.append("|---|---|---|---:|---:|---:|---:|")
                for level in ("kernel", "op"):
                    for d in reg.diff[reg.diff.level == level].head(5).itertuples():
                        lines.append(f"| {level} | {md(d.name, 70)} | {d.status} | {d.before_count:,.4g} → "
                                     f"{d.after_count:,.4g} | {_fmt_ns(d.before_ns)} → {_fmt_ns(d.after_ns)} | "
                                     f"{_signed_ns(d.delta_ns)} | {_signed_share(d.share_of_change)} |")
                lines.append("")
    else:
        lines += [f"No regressions against {md(report.baseline)} (threshold {report.threshold:g} % / pp).", ""]
    lines += parallel_markdown(report)
    if report.traces:
        lines.append("Steps as Perfetto traces (open in https://ui.perfetto.dev): " + "; ".join(
            f"{t.why} {md(t.run_id)} (step {t.step}, {'all ranks' if t.all_ranks else f'rank {t.rank}'}, "
            f"{_fmt_ns(t.step_ns)}): `{t.file}`" for t in report.traces))
        lines.append("")
    lines.append(f"<sub>tracesql {__version__}: metrics from the curated queries; the charts are in index.html."
                 "</sub>")
    return "\n".join(lines) + "\n"


def metrics_json(report) -> dict:
    return {
        "tracesql_version": __version__, "baseline": report.baseline, "latest": report.focus,
        "threshold": report.threshold,
        "metrics": {m.name: {"kind": m.kind, "worse": m.worse, "doc": m.doc} for m in METRICS.values()},
        "steps": report.steps, "confidence": report.confidence, "replicates": report.replicates,
        "runs": _records(report.metrics.runs), "ranks": _records(report.metrics.ranks),
        "sweep": [] if report.sweep is None else _records(report.sweep),
        "gates": [{"gate": v.gate.text, "run_id": v.run_id, "passed": v.passed, "significant": v.significant,
                   "reason": v.reason}
                  for v in report.verdicts],
        "traces": [{"why": t.why, "run_id": t.run_id, "rank": t.rank, "step": t.step, "step_ns": t.step_ns,
                    "file": t.file, "all_ranks": t.all_ranks} for t in report.traces],
        "regressions": [{"run_id": r.run_id, "changes": dict(r.changes),
                         "diff": None if r.diff is None else _records(r.diff)} for r in report.regressions],
    }


def metrics_table(report) -> pa.Table:
    """Long format: one row per (run, rank or NULL for the whole run, metric)."""
    runs, ranks = report.metrics.runs, report.metrics.ranks
    names = [m for m in METRICS if m in runs]
    long = runs.melt(id_vars=["run_id", "order"], value_vars=names, var_name="metric").assign(rank=None)
    per_rank = ranks.merge(runs[["run_id", "order"]], on="run_id").melt(
        id_vars=["run_id", "order", "rank"], value_vars=[m for m in METRICS if m in ranks], var_name="metric")
    table = pd.concat([long, per_rank], ignore_index=True).dropna(subset=["value"])
    table["unit"] = table.metric.map({m.name: {"time": "ns", "percent": "%", "bytes": "bytes",
                                               "bandwidth": "GB/s"}[m.kind] for m in METRICS.values()})
    return pa.Table.from_pydict({
        "run_id": pa.array(table.run_id, pa.string()), "order": pa.array(table.order, pa.int32()),
        "rank": pa.array(table["rank"].astype("Int32"), pa.int32()), "metric": pa.array(table.metric, pa.string()),
        "value": pa.array(table.value.astype("float64"), pa.float64()), "unit": pa.array(table.unit, pa.string())})


def write_traces(report, out: Path) -> list[Path]:
    """The steps the report links to (report.traces) as Perfetto traces in out/perfetto/; traces of an earlier
    report in that folder that this one does not link are removed."""
    from .. import engine
    from ..export import NAMES_USED, export, export_all_ranks

    folder = out / "perfetto"
    written = []
    if report.traces:  # one session for every run traced
        con = engine.connect(list(dict.fromkeys(t.path for t in report.traces)), names=NAMES_USED)
        try:
            for t in report.traces:
                if t.all_ranks:
                    export_all_ranks(t.path, out / t.file, step=t.step, run_id=t.run_id)
                else:
                    export(t.path, out / t.file, rank=t.rank, step=t.step, run_id=t.run_id, con=con)
                written.append(out / t.file)
        finally:
            con.close()
    if folder.is_dir():
        for old in folder.glob("*.pftrace"):
            if old not in written:
                old.unlink()
    return written


LOCK_WAIT_S = 600


def lock_path(out: Path) -> Path:
    """The lock of the report folder `out`: a hidden file beside it (as a run's lock is), not inside it."""
    return out.parent / f".{out.name}.report-lock"


def check_folder(out: Path) -> None:
    """Refuse an output folder that is a file (the report command asks before it reads any run)."""
    if out.exists() and not out.is_dir():
        raise TraceError(out, "exists and is not a folder")


@contextlib.contextmanager
def folder_locked(out: Path):
    """Held by a report from writing into `out` to saying what it wrote: a second report into the same folder
    waits for it (up to LOCK_WAIT_S), so each one's files are its own whole set when it says so."""
    import filelock

    check_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        with filelock.FileLock(lock_path(out), timeout=LOCK_WAIT_S):
            yield
    except filelock.Timeout:
        raise TraceError(out, f"another report has been writing into this folder for {LOCK_WAIT_S} s (it holds "
                              f"{lock_path(out).name}); try again when it is done") from None


def write(report, out: Path) -> list[Path]:
    """Write the four files (and the linked Perfetto traces) into `out`, each aside then renamed: an interrupted
    run leaves the previous files."""
    check_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    traces = write_traces(report, out)
    contents = {
        "index.html": html_page(report).encode(),
        "summary.md": markdown(report).encode(),
        "metrics.json": (json.dumps(metrics_json(report), indent=1, ensure_ascii=False) + "\n").encode(),
    }
    written = []
    for name, data in contents.items():
        tmp = out / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, out / name)
        written.append(out / name)
    tmp = out / f".metrics.parquet.{uuid.uuid4().hex[:8]}.tmp"
    pq.write_table(metrics_table(report), tmp)
    os.replace(tmp, out / "metrics.parquet")
    kept = [history.append(report.history, report.metrics.runs)] if report.history is not None else []
    return written + [out / "metrics.parquet"] + traces + kept
