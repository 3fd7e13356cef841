"""Sweeps: runs grouped by their configuration (the given labels, tracesql.labels.GIVEN), replicates merged.

One row per configuration: its labels as columns, how many runs, and per metric the mean over its runs and their
spread (sample standard deviation; NaN for a single run): step time (each run's median over its steady steps),
MFU, exposed communication, peak memory. The best configuration (lowest mean step time) is marked.
"""

from __future__ import annotations

import pandas as pd

SWEEP_METRICS = ("step_time_p50", "mfu", "exposed_comm", "peak_memory")


def table(runs: pd.DataFrame) -> pd.DataFrame | None:
    """The sweep table of `runs` (FleetMetrics.runs), or None when no run has given labels."""
    keys = sorted({k for given in runs.given for k in given})
    if not keys:
        return None
    config = runs.given.map(lambda g: tuple(g.get(k, "") for k in keys))
    rows = []
    for values, group in runs.groupby(config, sort=True):
        row = dict(zip(keys, values))
        row["runs"] = len(group)
        row["run_ids"] = list(group.run_id)
        for name in SWEEP_METRICS:
            column = group[name] if name in group else pd.Series(dtype="float64")
            row[name] = column.mean()
            row[f"{name}_sd"] = column.std(ddof=1) if column.notna().sum() > 1 else float("nan")
        rows.append(row)
    out = pd.DataFrame(rows)
    out["best"] = False
    if out.step_time_p50.notna().any():
        out.loc[out.step_time_p50.idxmin(), "best"] = True
    out.attrs["keys"] = keys
    return out
