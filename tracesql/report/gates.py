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

A change gate fails only when the change is also larger than the noise (unless --strict): see `judge`.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass

import numpy as np
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
class Noise:
    """How a change compares with the noise (docs/guides/ci.md, "Noise-aware gates")."""

    baseline: float  # the baseline's value: the metric over the replicates' pooled steps, else their mean
    within: float | None  # robust sd of the gated run's per-step values (1.4826 × MAD), in the metric's unit
    between: float | None  # sd of the replicate runs' values (2 or more replicates), in the metric's unit
    p: float | None  # one-sided rank-test p-value of the change (None: too few steps to reach the confidence)
    significant: bool | None  # None: neither test could be made: the gate is judged by its threshold alone
    text: str  # '; noise ±1.4 % within the run, ±0.6 % between runs: significant at 99 % (rank test p = 0.0004)'


def _pct(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:g}"


def judge(gate: Gate, value: float, run_steps, base_steps, replicate_values, confidence: float) -> Noise:
    """The change of `value` (the gated run's metric) from the replicates', against the noise, at `confidence`.

    Two tests, each made when the data allow it; a change is significant when every test made says so:
    - steps: a one-sided Mann-Whitney U (rank) test of the gated run's per-step values against the replicates'
      pooled per-step values, in the gate's direction: significant when p < 1 − confidence. Made when the step
      counts can reach that p at all (n and m steps reach 1 / C(n + m, n) at best).
    - runs: with two or more replicate runs, the change must exceed z · sd_between · √(1 + 1/k) (the half-width
      of a one-sided prediction interval for one more run of k replicates; z the normal quantile at confidence).
    """
    metric = METRICS[gate.metric]
    worse_up = gate.op in (">", ">=")
    run_steps = np.asarray([v for v in run_steps if not pd.isna(v)], dtype="float64")
    base_steps = np.asarray([v for v in base_steps if not pd.isna(v)], dtype="float64")
    replicates = np.asarray([v for v in replicate_values if not pd.isna(v)], dtype="float64")
    if len(base_steps) and gate.metric in ("step_time_p50", "step_time_p90"):
        baseline = float(np.quantile(base_steps, 0.5 if gate.metric == "step_time_p50" else 0.9))
    else:
        baseline = float(replicates.mean()) if len(replicates) else math.nan
    alpha = 1 - confidence
    within = float(1.4826 * np.median(np.abs(run_steps - np.median(run_steps)))) if len(run_steps) > 1 else None
    between = float(replicates.std(ddof=1)) if len(replicates) > 1 else None
    delta = value - baseline
    verdicts, notes, p = [], [], None
    if len(run_steps) and len(base_steps):
        best = 1 / math.comb(len(run_steps) + len(base_steps), len(run_steps))
        if best < alpha:
            from scipy.stats import mannwhitneyu

            p = float(mannwhitneyu(run_steps, base_steps, alternative="greater" if worse_up else "less").pvalue)
            verdicts.append(p < alpha)
        else:
            notes.append(f"{len(run_steps)} vs {len(base_steps)} steps reach p = {best:.2g} at best")
    if between is not None:
        from scipy.stats import norm

        margin = norm.ppf(confidence) * between * math.sqrt(1 + 1 / len(replicates))
        verdicts.append(delta > margin if worse_up else delta < -margin)
    elif not notes:
        notes.append("fewer than 2 replicate runs")
    def unit(x, of):  # a spread as people read it: pp for percentages, else % of the value it spreads around
        if metric.kind == "percent":
            return f"{x:.2f} pp"
        return f"{100 * x / abs(of):.1f} %" if of else display(gate.metric, x)

    spread = [f"±{unit(within, value)} within the run (per step)"] if within is not None else []
    spread += [f"±{unit(between, baseline)} between {len(replicates)} replicate runs"] if between is not None else []
    noise = "; noise " + ", ".join(spread) if spread else "; noise unknown"
    conf = _pct(round(confidence * 100, 4))
    rank = f" (rank test p = {p:.2g})" if p is not None else ""
    if not verdicts:
        return Noise(baseline, within, between, None, None,
                     f"{noise}: not judged at {conf} % ({'; '.join(notes)}): threshold only")
    significant = all(verdicts)
    return Noise(baseline, within, between, p, significant,
                 f"{noise}: {'significant' if significant else 'within noise'} at {conf} %{rank}")


@dataclass(frozen=True)
class Verdict:
    gate: Gate
    run_id: str
    passed: bool
    reason: str  # one line
    significant: bool | None = None  # the change against the noise (Noise.significant); None: not judged


def evaluate(gate: Gate, run: pd.Series, base: pd.Series, noise: Noise | None = None,
             strict: bool = False, baseline_name: str | None = None) -> Verdict:
    """The gate on `run` (a row of FleetMetrics.runs), against `base` (the baseline's row), or against the
    replicates when `noise` (judge's) is given: then a change gate fails only when the change is significant
    (or noise could not be judged), unless `strict`. `baseline_name` says what the baseline is."""
    name = gate.metric
    value, before = run.get(name), base.get(name)
    if noise is not None and gate.mode != "value":
        before = noise.baseline
    where = f"{run.run_id}: {name} {display(name, value)}"
    if pd.isna(value):
        return Verdict(gate, run.run_id, False, f"{where}: no value ({METRICS[name].doc})")
    if gate.mode == "value":
        observed, shown = value, None
    else:
        if pd.isna(before):
            return Verdict(gate, run.run_id, False, f"{where}: the baseline {base.run_id} has no value")
        where += f" vs {display(name, before)} in {baseline_name or 'baseline ' + base.run_id}"
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
    reason = f"{where} ({shown})" if shown else where
    if noise is None or gate.mode == "value":
        return Verdict(gate, run.run_id, not failed, reason)
    reason += noise.text
    if failed and noise.significant is False and not strict:
        reason += ": passes (the change is within noise; --strict fails it)"
        failed = False
    return Verdict(gate, run.run_id, not failed, reason, noise.significant)
