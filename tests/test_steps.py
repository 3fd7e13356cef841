"""Steps on the device: which step device work belongs to (its launch's; unlaunched work by its order on its
stream) and the disjoint per-device step windows every per-step number uses (docs/concepts/steps.md)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import tracesql
from conftest import CORPUS, DATASETS, REPO, corpus_path, write_trace
from tracesql import queries
from tracesql.readers import trace_suffixes

US = 1000


def step_range(n: int, ts: int, dur: int) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur, "pid": 1,
            "tid": 1}


def launched(corr: int, launch_ts: int, ts: int, dur: int, stream: int, name: str = "gemm") -> list[dict]:
    return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch_ts, "dur": 2, "pid": 1,
             "tid": 1, "args": {"correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream,
             "args": {"correlation": corr, "device": 0, "stream": stream}}]


def unlaunched(ts: int, dur: int, stream: int, name: str) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream,
            "args": {"device": 0, "stream": stream}}


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    """Two host steps ([0, 100) and [100, 200) µs); on stream 7 work queued before the profiler (no launch),
    a step-1 kernel, then unlaunched work that runs during host step 2; on stream 8 only unlaunched work; on
    stream 9 unlaunched work before a step-2 kernel."""
    tmp = tmp_path_factory.mktemp("steps")
    events = [step_range(1, 0, 100), step_range(2, 100, 100),
              unlaunched(5, 5, 7, "u_before_profiling"),
              *launched(1, 10, 20, 30, 7, "k_step1"),
              unlaunched(105, 10, 7, "u_after_step1_kernel"),
              *launched(2, 110, 130, 20, 7, "k_step2"),
              unlaunched(150, 10, 8, "u_stream_without_launches"),
              unlaunched(90, 5, 9, "u_before_step2_kernel"),
              *launched(3, 120, 140, 5, 9, "k_step2_s9")]
    run = tmp / "run"
    tracesql.ingest([write_trace(tmp / "steps.json", events)], run)
    return run


def test_unlaunched_work_takes_the_step_of_its_stream_neighbours(crafted):
    steps = dict(tracesql.connect(crafted).execute(
        "SELECT name, step FROM slices WHERE kind = 'kernel' ORDER BY name").fetchall())
    assert steps == {
        "u_before_profiling": None,          # before the first step's first kernel on its stream: pre-profile
        "k_step1": 1, "k_step2": 2, "k_step2_s9": 2,  # launched: the launch's step
        "u_after_step1_kernel": 1,           # after a step-1 kernel on its stream (though it runs in host step 2)
        "u_stream_without_launches": 2,      # nothing launched on its stream: by time
        "u_before_step2_kernel": 2,          # no launched work before it; the next is step 2's (not the first)
    }


def test_step_windows_are_disjoint_and_cover_the_steps_work(crafted):
    con = tracesql.connect(crafted)
    windows = con.execute("SELECT step, ts, te, events FROM step_windows() ORDER BY ts").fetchall()
    # step 1: its first event (k_step1 at 20 µs) to step 2's first (u_before_step2_kernel at 90 µs); step 2: to
    # the last end of stepped work (u_stream_without_launches, 160 µs)
    assert windows == [(1, 20 * US, 90 * US, 2), (2, 90 * US, 160 * US, 4)]
    steps = con.execute("SELECT step, device_ts, device_dur, kernel_count FROM steps ORDER BY step").fetchall()
    assert steps == [(1, 20 * US, 70 * US, 2), (2, 90 * US, 70 * US, 4)]
    per_step = tracesql.query("temporal_breakdown", crafted, per="step").set_index("step")
    assert list(per_step.window_ns) == [70 * US, 70 * US]
    # in step 1's window: k_step1 (20-50) busy, idle until 90; step 2's: 90-95, 105-115, 130-160 busy
    assert list(per_step.compute_ns) == [30 * US, 45 * US]
    assert list(per_step.idle_ns) == [40 * US, 25 * US]
    assert list(tracesql.query("steps", crafted).device_ns) == [70 * US, 70 * US]


def test_idle_gaps_take_the_step_of_the_window_they_start_in(crafted):
    gaps = tracesql.connect(crafted).execute(
        "SELECT ts, dur, step FROM idle_gaps(scope := 'device') ORDER BY ts").fetchall()
    assert gaps == [(10 * US, 10 * US, None), (50 * US, 40 * US, 1), (95 * US, 10 * US, 2), (115 * US, 15 * US, 2)]
    bubbles = tracesql.query("bubbles_largest", crafted).set_index("ts")
    assert bubbles.loc[50 * US, "step"] == 1 and bubbles.loc[95 * US, "step"] == 2


def test_negative_queue_length_rank0_steps_read_the_host_steps(ingested):
    """The issue's example: a step read 375 ms where the host step and compute per step are ~216 ms."""
    run = ingested(corpus_path("hta", "tests", "data", "negative_queue_length_values_check"))
    steps = tracesql.connect(run).execute("SELECT step, device_dur FROM steps ORDER BY step").fetchall()
    assert [round(d / 1e5) / 10 for _, d in steps] == [208.7, 216.4, 216.3, 215.4, 372.3]


def test_resnet_act_checkpoint_steps_with_unlaunched_kernels(ingested):
    """968 kernels whose launch was not captured: by host time steps 15/16 read 49.0/51.2 ms, 18.6 ms for 17."""
    run = ingested(corpus_path("tracelens", "tests", "traces", "mi300", "resnet_act_checkpoint.json.gz"))
    steps = tracesql.connect(run).execute("SELECT step, device_dur FROM steps ORDER BY step").fetchall()
    assert [(s, round(d / 1e5) / 10) for s, d in steps] == [(15, 19.0), (16, 19.0), (17, 18.6)]


TRACES = sorted(p for p in CORPUS.rglob("*") if p.is_file() and p.name.endswith(trace_suffixes())) \
    if CORPUS.exists() else []
TOTALS = ("window_ns", "compute_ns", "exposed_comm_ns", "exposed_memory_ns", "idle_ns")
# the whole-run totals over the span of the step windows of each device: device_timeline clipped to it
SPAN_TOTALS = """
WITH span AS (
    SELECT run_id, rank, device_id, min(ts) AS ts, max(te) AS te FROM step_windows({args}) GROUP BY ALL
), t AS (
    SELECT t.rank, t.device_id, greatest(t.ts, s.ts) AS ts, least(t.ts + t.dur, s.te) - greatest(t.ts, s.ts) AS dur,
        t.classes
    FROM device_timeline({args}) t JOIN span s USING (run_id, rank, device_id)
    WHERE t.ts < s.te AND t.ts + t.dur > s.ts
)
SELECT rank, device_id, sum(dur), sum(dur) FILTER (WHERE classes & 1 = 1), sum(dur) FILTER (WHERE classes & 3 = 2),
    sum(dur) FILTER (WHERE classes & 7 = 4), sum(dur) FILTER (WHERE classes = 0),
    sum(dur) FILTER (WHERE classes & 2 = 2), sum(dur) FILTER (WHERE classes & 3 = 3)
FROM t GROUP BY ALL ORDER BY ALL
"""
HTA = {"class_scheme": "hta", "analysis_window": "hta", "time_unit_ns": 1000}
# step_timeline and idle_gaps' step by their definitions: range joins of segments and gaps with the windows
CLIPPED = """
SELECT t.run_id, t.rank, t.device_id, w.step, greatest(t.ts, w.ts), least(t.ts + t.dur, w.te) - greatest(t.ts, w.ts),
    t.classes
FROM device_timeline({args}) t JOIN step_windows({args}) w USING (run_id, rank, device_id)
WHERE t.ts < w.te AND t.ts + t.dur > w.ts
"""
GAP_STEPS = """
SELECT g.* EXCLUDE (step, prev_slice_id, prev_name, next_slice_id, next_name, next_launch_ts), w.step,
    g.prev_slice_id, g.prev_name, g.next_slice_id, g.next_name, g.next_launch_ts
FROM idle_gaps({args}{sep}with_step := false) g
LEFT JOIN step_windows({args}) w
  ON w.run_id = g.run_id AND w.rank = g.rank AND w.device_id = g.device_id AND g.ts >= w.ts AND g.ts < w.te
"""


@pytest.mark.corpus
@pytest.mark.slow  # (every corpus trace with steps ingested: 2-8 s each, over a minute of the default run)
@pytest.mark.skipif(not TRACES, reason="corpus not available")
@pytest.mark.parametrize("trace", TRACES, ids=lambda p: str(p.relative_to(CORPUS)))
def test_per_step_sums_equal_the_run_totals(trace, ingested):
    """On every corpus trace with steps: per device, the step windows are disjoint; per step, temporal_breakdown's
    and overlap's parts add up to the whole run's over the span of the steps (window, compute, communication,
    memory, idle), and overlap ≤ min(communication, compute); the gaps of the device add up to its idle time."""
    con = tracesql.connect(ingested(trace))  # the session's run of the trace (test_corpus queries it too)
    if not con.execute("SELECT count(*) FROM steps").fetchall()[0][0]:
        pytest.skip("no steps")
    for params in ({}, HTA):
        args = ", ".join(f"{k} := {v!r}" for k, v in params.items())
        windows = con.execute(f"""
            SELECT count(*) FILTER (WHERE te < ts), count(*) FILTER (WHERE ts < prev_te)
            FROM (SELECT *, lag(te) OVER (PARTITION BY run_id, rank, device_id ORDER BY ts, te) AS prev_te
                  FROM step_windows({args}))""").fetchall()[0]
        assert windows == (0, 0), "step windows overlap"
        expected = {(r[0], r[1]): [int(x or 0) for x in r[2:]] for r in con.execute(SPAN_TOTALS.format(args=args))
                    .fetchall()}
        # on this connection: a fresh one per query (tracesql.query) costs more than the query on most traces
        breakdown = queries.run(con, queries.find("temporal_breakdown"), {"per": "step", **params}).df()
        overlap = queries.run(con, queries.find("overlap"), {"per": "step", **params}).df()
        assert set(breakdown.groupby(["rank", "device_id"]).groups) == set(expected)
        for key, rows in breakdown.groupby(["rank", "device_id"]):
            sums = [int(rows[c].sum()) for c in TOTALS]
            assert sums == expected[key][:5], (key, params)
            o = overlap[(overlap["rank"] == key[0]) & (overlap.device_id == key[1])]
            assert [int(o.comm_ns.sum()), int(o.overlap_ns.sum())] == expected[key][5:], (key, params)
            assert (o.overlap_ns <= o[["comm_ns", "compute_ns"]].min(axis=1)).all()
        # the window of a segment or gap looked up by bucket (step_window_buckets) is the one a range join with
        # every window of the device finds
        for got, want in ((f"SELECT * FROM step_timeline({args})", CLIPPED.format(args=args)),
                          (f"SELECT * FROM idle_gaps({args})", GAP_STEPS.format(args=args, sep=", " if args else ""))):
            assert con.execute(f"SELECT count(*) FROM (({got} EXCEPT ALL {want}) UNION ALL ({want} EXCEPT ALL {got}))"
                               ).fetchall()[0][0] == 0, (got, params)
        # device gaps inside the windows: the idle time of the steps (gaps outside any window have no step)
        stepped = con.execute(f"""
            SELECT rank, device_id, sum(dur) FROM idle_gaps(scope := 'device', {args + ', ' if args else ''}
                kernel_wait_ns := 30000) WHERE step IS NOT NULL GROUP BY ALL""").fetchall()
        for rank, device, idle in stepped:
            assert idle == expected[(rank, device)][4], (rank, device, params)


HTA_WINDOW = REPO / "tests" / "data" / "hta_window"


@pytest.mark.parametrize("case", ["one_step", "several_steps", "ranks_disagree"])
def test_hta_window_is_htas_on_unlaunched_work(case, tmp_path):
    """HTA 0.5.0's own numbers (expected.json, by make_hta_window.py there): with one step name HTA filters
    nothing, unlaunched kernels included; with several, work launched before the last step began and
    correlation-less work that starts before it; per rank by its own last step when ranks name different steps."""
    expected = json.loads((HTA_WINDOW / "expected.json").read_text())["cases"][case]
    run = tmp_path / "run"
    tracesql.ingest([HTA_WINDOW / case], run)
    breakdown = tracesql.query("temporal_breakdown", run, **HTA).set_index("rank")
    overlap = tracesql.query("overlap", run, **HTA).set_index("rank")
    assert sorted(breakdown.index) == sorted(int(r) for r in expected)
    for rank, ref in expected.items():
        b = breakdown.loc[int(rank)]
        assert b.window_ns == ref["kernel_time_us"] * US
        assert b.idle_ns == ref["idle_time_us"] * US and b.compute_ns == ref["compute_time_us"] * US
        assert b.non_compute_ns == ref["non_compute_time_us"] * US
        pct = overlap.loc[int(rank), "overlap_pct"]
        if ref["comp_comm_overlap_pctg"] is None:
            assert pct != pct  # HTA: NaN without communication
        else:
            assert pct == ref["comp_comm_overlap_pctg"]


# ---- property test: per-step numbers against a brute-force sweep over independently computed windows ----

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_timeline_property import EVENT_OF_CLASS, covered, session, union  # noqa: E402

stepped_event = st.tuples(
    st.integers(0, 1),  # device
    st.integers(0, 2),  # stream
    st.sampled_from([1, 2, 4]),  # class bit
    st.integers(0, 40),  # start
    st.integers(0, 15),  # duration
    st.sampled_from([None, 1, 2, 3]),  # step (None: outside any step)
)


def expected_windows(events) -> dict[tuple, tuple[int, int]]:
    """(device, step) -> [ts, te): the rule of docs/concepts/steps.md, written again here."""
    out = {}
    for device in sorted({e[0] for e in events}):
        mine = [e for e in events if e[0] == device and e[5] is not None]
        if not mine:
            continue
        firsts = sorted((min(e[3] for e in mine if e[5] == s), s) for s in {e[5] for e in mine})
        end = max(e[3] + e[4] for e in mine)
        for i, (first, s) in enumerate(firsts):
            out[(device, s)] = (first, firsts[i + 1][0] if i + 1 < len(firsts) else end)
    return out


def classes_in(events, device, a, b) -> dict[int, int]:
    mine = [e for e in events if e[0] == device]
    unions = {bit: union((e[3], e[3] + e[4]) for e in mine if e[2] == bit) for bit in (1, 2, 4)}
    edges = sorted({a, b} | {t for e in mine for t in (e[3], e[3] + e[4]) if a < t < b})
    by: dict[int, int] = {}
    for x, y in zip(edges, edges[1:]):
        c = sum(bit for bit, u in unions.items() if covered(u, x))
        by[c] = by.get(c, 0) + y - x
    return by


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(stepped_event, min_size=1, max_size=12), min_size=40, max_size=40))
def test_per_step_queries_equal_a_brute_force_sweep(timelines):
    """1,000 generated device timelines per run, each event with a step or none: step_windows, temporal_breakdown
    and overlap per step, and the device gaps of each step against the rule and a brute-force sweep."""
    con = session([[e[:5] for e in events] for events in timelines])
    stepped = [(rank, i, e[5]) for rank, events in enumerate(timelines) for i, e in enumerate(events)
               if e[5] is not None]
    con.execute("UPDATE slices SET step = s.step FROM (SELECT unnest($r) AS rank, unnest($i) AS slice_id, "
                "unnest($s) AS step) s WHERE slices.rank = s.rank AND slices.slice_id = s.slice_id",
                {"r": [x[0] for x in stepped], "i": [x[1] for x in stepped], "s": [x[2] for x in stepped]})
    con.execute("INSERT INTO steps (run_id, rank, step, name, ts, dur) SELECT 'r', r, s, 'ProfilerStep#' || s, "
                "0, 50 FROM range($n) t(r), range(1, 4) u(s)", {"n": len(timelines)})
    windows = {(r, d, s): (a, b) for r, d, s, a, b in
               con.execute("SELECT rank, device_id, step, ts, te FROM step_windows()").fetchall()}
    breakdown = {(r["rank"], r["device_id"], r["step"]): r for r in run(con, "temporal_breakdown", per="step")}
    overlap = {(r["rank"], r["device_id"], r["step"]): r for r in run(con, "overlap", per="step")}
    gaps: dict[tuple, int] = {}
    for r, d, s, ns in con.execute("SELECT rank, device_id, step, sum(dur) FROM idle_gaps(scope := 'device') "
                                   "WHERE step IS NOT NULL GROUP BY ALL").fetchall():
        gaps[(r, d, s)] = int(ns)
    expected_rows = set()
    for rank, events in enumerate(timelines):
        for (device, s), (a, b) in expected_windows(events).items():
            key = (rank, device, s)
            assert windows[key] == (a, b), events
            if b == a:
                continue
            expected_rows.add(key)
            by = classes_in(events, device, a, b)
            row = breakdown[key]
            assert row["window_ns"] == b - a
            assert row["compute_ns"] == sum(ns for c, ns in by.items() if c & 1)
            assert row["exposed_comm_ns"] == sum(ns for c, ns in by.items() if c & 3 == 2)
            assert row["exposed_memory_ns"] == sum(ns for c, ns in by.items() if c == 4)
            assert row["idle_ns"] == by.get(0, 0) == gaps.get(key, 0), events
            o = overlap[key]
            assert o["overlap_ns"] == sum(ns for c, ns in by.items() if c & 3 == 3)
            assert o["comm_ns"] == sum(ns for c, ns in by.items() if c & 2)
    assert set(breakdown) == expected_rows


def run(con, name: str, **params):
    rel = queries.run(con, queries.find(name), params)
    return [dict(zip(rel.columns, row)) for row in rel.fetchall()]


def test_mfu_per_step_uses_the_step_windows(ingested):
    """trace_filter (two ranks of a 128-rank A100 job, fp32): step 551's window is 607.9 ms on rank 1 (its
    first kernel to step 552's first), so MFU = 6e14 / (0.6079 s · 128 · 19.5e12) and HFU = the traced FLOPs /
    (0.6079 s · 2 · 19.5e12)."""
    run = ingested(DATASETS / "hta_trace_filter")
    windows = tracesql.connect(run).execute(
        "SELECT step, max(te - ts) FROM step_windows() GROUP BY step ORDER BY step").fetchall()
    mfu = tracesql.query("mfu", run, model_flops_per_step=6e14, device="A100-SXM").set_index("step")
    assert [tuple(w) for w in windows] == list(zip(mfu.index, mfu.step_time_ns))
    assert mfu.loc[551, "step_time_ns"] == 607_900_000
    assert round(mfu.loc[551, "mfu"], 4) == 0.3954 and round(mfu.loc[551, "hfu"], 4) == 0.0724
    assert mfu.warning.isna().all()
    unknown = tracesql.query("mfu", run, model_flops_per_step=6e14)
    assert unknown.mfu.isna().all() and unknown.warning.str.contains("names no device").all()


def test_mfu_of_an_inference_trace_runs_over_its_iteration_windows(ingested):
    """TraceLens' B200 eager trace (rank 0 of 8, a vLLM execute_model iteration, no ProfilerStep): the iteration is
    the step and its device window the step time; an MFU above 1 comes with a warning."""
    run = ingested(DATASETS / "tracelens_b200_eager")
    span = tracesql.connect(run).execute(
        "SELECT max(ts + dur) - min(ts) FROM slices WHERE kind IN ('kernel', 'memcpy', 'memset')").fetchall()[0][0]
    row = tracesql.query("mfu", run, model_flops_per_step=1e12).iloc[0]
    assert row.step == 0 and row.step_time_ns == span == 84_487_178 and row.device == "B200" and row.devices == 8
    assert row.mfu == pytest.approx(1e12 / (span / 1e9 * 8 * row.peak_flops_per_s)) and row.warning is None
    too_high = tracesql.query("mfu", run, model_flops_per_step=1e18).iloc[0]
    assert too_high.mfu > 1 and "exceeds the device's peak" in too_high.warning and "MFU above 1" in too_high.warning


def test_mfu_without_steps_runs_over_the_whole_device_window(tmp_path):
    """No step range at all: one row, step NULL, over each rank's first to last device event."""
    events = [*launched(1, 0, 10, 30, 7), *launched(2, 5, 50, 20, 7), unlaunched(100, 10, 8, "tail")]
    run = tmp_path / "run"
    tracesql.ingest([write_trace(tmp_path / "t.json", events)], run)
    row = tracesql.query("mfu", run, model_flops_per_step=1e9, peak_flops=1e12).iloc[0]
    assert pd.isna(row.step) and row.step_time_ns == 100 * US
    assert row.mfu == pytest.approx(1e9 / (100e-6 * 1 * 1e12))


def test_mfu_per_step_of_a_user_step_pattern(tmp_path):
    """Steps named by --step-pattern (here 'iter N' ranges, no ProfilerStep) get windows and MFU per step like
    ProfilerSteps: iteration 1's kernel is launched in it but runs after iteration 2's first kernel."""
    events = [{"ph": "X", "cat": "user_annotation", "name": f"iter {n}", "ts": ts, "dur": 100, "pid": 1, "tid": 1}
              for n, ts in ((1, 0), (2, 100))]
    events += [*launched(1, 10, 20, 30, 7), *launched(2, 90, 130, 40, 8), *launched(3, 110, 120, 30, 7)]
    run = tmp_path / "run"
    tracesql.ingest([write_trace(tmp_path / "t.json", events)], run, step_pattern=r"^iter (?P<step>\d+)$")
    windows = tracesql.connect(run).execute("SELECT step, ts, te FROM step_windows() ORDER BY step").fetchall()
    assert windows == [(1, 20 * US, 120 * US), (2, 120 * US, 170 * US)]
    mfu = tracesql.query("mfu", run, model_flops_per_step=1e9, peak_flops=1e12).set_index("step")
    assert list(mfu.step_time_ns) == [100 * US, 50 * US]
    assert mfu.loc[2, "mfu"] == pytest.approx(1e9 / (50e-6 * 1e12))


@pytest.mark.corpus
def test_mtia_hta_window_leaves_out_dma_requests_without_a_stream(ingested):
    """HTA 0.5.0 on mtia_trace_single_rank (one step: no filter) reports kernel_time 13,328,071 µs, idle 5,649,476 µs
    and compute 7,305,597 µs: 137 DMA requests whose events name no stream are not in its window (tracesql's
    reader gives them their thread as stream)."""
    run = ingested(corpus_path("hta", "tests", "data", "mtia_trace_single_rank"))
    row = tracesql.query("temporal_breakdown", run, **HTA).iloc[0]
    assert (row.window_ns, row.compute_ns, row.idle_ns) == (13_328_071_000, 7_305_597_000, 5_649_476_000)
    assert (row.idle_pct, row.compute_pct, row.non_compute_pct) == (42.39, 54.81, 2.80)
