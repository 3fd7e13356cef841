"""Plotly figures (plain dicts: data + layout) for the report page. Drawn by plotly.js in the browser, SVG only
(no WebGL), so they render anywhere, headless included.

Every string that comes from a trace is HTML-escaped here: plotly.js reads a few HTML tags in labels, and it
shows an escaped `&lt;` as `<`, so names are displayed as written and never interpreted.
"""

from __future__ import annotations

import html
import math

import pandas as pd

from .metrics import METRICS

LANE_COLORS = {"compute": "#4C78A8", "communication": "#F58518", "memory": "#54A24B", "idle": "#BAB0AC"}
_BASE = {"margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "font": {"size": 12}, "hovermode": "closest",
         "plot_bgcolor": "#fff", "paper_bgcolor": "#fff"}


def text(value, width: int | None = None) -> str:
    """A trace-derived string made safe for plotly labels (cut to `width` characters first)."""
    s = str(value)
    if width and len(s) > width:
        s = s[: width - 1] + "…"
    return html.escape(s, quote=False)  # plotly.js decodes &lt; &gt; &amp; but shows &quot; as it is written


def _layout(title: str, **extra) -> dict:
    return {**_BASE, "title": {"text": text(title), "x": 0.01, "font": {"size": 14}}, **extra}


def _clean(values) -> list:
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in values]


def trend(metric: str, runs: pd.DataFrame, baseline: str, threshold: float, earlier=frozenset()) -> dict | None:
    """One metric over the runs in order; the baseline as a dashed line inside its no-regression band
    (± threshold % for amounts, ± threshold pp for percentages); runs of earlier reports (`earlier`, from
    --history) in grey."""
    values = runs[metric]
    if values.isna().all():
        return None
    m = METRICS[metric]
    scale, unit = _unit(m.kind, values.abs().max())
    y = [None if pd.isna(v) else v / scale for v in values]
    labels = [text(r, 40) for r in runs.run_id]
    layout = _layout(f"{metric} ({unit})", height=260, showlegend=False,
                     xaxis={"type": "category", "tickangle": -30, "automargin": True},
                     yaxis={"title": {"text": unit}, "rangemode": "tozero" if m.kind != "percent" else "normal"})
    base = runs.loc[runs.run_id == baseline, metric]
    if len(base) and not pd.isna(base.iloc[0]):
        b = base.iloc[0] / scale
        half = threshold if m.kind == "percent" else abs(b) * threshold / 100
        layout["shapes"] = [
            {"type": "rect", "xref": "paper", "x0": 0, "x1": 1, "y0": b - half, "y1": b + half,
             "fillcolor": "rgba(84,162,75,0.15)", "line": {"width": 0}, "layer": "below"},
            {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": b, "y1": b,
             "line": {"color": "#54A24B", "dash": "dash", "width": 1}},
        ]
    colors = ["#54A24B" if r == baseline else "#BAB0AC" if r in earlier else "#4C78A8" for r in runs.run_id]
    data = [{"type": "scatter", "mode": "lines+markers", "x": labels, "y": y, "marker": {"color": colors, "size": 8},
             "line": {"color": "#4C78A8"}, "hovertemplate": "%{x}: %{y:.3g} " + unit + "<extra></extra>"}]
    return {"data": data, "layout": layout}


def _unit(kind: str, largest: float) -> tuple[float, str]:
    if kind == "time":
        return (1e6, "ms") if largest >= 1e5 else (1e3, "µs")
    if kind == "bytes":
        return (2**30, "GiB") if largest >= 2**30 else (2**20, "MiB")
    return (1, "%") if kind == "percent" else (1, "GB/s")


def timeline(lanes: pd.DataFrame, title: str) -> dict | None:
    """Lanes per rank (compute / communication / memory / idle) as thick line segments: one SVG path per lane,
    however many intervals."""
    if lanes.empty:
        return None
    rows = [f"rank {r} · {lane}" for r in sorted(lanes["rank"].unique(), reverse=True) for lane in
            ("idle", "memory", "communication", "compute")]
    data = []
    for lane, color in LANE_COLORS.items():
        part = lanes[lanes.lane == lane]
        xs, ys = [], []
        for r, start, dur in zip(part["rank"], part.offset_ns, part.dur):
            label = f"rank {r} · {lane}"
            xs += [start / 1e6, (start + dur) / 1e6, None]
            ys += [label, label, None]
        data.append({"type": "scatter", "mode": "lines", "name": lane, "x": xs, "y": ys,
                     "line": {"color": color, "width": 12}, "hoverinfo": "x+y", "connectgaps": False})
    layout = _layout(title, height=max(220, 24 * len(rows) + 90),
                     xaxis={"title": {"text": "ms from the first device activity"}, "zeroline": False},
                     yaxis={"type": "category", "categoryorder": "array", "categoryarray": rows, "automargin": True},
                     legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"})
    return {"data": data, "layout": layout}


def hotspots(rows: pd.DataFrame, title: str) -> dict | None:
    """Horizontal bars of device time, largest on top."""
    if rows.empty:
        return None
    rows = rows.sort_values("device_ns")
    labels = [f"{i}. {text(n, 60)}" for i, n in zip(rows.rank_in_level, rows.name)]
    data = [{"type": "bar", "orientation": "h", "x": _clean((rows.device_ns / 1e6).tolist()), "y": labels,
             "customdata": [[text(n, 300), int(c)] for n, c in zip(rows.name, rows["count"])],
             "marker": {"color": "#4C78A8"},
             "hovertemplate": "%{customdata[0]}<br>%{x:.3f} ms in %{customdata[1]} calls<extra></extra>"}]
    layout = _layout(title, height=max(220, 26 * len(rows) + 80), showlegend=False,
                     xaxis={"title": {"text": "device time, ms (all ranks)"}},
                     yaxis={"type": "category", "automargin": True})
    return {"data": data, "layout": layout}


def breakdown(rows: pd.DataFrame, title: str) -> dict | None:
    """Stacked bars per rank: compute, exposed communication, exposed memory, idle (shares of the window)."""
    if rows.empty:
        return None
    labels = [f"rank {r}" for r in rows["rank"]]
    parts = [("compute", "compute_pct"), ("communication", "exposed_comm_pct"), ("memory", "exposed_memory_pct"),
             ("idle", "idle_pct")]
    data = [{"type": "bar", "orientation": "h", "name": f"{'exposed ' if lane in ('communication', 'memory') else ''}"
             f"{lane}", "x": _clean(rows[col].tolist()), "y": labels, "marker": {"color": LANE_COLORS[lane]}}
            for lane, col in parts]
    layout = _layout(title, barmode="stack", height=max(200, 28 * len(rows) + 110),
                     xaxis={"title": {"text": "% of the device window"}, "range": [0, 100]},
                     yaxis={"type": "category", "autorange": "reversed", "automargin": True},
                     legend={"orientation": "h", "y": -0.3})
    return {"data": data, "layout": layout}


def roofline(points: pd.DataFrame, peaks: pd.DataFrame, title: str) -> dict | None:
    """Ops (per shape) at their arithmetic intensity and achieved FLOP/s, under the device's roofs (one roof per
    dtype the ops use: min(peak FLOP/s, AI · bandwidth)); log-log."""
    points = points.dropna(subset=["arithmetic_intensity", "achieved_flops_per_s"])
    points = points[(points.arithmetic_intensity > 0) & (points.achieved_flops_per_s > 0)]
    if points.empty:
        return None
    lo = min(points.arithmetic_intensity.min(), 1) / 4
    hi = max(points.arithmetic_intensity.max(), (peaks.peak_flops_per_s / peaks.peak_bytes_per_s).max()
             if len(peaks) else 1) * 4
    data = []
    for row in peaks.itertuples():
        ridge = row.peak_flops_per_s / row.peak_bytes_per_s
        name = text(f"{row.device} {row.dtype}")
        data.append({"type": "scatter", "mode": "lines", "name": f"{name} roofs: {row.peak_bytes_per_s / 1e12:.3g} "
                     f"TB/s, {row.peak_flops_per_s / 1e12:.4g} TFLOP/s",
                     "x": [lo, ridge, hi], "y": [lo * row.peak_bytes_per_s / 1e12, row.peak_flops_per_s / 1e12,
                                                 row.peak_flops_per_s / 1e12],
                     "line": {"width": 2, "dash": "dot"}, "hoverinfo": "name"})
        data.append({"type": "scatter", "mode": "markers+text", "name": f"{name} ridge point", "x": [ridge],
                     "y": [row.peak_flops_per_s / 1e12], "text": [f"ridge {ridge:.3g} FLOP/B"],
                     "textposition": "bottom right", "marker": {"symbol": "diamond", "size": 10, "color": "#333"},
                     "hovertemplate": f"{name}: ridge point at {ridge:.4g} FLOP/byte (peak FLOP/s ÷ peak bytes/s)"
                                      "<extra></extra>"})
    biggest = points.device_ns.max() or 1
    for dtype, group in points.groupby("dtype", dropna=False):
        # kernels with no launch, costed as their identical kernels' op (by kernel or by place), say so (cost_source)
        hover = [f"{text(n, 80)}<br>{text(d, 160)}<br>{c} calls, {ns / 1e6:.3f} ms, {p:.1f} % of the roof"
                 + ("<br>kernels with no launch: the cost of identical kernels" if s in ("identical kernel", "aligned kernel")
                    else "")
                 for n, d, c, ns, p, s in zip(group.name, group.input_dims.astype(str), group.calls,
                                              group.device_ns.fillna(0), group.roofline_pct.fillna(0),
                                              group.cost_source)]
        data.append({"type": "scatter", "mode": "markers", "name": text(f"ops ({dtype})"),
                     "x": group.arithmetic_intensity.tolist(), "y": (group.achieved_flops_per_s / 1e12).tolist(),
                     "text": hover, "hovertemplate": "%{text}<extra></extra>",
                     "marker": {"size": [6 + 24 * math.sqrt((ns or 0) / biggest) for ns in group.device_ns],
                                "opacity": 0.75, "line": {"width": 1, "color": "#333"}}})
    layout = _layout(title, height=420, xaxis={"type": "log", "title": {"text": "arithmetic intensity, FLOP/byte"}},
                     yaxis={"type": "log", "title": {"text": "TFLOP/s"}}, legend={"orientation": "h", "y": -0.2})
    return {"data": data, "layout": layout}


def sweep(table: pd.DataFrame) -> dict | None:
    """Step time against peak memory, a point per configuration (sweeps.table), replicates' spread as error bars,
    the best configuration as a star: the trade-off remat policies and batch sizes make."""
    rows = table.dropna(subset=["step_time_p50", "peak_memory"])
    if rows.empty:
        return None
    keys = table.attrs.get("keys", [])
    names = [text(", ".join(f"{k}={r[k]}" for k in keys), 60) for _, r in rows.iterrows()]
    data = [{"type": "scatter", "mode": "markers+text", "x": (rows.peak_memory / 2**30).round(4).tolist(),
             "y": (rows.step_time_p50 / 1e6).round(4).tolist(), "text": names, "textposition": "top center",
             "error_y": {"type": "data", "array": _clean((rows.step_time_p50_sd / 1e6).round(4).tolist()),
                         "visible": True, "color": "#666"},  # (their default, the marker's colors, is no color)
             "error_x": {"type": "data", "array": _clean((rows.peak_memory_sd / 2**30).round(4).tolist()),
                         "visible": True, "color": "#666"},
             "marker": {"size": [16 if b else 9 for b in rows.best], "symbol": ["star" if b else "circle"
                                                                             for b in rows.best],
                        "color": ["#54A24B" if b else "#4C78A8" for b in rows.best]},
             "hovertemplate": "%{text}<br>%{y:.3f} ms, %{x:.3f} GiB<extra></extra>"}]
    layout = _layout("Sweep: step time against peak memory (mean ± spread of replicates; star: best)", height=360,
                     showlegend=False, xaxis={"title": {"text": "peak memory, GiB"}},
                     yaxis={"title": {"text": "step time (median of steady steps), ms"}})
    return {"data": data, "layout": layout}


HEATMAP_COLORS = "YlOrRd"  # reversed: pale when low, dark red when high (every heatmap's metric is worse higher)


def heatmap(cells: pd.DataFrame, title: str, kind: str) -> dict | None:
    """A rank × step grid (columns rank, step, value; value in ns for 'time', % for 'percent'): one cell per rank
    and step, ranks down, steps across, so that 64–1,024 ranks still read (a row per rank of a pixel or more,
    where one timeline row per rank could not); hover gives the rank, the step and the value."""
    cells = cells.dropna(subset=["rank", "step"])
    if cells.empty or cells.value.isna().all():
        return None
    grid = cells.pivot_table(index="rank", columns="step", values="value", aggfunc="max").sort_index()
    scale, unit = _unit(kind, float(cells.value.abs().max()))
    z = [[None if pd.isna(v) else round(float(v) / scale, 6) for v in row] for row in grid.to_numpy()]
    ranks, steps = [int(r) for r in grid.index], [int(s) for s in grid.columns]
    few = len(ranks) <= 64 and len(steps) <= 64
    data = [{"type": "heatmap", "x": steps, "y": ranks, "z": z, "colorscale": HEATMAP_COLORS, "reversescale": True,
             "colorbar": {"title": {"text": unit}, "thickness": 12}, "xgap": 1 if few else 0, "ygap": 1 if few else 0,
             "hovertemplate": "rank %{y}, step %{x}: %{z:.4g} " + unit + "<extra></extra>", "hoverongaps": False}]
    if kind == "percent":
        data[0].update(zmin=0, zmax=max(1.0, max(v for row in z for v in row if v is not None)))
    height = int(min(900, max(260, 130 + (18 if len(ranks) <= 16 else 6 if len(ranks) <= 128 else 0.75)
                                * len(ranks))))
    layout = _layout(title, height=height,
                     xaxis={"title": {"text": "step"}, "type": "category" if len(steps) <= 64 else "linear"},
                     yaxis={"title": {"text": "rank"}, "autorange": "reversed",
                            "type": "category" if len(ranks) <= 32 else "linear"})
    return {"data": data, "layout": layout}
