"""`--history DIR`: each report's metrics kept as one plain Parquet file in DIR, so that trends span more runs
than one command line gives. A file per report (`report-<UTC time>-<id>.parquet`), written aside and renamed:
one row per (run, metric) with the run's start, labels and steps used. Read back with any Parquet reader:

    duckdb -c "SELECT run_id, value FROM 'history/*.parquet' WHERE metric = 'step_time_p50' ORDER BY start_ns"
"""

from __future__ import annotations

import datetime
import json
import os
import uuid
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import TraceError
from .metrics import METRICS

COLUMNS = {"report_at": pa.string(), "run_id": pa.string(), "start_ns": pa.int64(), "labels": pa.string(),
           "steps_used": pa.string(), "metric": pa.string(), "value": pa.float64()}


def read(folder: Path) -> pd.DataFrame:
    """Every report's rows kept in `folder` (none when it does not exist yet)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise TraceError(folder, "--history names a folder; this is a file")
    files = sorted(folder.glob("report-*.parquet")) if folder.is_dir() else []
    if not files:
        return pd.DataFrame({name: pd.Series(dtype="object") for name in COLUMNS})
    try:
        return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)
    except (pa.ArrowException, OSError) as e:
        raise TraceError(folder, f"cannot read the history: {e}") from None


def earlier_runs(history: pd.DataFrame, current: set[str]) -> pd.DataFrame:
    """The runs of earlier reports that this one does not have, a row each (the latest report's values): run_id,
    start_ns and a column per metric, as FleetMetrics.runs has them."""
    older = history[~history.run_id.isin(current)]
    if older.empty:
        return pd.DataFrame(columns=["run_id", "start_ns"])
    latest = older.sort_values("report_at").groupby(["run_id", "metric"], as_index=False).last()
    wide = latest.pivot(index="run_id", columns="metric", values="value")
    start = latest.groupby("run_id").start_ns.last()
    return wide.join(start).reset_index()


def append(folder: Path, runs: pd.DataFrame) -> Path:
    """Keep this report's run metrics (`runs`: FleetMetrics.runs) as one more file in `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    names = [m for m in METRICS if m in runs]
    long = runs.melt(id_vars=["run_id", "start_ns", "steps_used"], value_vars=names, var_name="metric")
    long = long.dropna(subset=["value"])
    labels = {r: json.dumps(v, sort_keys=True) for r, v in zip(runs.run_id, runs.labels)}
    table = pa.Table.from_pydict({
        "report_at": pa.array([now.isoformat(timespec="microseconds")] * len(long), pa.string()),
        "run_id": pa.array(long.run_id, pa.string()),
        "start_ns": pa.array(long.start_ns.astype("Int64"), pa.int64()),
        "labels": pa.array(long.run_id.map(labels), pa.string()),
        "steps_used": pa.array(long.steps_used, pa.string()),
        "metric": pa.array(long.metric, pa.string()), "value": pa.array(long.value.astype("float64"), pa.float64()),
    }, schema=pa.schema(COLUMNS))
    path = folder / f"report-{now.strftime('%Y%m%dT%H%M%S%fZ')}-{uuid.uuid4().hex[:8]}.parquet"
    tmp = folder / f".{path.name}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, path)
    return path
