"""device_timeline and the queries built on it, against a brute-force interval sweep written independently here.

Hypothesis generates device timelines with what makes sweeps go wrong: ties (identical kernels on several
streams, events that start or end together), zero-length and nested events, every class, several devices. Many
timelines are checked at once, as the ranks of one in-memory `slices` table, so that a CI run checks well over
a thousand of them in seconds.
"""

from __future__ import annotations

import functools

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracesql
from conftest import empty_session, write_trace
from tracesql import queries, schema

COMPUTE, COMMUNICATION, MEMORY = 1, 2, 4
# a kernel name (or kind) of each class under the default rules (tracesql/functions/kernel_classes.csv)
EVENT_OF_CLASS = {COMPUTE: ("kernel", "gemm_kernel"), COMMUNICATION: ("kernel", "ncclDevKernel_AllReduce"),
                  MEMORY: ("memcpy", "Memcpy HtoD (Pageable -> Device)")}
TIMELINES_PER_EXAMPLE = 40
EXAMPLES = 30  # 1,200 timelines per run

event = st.tuples(
    st.integers(0, 1),  # device
    st.integers(0, 2),  # stream
    st.sampled_from([COMPUTE, COMMUNICATION, MEMORY]),
    st.integers(0, 40),  # start: a small range, so that starts and ends coincide often
    st.integers(0, 15),  # duration, zero included
)
# a timeline: some events, and copies of some of them (picked by index) on another stream (identical kernels on
# several streams); drawn as plain lists, not a flatmap: a strategy built per draw made generating the examples
# take as long as checking them
timeline = st.tuples(st.lists(event, min_size=1, max_size=12), st.lists(st.integers(0, 11), max_size=4)).map(
    lambda drawn: drawn[0] + [(d, (s + 1) % 3, c, t, n)
                              for d, s, c, t, n in (drawn[0][i % len(drawn[0])] for i in drawn[1])])


#: one in-memory database with the schema's tables and the functions, which every session() empties and fills
#: again: installing the functions takes longer than an example's queries
database = functools.cache(empty_session)


def session(timelines: list[list[tuple]]) -> duckdb.DuckDBPyConnection:
    """A DuckDB session with the schema's tables, these timelines as ranks 0.. of run 'r' (nothing else), and the
    functions."""
    con = database()
    for name in schema.TABLES:
        con.execute(f"DELETE FROM {name}")
    rows = [(rank, i, *EVENT_OF_CLASS[bit], ts, dur, device, stream)
            for rank, events in enumerate(timelines) for i, (device, stream, bit, ts, dur) in enumerate(events)]
    # one statement over column lists: executemany's row at a time takes longer than the queries
    con.execute("INSERT INTO slices (run_id, rank, slice_id, kind, name, ts, dur, device_id, stream) "
                "SELECT 'r', unnest($1), unnest($2), unnest($3), unnest($4), unnest($5), unnest($6), unnest($7), "
                "unnest($8)", [list(column) for column in zip(*rows)])
    con.execute("INSERT INTO ranks (run_id, rank) SELECT 'r', range FROM range($1)", [len(timelines)])
    return con


def union(intervals) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [tuple(m) for m in merged]


def covered(intervals, t: float) -> bool:
    return any(a <= t < b for a, b in intervals)


def brute_force(events) -> dict[int, dict]:
    """Per device: time with exactly each set of classes running, and the window, by checking every elementary
    segment between consecutive event edges."""
    out = {}
    for device in sorted({e[0] for e in events}):
        mine = [e for e in events if e[0] == device]
        unions = {bit: union((t, t + n) for _, _, b, t, n in mine if b == bit) for bit in (1, 2, 4)}
        edges = sorted({t for _, _, _, s, n in mine for t in (s, s + n)})
        by_classes: dict[int, int] = {}
        for a, b in zip(edges, edges[1:]):
            classes = sum(bit for bit, u in unions.items() if covered(u, a))  # constant over [a, b)
            by_classes[classes] = by_classes.get(classes, 0) + b - a
        out[device] = {"window": edges[-1] - edges[0], "by_classes": by_classes,
                       "comm": sum(b - a for a, b in unions[2]), "compute": sum(b - a for a, b in unions[1])}
    return out


def stream_gaps(events) -> dict[tuple, list[int]]:
    """Per (device, stream): the gaps between the end of everything before and the next start (bubbles)."""
    gaps: dict[tuple, list[int]] = {}
    for key in sorted({(e[0], e[1]) for e in events}):
        reach = None
        for _, _, _, ts, dur in sorted((e for e in events if (e[0], e[1]) == key), key=lambda e: (e[3], e[3] + e[4])):
            if reach is not None and ts > reach:
                gaps.setdefault(key, []).append(ts - reach)
            reach = ts + dur if reach is None else max(reach, ts + dur)
    return gaps


def run(con, name: str, **params):
    rel = queries.run(con, queries.find(name), params)
    return [dict(zip(rel.columns, row)) for row in rel.fetchall()]


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(timeline, min_size=TIMELINES_PER_EXAMPLE, max_size=TIMELINES_PER_EXAMPLE))
def test_timeline_queries_equal_a_brute_force_sweep(timelines):
    con = session(timelines)
    segments: dict[tuple, dict[int, int]] = {}
    for rank, device, classes, dur in con.execute(
            "SELECT rank, device_id, classes, sum(dur) FROM device_timeline() GROUP BY ALL").fetchall():
        segments.setdefault((rank, device), {})[classes] = int(dur)
    breakdown = {(r["rank"], r["device_id"]): r for r in run(con, "temporal_breakdown")}
    overlap = {(r["rank"], r["device_id"]): r for r in run(con, "overlap")}
    kernels: dict[tuple, dict[int, int]] = {}
    for r in run(con, "kernel_breakdown"):
        kernels.setdefault((r["rank"], r["device_id"]), {})[r["classes"]] = r["busy_ns"]
    bubbles: dict[tuple, int] = {}
    for r in run(con, "bubbles"):
        key = (r["rank"], r["device_id"], r["stream"])
        bubbles[key] = bubbles.get(key, 0) + r["idle_ns"]
    for rank, events in enumerate(timelines):
        for device, truth in brute_force(events).items():
            key = (rank, device)
            expected = {c: ns for c, ns in truth["by_classes"].items() if ns > 0}
            assert segments.get(key, {}) == expected, (events, device)
            if truth["window"] == 0:
                continue  # only zero-length events: no window, no row
            b = breakdown[key]
            by = truth["by_classes"]
            assert b["window_ns"] == truth["window"]
            assert b["compute_ns"] == sum(ns for c, ns in by.items() if c & 1)
            assert b["exposed_comm_ns"] == sum(ns for c, ns in by.items() if c & 3 == 2)
            assert b["exposed_memory_ns"] == sum(ns for c, ns in by.items() if c == 4)
            assert b["idle_ns"] == by.get(0, 0)
            o = overlap[key]
            assert o["comm_ns"] == truth["comm"] and o["compute_ns"] == truth["compute"]
            assert o["overlap_ns"] == sum(ns for c, ns in by.items() if c & 3 == 3)
            assert kernels.get(key, {}) == {c: ns for c, ns in expected.items() if c > 0}
        for (device, stream), gaps in stream_gaps(events).items():
            assert bubbles[(rank, device, stream)] == sum(gaps), (events, device, stream)
        assert sum(v for k, v in bubbles.items() if k[0] == rank) == sum(map(sum, stream_gaps(events).values()))


def test_identical_kernels_on_two_streams_are_not_communication(tmp_path):
    """The issue's trace: 15 steps, each one GEMM on stream 7 and an identical one on stream 8 (same start, same
    end), no communication at all. Counting each class's events once per instant gives no communication."""
    t0, events = 1_000_000, []
    for i in range(15):
        ts = t0 + 150 * i
        for stream in (7, 8):
            corr = 2 * i + stream - 6
            events += [
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 80, "pid": 1,
                 "tid": 1, "args": {"correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": f"gemm_s{stream}", "ts": ts, "dur": 80, "pid": 0,
                 "tid": stream, "args": {"correlation": corr, "device": 0, "stream": stream}},
            ]
    run_dir = tmp_path / "run"
    tracesql.ingest([write_trace(tmp_path / "gemms.json", events)], run_dir)
    breakdown = tracesql.query("temporal_breakdown", run_dir).iloc[0]
    assert breakdown.exposed_comm_ns == 0 and breakdown.compute_ns == 15 * 80_000
    assert breakdown.idle_ns == 14 * 70_000 and breakdown.window_ns == 14 * 150_000 + 80_000
    overlap = tracesql.query("overlap", run_dir).iloc[0]
    assert overlap.comm_ns == 0 and overlap.overlap_ns == 0
    kinds = tracesql.query("kernel_breakdown", run_dir)
    assert list(kinds.kernel_type) == ["compute"] and kinds.busy_ns[0] == 15 * 80_000


@pytest.mark.parametrize("copies", [2, 3, 5])
def test_n_identical_compute_kernels_count_once(copies):
    con = session([[(0, s, COMPUTE, 10, 5) for s in range(copies)]])
    assert con.execute("SELECT classes, dur FROM device_timeline()").fetchall() == [(1, 5)]


def test_runs_and_devices_swept_together_keep_their_own_segments():
    """One sweep orders every (run, rank, device) together: each device's segments must be those it has alone,
    whatever comes before or after it in that order (here a device with no id, and the same rank in two runs)."""
    con = session([[(0, 0, COMPUTE, 10, 30), (1, 0, MEMORY, 0, 5)]])
    con.execute("INSERT INTO slices (run_id, rank, slice_id, kind, name, ts, dur, device_id, stream) VALUES "
                "('a', 0, 1, 'kernel', 'ncclDevKernel_AllReduce', 0, 20, 0, 0), "
                "('a', 0, 2, 'kernel', 'gemm_kernel', 35, 10, NULL, 0), "
                "('a', 0, 3, 'kernel', 'gemm_kernel', 50, 5, NULL, 1)")
    assert con.execute("SELECT run_id, rank, device_id, ts, dur, classes FROM device_timeline() "
                       "ORDER BY run_id, device_id NULLS LAST, ts").fetchall() == [
        ("a", 0, 0, 0, 20, COMMUNICATION),
        ("a", 0, None, 35, 10, COMPUTE), ("a", 0, None, 45, 5, 0), ("a", 0, None, 50, 5, COMPUTE),
        ("r", 0, 0, 10, 30, COMPUTE),
        ("r", 0, 1, 0, 5, MEMORY)]


def test_many_running_events_of_a_class_do_not_reach_another_class():
    """The three counts of running events share one integer (21 bits each): 100,000 compute kernels running at
    once must stay compute, and the communication kernel among them must still be seen (and end)."""
    con = session([[(0, 0, COMMUNICATION, 100, 50)]])
    con.execute("INSERT INTO slices (run_id, rank, slice_id, kind, name, ts, dur, device_id, stream) "
                "SELECT 'r', 0, 1 + i, 'kernel', 'gemm_kernel', 0, 1000, 0, i % 8 FROM range(100000) t(i)")
    assert con.execute("SELECT ts, dur, classes FROM device_timeline() ORDER BY ts").fetchall() == [
        (0, 100, COMPUTE), (100, 50, COMPUTE | COMMUNICATION), (150, 850, COMPUTE)]
