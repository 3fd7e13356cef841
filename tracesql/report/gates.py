"""Regression gates (`--fail-on`): a small grammar, and its verdict on a run against the baseline.

    GATE   := METRIC OP [SIGN] NUMBER [UNIT]
    OP     := > | >= | < | <=          the gate fails when the comparison holds
    SIGN   := + | -                    a sign makes it a change from the baseline; no sign: the run's own value
    UNIT   := %                        with a sign: relative change, (run − baseline) / baseline · 100
            | pp                       percentage points (percent metrics: overlap, idle, ...)
            | ns us ms s               time metrics
            | B KB MB GB KiB MiB GiB   byte metrics
            | GB/s                     bandwidth metrics
            (none)                     the metric's own unit: ns, %, bytes, GB/s

    step_time_p50>+5%      fails when the median step got more than 5 % slower than the baseline's
    overlap<-10pp          fails when overlap dropped by more than 10 percentage points
    peak_memory>+2GiB      fails when peak memory grew by more than 2 GiB
    idle>30                fails when the run's devices are idle more than 30 % of the time (no baseline needed)
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass

import pandas as pd

from ..errors import TraceError
from .metrics import METRICS, display

_GATE = re.compile(r"^\s*([A-Za-z_]\w*)\s*(>=|<=|>|<)\s*([+-]?)\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z%/µ]*)\s*$")
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
_UNITS = {
    "time": {"": 1, "ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9},
    "bytes": {"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30},
    "bandwidth": {"": 1, "GB/s": 1, "MB/s": 1e-3},
    "percent": {"": 1, "pp": 1, "%": 1},
}


@dataclass(frozen=True)
class Gate:
    text: str
    metric: str
    op: str
    mode: str  # 'relative' (% change), 'delta' (change in the metric's unit) or 'value' (the run's own value)
    threshold: float  # signed; in percent for 'relative', else in the metric's unit (ns, %, bytes, GB/s)


def parse(text: str) -> Gate:
    """A gate from its text; a TraceError naming the gate and the problem when it does not parse."""
    m = _GATE.match(text)
    if not m:
        raise TraceError(f"--fail-on {text!r}", "expected METRIC OP [+|-]NUMBER[UNIT], e.g. 'step_time_p50>+5%' "
                                               "or 'overlap<-10pp'")
    name, op, sign, number, unit = m.groups()
    if name not in METRICS:
        raise TraceError(f"--fail-on {text!r}", f"unknown metric {name!r} (metrics: {', '.join(METRICS)})")
    kind = METRICS[name].kind
    value = float(number) * (-1 if sign == "-" else 1)
    if sign and unit == "%":
        return Gate(text, name, op, "relative", value)
    units = _UNITS[kind]
    if unit not in units:
        hint = "a relative change needs a sign (+5%)" if unit == "%" else f"units for {name}: " + \
            ", ".join(u for u in units if u)
        raise TraceError(f"--fail-on {text!r}", f"unit {unit!r} does not fit {name} ({hint})")
    return Gate(text, name, op, "delta" if sign else "value", value * units[unit])


@dataclass(frozen=True)
class Verdict:
    gate: Gate
    run_id: str
    passed: bool
    reason: str  # one line


def evaluate(gate: Gate, run: pd.Series, base: pd.Series) -> Verdict:
    """The gate on `run` (a row of FleetMetrics.runs), against `base` (the baseline's row)."""
    name = gate.metric
    value, before = run.get(name), base.get(name)
    where = f"{run.run_id}: {name} {display(name, value)}"
    if pd.isna(value):
        return Verdict(gate, run.run_id, False, f"{where}: no value ({METRICS[name].doc})")
    if gate.mode == "value":
        observed, shown = value, None
    else:
        if pd.isna(before):
            return Verdict(gate, run.run_id, False, f"{where}: the baseline {base.run_id} has no value")
        where += f" vs {display(name, before)} in baseline {base.run_id}"
        if gate.mode == "relative":
            if before == 0:
                return Verdict(gate, run.run_id, False, f"{where}: no relative change from 0")
            observed = (value - before) / abs(before) * 100
            shown = f"{observed:+.1f}%"
        else:
            observed = value - before
            shown = f"{observed:+.2f} pp" if METRICS[name].kind == "percent" else \
                ("+" if observed >= 0 else "-") + display(name, abs(observed))
    failed = _OPS[gate.op](observed, gate.threshold)
    return Verdict(gate, run.run_id, not failed, f"{where} ({shown})" if shown else where)
