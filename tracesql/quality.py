"""Data-quality checks: the `warnings` table. What a reader skipped, what normalize could not link, and what
only shows across ranks (clocks far apart). Each check that finds something is one row with a count, an example
and a message; the data stays queryable (damaged events are skipped, unlinked events stay unlinked)."""

from __future__ import annotations

import numpy as np

from .db import sql_list
from .schema import DEVICE_TIME_KINDS, LAUNCH_KINDS

#: A reader's skip reason -> its check. Reasons not listed are `malformed_event`.
SKIP_CHECKS = {
    "end before start": "end_before_start",
    "slice ends before it begins": "end_before_start",
    "missing or non-numeric ts": "missing_timestamp",
    "aggregated event without a timestamp (num_occurrences)": "missing_timestamp",
    "missing dur": "missing_duration",
    "time out of range": "time_out_of_range",
    "unsupported phase": "unsupported_event",
    "unsupported track event type": "unsupported_event",
    "step without end": "unterminated_step",
    "slice never ended": "unterminated_slice",
    "begin that never ends": "unterminated_slice",
    "end without a begin": "unmatched_end",
    "slice end without a begin": "unmatched_end",
    "timestamp on a clock no snapshot defines": "missing_timestamp",
    "NVTX range without an end": "unterminated_slice",
}
#: Ranks whose trace starts this far from the median rank's start have clocks that disagree (or are not from
#: the same job): cross-rank timing (collective skew, stragglers) is not to be trusted.
CLOCK_SKEW_NS = 60 * 10**9


def _row(check: str, count: int, example, message: str) -> dict:
    return {"check_name": check, "event_count": int(count), "example": example, "message": message}


def skipped_rows(skipped: dict[str, int], examples: dict[str, str]) -> list[dict]:
    return [_row(SKIP_CHECKS.get(reason, "malformed_event"), n, examples.get(reason),
                 f"{n} event(s) skipped: {reason}") for reason, n in skipped.items()]


def link_checks(con, steps: dict) -> dict[int, list[dict]]:
    """Checks on the links normalize made, per rank (rank -> rows), in SQL over `read_slices`, `launchers` (launch
    calls by correlation id, with how many share it), `launch` (device work -> its launch call) and `step_ranges`.
    `steps`: the step ranges (rank, slice_id, name, end_ts), by rank and time."""
    rows: dict[int, list[dict]] = {}
    unlaunched = {rank: (n, first) for rank, n, first in con.execute(f"""
        SELECT rank, count(*), arg_min(name, slice_id) FROM read_slices s ANTI JOIN launch USING (rank, slice_id)
        WHERE kind IN ({sql_list(DEVICE_TIME_KINDS)}) GROUP BY rank""").fetchall()}
    launchers = {rank: (calls, repeats) for rank, calls, repeats in con.execute("""
        SELECT rank, sum(calls), sum(calls - 1) FILTER (WHERE calls > 1) FROM launchers GROUP BY rank""").fetchall()}
    # host events of a category tracesql does not know may carry the device work's correlation ids
    unknown = dict(con.execute(f"""
        SELECT rank, {{'category': category, 'n': count(*)}} FROM read_slices o
        SEMI JOIN (SELECT rank, correlation FROM read_slices WHERE kind IN ({sql_list(DEVICE_TIME_KINDS)})) d
          USING (rank, correlation)
        WHERE o.kind = 'other' GROUP BY rank, category
        QUALIFY row_number() OVER (PARTITION BY rank ORDER BY count(*) DESC, category) = 1""").fetchall()
        if any(not launchers.get(rank, (None,))[0] for rank in unlaunched) else ())
    for rank, (n, first) in sorted(unlaunched.items()):
        if launchers.get(rank, (None,))[0]:
            why = "no runtime call has their correlation id (the profile started after the launch, or a damaged id)"
        elif rank in unknown:
            why = (f"their correlation ids are on {unknown[rank]['n']} host event(s) of category "
                   f"'{unknown[rank]['category']}', which tracesql does not know as runtime calls")
        else:
            why = "the trace has no host runtime calls (device work only, or launches not recorded)"
        rows.setdefault(rank, []).append(_row(
            "kernel_without_launch", n, first, f"{n} device event(s) without a launch: {why}; they count as device "
            "time and belong to the step they ran in, but to no op"))
    if any(repeats for _, repeats in launchers.values()):
        for rank, value, calls in con.execute(f"""
            SELECT s.rank, r.value, list(s.name ORDER BY s.slice_id)[:3] FROM read_slices s
            JOIN (SELECT rank, min(correlation) FILTER (WHERE calls > 1) AS value FROM launchers GROUP BY rank) r
              ON s.rank = r.rank AND s.correlation = r.value
            WHERE s.kind IN ({sql_list(LAUNCH_KINDS)}) GROUP BY s.rank, r.value ORDER BY s.rank""").fetchall():
            repeats = launchers[rank][1]
            rows.setdefault(rank, []).append(_row(
                "repeated_correlation", repeats, f"correlation {value}: " + ", ".join(calls),
                f"{repeats} launch call(s) reuse the correlation id of another call: their device work is linked to "
                "the earliest call with that id"))
    if len(steps["slice_id"]):
        for rank, last_end, others in con.execute("""
            SELECT rank, max(ts + dur), count(*) FROM read_slices ANTI JOIN step_ranges USING (rank, slice_id)
            GROUP BY rank ORDER BY rank""").fetchall():
            lo, hi = np.searchsorted(steps["rank"], rank, "left"), np.searchsorted(steps["rank"], rank, "right")
            last_end = last_end if last_end is not None else np.iinfo(np.int64).min
            open_steps = lo + np.flatnonzero(steps["end_ts"][lo:hi] > last_end)
            if len(open_steps):
                rows.setdefault(rank, []).append(_row(
                    "unterminated_step", len(open_steps), steps["name"][open_steps[0]],
                    f"{len(open_steps)} step(s) end after every other event of the trace (cut short?): their "
                    "device time covers what was recorded"))
    return rows


CLOCK_SKEW_SQL = f"""
WITH r AS (SELECT * FROM read_parquet($ranks)),
m AS (SELECT median(trace_start_ns) AS mid, count(*) AS n FROM r)
SELECT r.run_id, r.rank, r.source_path, 'clock_skew' AS check_name, 1 AS event_count,
    'trace_start_ns=' || r.trace_start_ns AS example,
    printf('trace starts %.1f s %s the median start of the %d ranks: clocks disagree, cross-rank timing '
           '(collective skew, stragglers) is unreliable', abs(r.trace_start_ns - m.mid) / 1e9,
           CASE WHEN r.trace_start_ns > m.mid THEN 'after' ELSE 'before' END, m.n) AS message
FROM r, m
WHERE m.n > 1 AND abs(r.trace_start_ns - m.mid) > {CLOCK_SKEW_NS}
ORDER BY r.rank
"""
