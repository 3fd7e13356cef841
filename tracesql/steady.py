"""Steady state: which steps count (`--steps` on `report` and `query`).

    --steps 3..9    steps 3 to 9 (either end may be left out: 3.. or ..9)
    --steps auto    every step but the warm-up: leading steps that are slower than the rest by more than their
                    spread (WARMUP_SPREADS robust standard deviations above the median of the steps after it)
    --steps all     every step (the default)

A session restricted to steps sees only them: each table with a `step` column (slices, ops, collectives, memory,
steps) becomes a view of its rows in those steps, so every query and metric reads the steady steps alone, and
rows outside any step (step NULL) are left out too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import schema
from .errors import TraceError

if TYPE_CHECKING:  # pandas only where --steps is given: a plain query loads none
    import pandas as pd

WARMUP_SPREADS = 3.0  # a leading step slower than median + 3 robust sd of the steps after it is warm-up
MIN_STEADY = 2  # warm-up detection keeps at least this many steps
STEP_TABLES = tuple(name for name, t in schema.TABLES.items() if "step" in t.column_names)
_RANGE = re.compile(r"^\s*(-?\d+)?\s*\.\.\s*(-?\d+)?\s*$")


@dataclass(frozen=True)
class Steps:
    mode: str  # 'all', 'range' or 'auto'
    first: int | None = None
    last: int | None = None

    def __str__(self) -> str:
        if self.mode != "range":
            return self.mode
        return f"{'' if self.first is None else self.first}..{'' if self.last is None else self.last}"


def parse(text: str | None) -> Steps:
    """'3..9', '3..', '..9', 'auto', 'all' (None: all)."""
    if text is None or text.strip() == "all":
        return Steps("all")
    if text.strip() == "auto":
        return Steps("auto")
    m = _RANGE.match(text)
    if not m or m.group(1) is m.group(2) is None:
        raise TraceError(f"--steps {text!r}", "expected FIRST..LAST (e.g. 3..9, 3.., ..9), auto or all")
    first, last = (None if g is None else int(g) for g in m.groups())
    if first is not None and last is not None and first > last:
        raise TraceError(f"--steps {text!r}", f"the first step ({first}) is after the last ({last})")
    return Steps("range", first, last)


def warmup(times) -> int:
    """How many leading steps of `times` (a run's step times, in step order) are warm-up: each leading step slower
    than the median of the steps after it by more than WARMUP_SPREADS robust standard deviations of those (1.4826
    × their median absolute deviation; at least 1 % of the median, so that identical steps do not make every
    step an outlier), stopping at the first that is not, keeping at least MIN_STEADY steps."""
    import numpy as np  # (here: `tracesql query` imports this module, and numpy took a third of its start-up)

    t = np.asarray(times, dtype="float64")
    n = 0
    while len(t) - n > MIN_STEADY:
        rest = t[n + 1:]
        median = np.median(rest)
        spread = max(1.4826 * np.median(np.abs(rest - median)), 0.01 * median)
        if t[n] <= median + WARMUP_SPREADS * spread:
            break
        n += 1
    return n


def steady(per_step: pd.DataFrame, steps: Steps) -> tuple[pd.DataFrame, dict[str, str]]:
    """The steps that count, from `per_step` (run_id, step, step_ns: a row per run and step), and per run a line
    saying which they are ('3..9 (7 steps)', 'auto: 3..9 (7 steps, warm-up 1..2 dropped)', 'all: 1..9 (9 steps)')."""
    import pandas as pd

    kept, used = [], {}
    for run_id, run in per_step.sort_values(["run_id", "step"]).groupby("run_id", sort=False):
        note = ""
        if steps.mode == "range":
            run = run[(run.step >= (steps.first if steps.first is not None else -2**62))
                      & (run.step <= (steps.last if steps.last is not None else 2**62))]
        elif steps.mode == "auto":
            dropped = warmup(run.step_ns.to_numpy())
            note = f", warm-up {_span(run.step.iloc[:dropped])} dropped" if dropped else ", no warm-up found"
            run = run.iloc[dropped:]
        prefix = "" if steps.mode == "range" else f"{steps.mode}: "
        used[run_id] = f"{prefix}{_span(run.step)} ({len(run)} steps{note})" if len(run) else f"{steps}: no steps"
        kept.append(run)
    return (pd.concat(kept, ignore_index=True) if kept else per_step), used


def _span(steps: pd.Series) -> str:
    steps = [int(s) for s in steps]
    return "–" if not steps else str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"


def restrict(con, kept: pd.DataFrame) -> None:
    """From now on `con` sees only the steps of `kept` (run_id, step rows: those of `steady`). Each table with a
    `step` column becomes a view of its rows in them; the whole table stays readable as `<table>_all_steps`."""
    frame = kept.dropna(subset=["step"])[["run_id", "step"]].astype({"step": "int64"})
    con.register("_steady_frame", frame)
    con.execute("CREATE OR REPLACE TEMP TABLE steady_steps AS SELECT * FROM _steady_frame").fetchall()
    con.unregister("_steady_frame")
    keep = "(run_id, step) IN (SELECT (run_id, step) FROM steady_steps)"
    views = {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}
    for name in STEP_TABLES:
        if name in views:
            con.execute(f"ALTER VIEW {name} RENAME TO {name}_all_steps").fetchall()
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_all_steps WHERE {keep}").fetchall()


def step_times(steps_rows: pd.DataFrame) -> pd.DataFrame:
    """(run_id, step, step_ns) from the `steps` query's rows: per step the slowest rank's device window (its
    host range when it has none), as the report's step_time metrics read it."""
    ns = steps_rows.device_ns.astype("float64").fillna(steps_rows.cpu_ns.astype("float64"))
    return steps_rows.assign(step_ns=ns).groupby(["run_id", "step"], as_index=False).step_ns.max()


def apply(con, steps: Steps) -> dict[str, str]:
    """Restrict `con` to the steps that count (see `restrict`); per run, which they are (see `steady`)."""
    from . import queries

    kept, used = steady(step_times(queries.run(con, queries.find("steps")).df()), steps)
    if steps.mode != "all":
        restrict(con, kept)
    return used
