"""The critical path (HTA 0.5's graph and longest path) and its what-if replay, on real traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import tracesql
from conftest import CORPUS, DATASETS, corpus_path, write_trace

REFERENCE = json.loads((Path(__file__).parent / "data" / "critical_path_reference.json").read_text())
HTA_CLASSES = {"cpu_bound", "gpu_compute_bound", "gpu_communication_bound", "gpu_kernel_kernel_overhead",
               "gpu_kernel_launch_overhead"}


@pytest.mark.parametrize("trace", sorted(REFERENCE))
def test_bound_by_totals_equal_hta_on_every_annotation_instance(trace, ingested):
    """tests/data/make_critical_path_reference.py ran HTA 0.5.0 on each window; its times are µs (these traces'
    timestamps are whole µs), tracesql's ns."""
    run = ingested(corpus_path("hta", "tests", "data", "critical_path", trace))
    for window in REFERENCE[trace]:
        got = tracesql.query("critical_path", run, annotation=window["annotation"], instance=window["instance"],
                             per="class")
        totals = got.groupby("bound_by").dur_ns.sum()
        assert {k: int(v) for k, v in totals.items()} == {k: v * 1000 for k, v in window["bound_by_us"].items()}, \
            (window["annotation"], window["instance"])
        assert got.dur_ns.sum() == window["length_us"] * 1000


def test_segments_on_event_sync_trace(ingested):
    """HTA's cuda_event_sync trace (ProfilerStep#100): the path's segments, each of its event's kind, in time
    order, and the path no longer than the step's span."""
    run = ingested(corpus_path("hta", "tests", "data", "critical_path", "cuda_event_sync"))
    seg = tracesql.query("critical_path", run)
    assert list(seg.window_name.unique()) == ["ProfilerStep#100"] and list(seg.seq) == list(range(len(seg)))
    assert seg.dur_ns.sum() == 2_401_000 and abs(seg.share.sum() - 1) < 1e-9
    con = tracesql.connect(run)
    kinds = dict(con.sql("SELECT slice_id, kind FROM slices").fetchall())
    for row in seg.itertuples():
        kind = kinds[row.event_id]
        if row.edge == "launch":
            assert row.bound_by == "gpu_kernel_launch_overhead" and kind in ("kernel", "memcpy", "memset")
        elif row.edge == "kernel_gap":
            assert row.bound_by == "gpu_kernel_kernel_overhead"
        elif kind in ("kernel", "memcpy", "memset"):
            assert row.bound_by == "gpu_compute_bound"
            assert row.cause == ("compute" if kind == "kernel" else "memory_copy")
        else:
            assert row.bound_by == "cpu_bound" and kind in ("cpu_op", "runtime", "user_annotation")
    assert (seg.ts.diff().dropna() >= 0).all()
    ((step_ts, step_end),) = con.sql("SELECT ts, ts + dur FROM steps").fetchall()
    assert step_ts <= seg.ts.min() and seg.dur_ns.sum() <= step_end - step_ts


def test_path_of_bundled_steps(ingested):
    """HTA's sampled two-rank trace (datasets/hta_trace_filter): one path per step and rank; each segment's class
    is its event's kind; the path fits in the step (host gaps between top-level ops weigh 0, as in HTA)."""
    run = ingested(DATASETS / "hta_trace_filter")
    seg = tracesql.query("critical_path", run)
    con = tracesql.connect(run)
    steps = {(r, s): (ts, te) for r, s, ts, te in con.sql("SELECT rank, step, ts, ts + dur FROM steps").fetchall()}
    assert set(zip(seg["rank"], seg.step)) == set(steps)
    assert set(seg.bound_by) <= HTA_CLASSES
    kinds = {(r, i): k for r, i, k in con.sql("SELECT rank, slice_id, kind FROM slices").fetchall()}
    seg["kind"] = [kinds[(r, i)] for r, i in zip(seg["rank"], seg.event_id)]
    on_device = seg.kind.isin(["kernel", "memcpy", "memset"])
    assert (seg[on_device & (seg.edge == "op")].bound_by.str.startswith("gpu_")).all()
    assert (seg[~on_device].bound_by == "cpu_bound").all() and (seg[seg.bound_by == "cpu_bound"].edge == "op").all()
    assert set(seg[seg.bound_by == "gpu_communication_bound"].cause) == {"communication"}
    totals = seg.groupby(["rank", "step"]).dur_ns.sum()
    assert totals.to_dict() == {(0, 551): 267_581_000, (0, 552): 470_090_000, (1, 551): 272_736_000,
                                (1, 552): 310_702_000}
    for (rank, step), total in totals.items():
        ts, te = steps[(rank, step)]
        assert seg[(seg["rank"] == rank) & (seg.step == step)].ts.min() >= ts and total <= te - ts
    per_class = tracesql.query("critical_path", run, per="class")
    assert per_class.groupby(["rank", "step"]).dur_ns.sum().to_dict() == totals.to_dict()
    assert per_class.groupby(["rank", "step"]).share.sum().sub(1).abs().max() < 1e-9


def _what_if(run, **changes):
    return tracesql.query("what_if", run, **changes).set_index(["rank", "step"])


def test_what_if_replays_bundled_steps(ingested):
    """Unchanged, the replay lasts what the step measured: from its start to the later of its end and the end
    of the last op or device work it holds (counted here from slices, the second method); changes only shorten
    it, more of a change more, and never by more than the changed ops' own time."""
    run = ingested(DATASETS / "hta_trace_filter")
    base = _what_if(run)
    con = tracesql.connect(run)
    measured = dict(((r, s), m) for r, s, m in con.sql("""
        WITH held AS (
            SELECT st.rank, st.step, st.ts AS step_ts, st.ts + st.dur AS step_te, l.ts + l.dur AS te, l.slice_id
            FROM steps st
            JOIN slices l ON l.rank = st.rank AND l.device_id IS NULL AND l.dur > 0
             AND l.ts BETWEEN st.ts AND st.ts + st.dur AND l.kind IN ('cpu_op', 'runtime', 'driver'))
        SELECT h.rank, h.step, greatest(max(h.step_te), max(h.te), max(d.ts + d.dur)) - min(h.step_ts)
        FROM held h
        LEFT JOIN slices d ON d.rank = h.rank AND d.launch_id = h.slice_id AND d.kind IN ('kernel', 'memcpy', 'memset')
        GROUP BY h.rank, h.step""").fetchall())
    assert base.measured_ns.to_dict() == measured
    assert base.measured_ns.to_dict() == {(0, 551): 607_312_000, (0, 552): 622_928_000, (1, 551): 607_904_000,
                                          (1, 552): 630_639_000}
    assert (base.replayed_ns == base.measured_ns).all() and (base.saving_ns == 0).all()
    assert (base.path_ns == tracesql.query("critical_path", run).groupby(["rank", "step"]).dur_ns.sum()).all()
    shares = base.filter(like="_share").sum(axis=1)
    assert ((shares - 1).abs() < 1e-9).all() and set(base.bound) == {"host_launch"}
    ops = {(r, s): t for r, s, t in con.sql("""
        SELECT st.rank, st.step, sum(o.self_dur) FROM steps st
        JOIN ops o ON o.rank = st.rank AND o.ts BETWEEN st.ts AND st.ts + st.dur AND o.name LIKE 'aten::%'
        GROUP BY ALL""").fetchall()}
    half, whole = _what_if(run, faster="^aten::", faster_pct=50), _what_if(run, faster="^aten::", faster_pct=100)
    assert (half.saving_ns > 0).all() and (whole.saving_ns >= half.saving_ns).all()
    assert all(whole.saving_ns[k] <= ops[k] for k in ops)
    # (its cudaMemcpyAsync calls, blocking as HTA takes them, have no cuda_sync records: they also wait for the
    # device work that ended while they ran, which two steps' savings lose 47 µs and 2 µs to)
    assert whole.saving_ns.to_dict() == {(0, 551): 967_000, (0, 552): 781_000, (1, 551): 1_004_000,
                                         (1, 552): 812_000}


# Kineto traces, and JAX's XPlane profiles (GPU: their launches; without steps, the profiled range)
CORPUS_REPLAYED = [
    line.split("\t")[0] for line in (CORPUS / "MANIFEST.tsv").read_text().splitlines()[1:]
    if line.split("\t")[6:7] in (["pytorch-kineto-json"], ["jax-xplane-pb"])
] if (CORPUS / "MANIFEST.tsv").exists() else []


#: the bundled XLA profiles: TPU and CPU replayed device-only (steps; the TPU inference's profiled range)
XLA_BUNDLED = ("jax_cpu_4dev_allreduce", "jax_cpu_8dev_ffn", "jax_cpu_mlp", "xprof_gpu_multi_worker",
               "xprof_tpu_inference")


@pytest.mark.slow
@pytest.mark.parametrize("path", [pytest.param(DATASETS / key, id=key) for key in XLA_BUNDLED]
                         + [pytest.param(CORPUS / path, id=path) for path in CORPUS_REPLAYED])
def test_what_if_replay_reproduces_every_corpus_step(path, ingested):
    if not path.exists():
        pytest.skip(f"corpus not available: {path}")
    run = ingested(path)
    base = tracesql.query("what_if", run)
    if base.empty:
        pytest.skip(f"{path}: no steps with host ops")
    assert ((base.replayed_ns - base.measured_ns).abs() <= 0.01 * base.measured_ns).all(), base
    assert (base.saving_ns == 0).all()


def test_device_only_replay_of_xla_profiles(ingested):
    """XLA on TPU runs its ops without launches: the replay is each device's line, its ops in order with their
    gaps kept, from the window's start (the profiled range: no steps) to its end. Unchanged it is the measured
    time (here and on every bundled and corpus XLA profile: the test above); an op family made free saves what it
    saved the device that saves least (every line ends the window with its tail kept): summed from
    device_activity here, the second method."""
    run = ingested(DATASETS / "xprof_tpu_inference")
    lines = tracesql.connect(run).sql("""
        SELECT device_id, stream, sum(dur) FILTER (WHERE regexp_matches(name, '^copy-done')) AS copy_done
        FROM device_activity() GROUP BY ALL""").df()
    assert len(lines) == 4 and lines.copy_done.min() == 75_993_796_650
    freed = tracesql.query("what_if", run, faster="^copy-done", faster_pct=100)
    assert freed.measured_ns.tolist() == freed.replayed_ns.tolist() == [98_153_057_682] and freed.step.isna().all()
    assert freed.saving_ns.tolist() == [lines.copy_done.min()]


@pytest.mark.slow  # ingests a corpus trace (the ingest the corpus replay test above shares)
def test_replay_frees_launches_blocked_on_a_full_queue(ingested):
    """HTA's ns_resolution_trace is device-bound and runs a step behind its host: its launch calls block on a full
    queue (1,022 deep). The replay takes those as waiting for the device (153 to 188 a step), so with the
    compute kernels 23 % faster (1/1.3) each step saves 23 % of the kernels it launched (their time from the
    slices, the second method), to 0.02 %; unchanged, the replay is the measured step."""
    run = ingested(corpus_path("hta/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"))
    con = tracesql.connect(run)
    blocked = dict(con.sql("""SELECT step, count(*) FILTER (WHERE e.role = 'blocked_launch')
                              FROM (SELECT step, unnest(events) AS e FROM critical_path_events()) GROUP BY step""")
                   .fetchall())
    assert blocked == {101: 0, 102: 153, 103: 182, 104: 186, 105: 188}
    kernels = "^(void|volta|cudnn|cask)"
    faster = con.sql(f"SELECT * FROM what_if(faster := '{kernels}', faster_pct := 23)").df().set_index("step")
    assert (faster.replayed_ns == faster.measured_ns).all()
    launched = dict(con.sql(f"""SELECT l.step, 0.23 * sum(d.dur) FROM device_activity() d
                                JOIN slices l ON l.rank = d.rank AND l.slice_id = d.launch_id
                                WHERE regexp_matches(d.name, '{kernels}') GROUP BY l.step""").fetchall())
    for step, saving in faster.saving_ns.items():
        assert saving == pytest.approx(float(launched[step]), rel=2e-4)


def test_replay_waits_for_the_last_rank_at_collectives(ingested):
    """HTA's sampled two-rank trace: the replay takes each step's windows of both ranks as one graph, in which a
    rank's collective completes when the last rank has arrived: the edge that holds each completion up comes from
    the rank that started the collective's kernel last (the second method: collective_calls' device starts,
    matched by match key), where the other rank arrived before it completed. Rank 1 is the step's straggler in device work (+29 % and +43 %), yet at the median
    it saves next to nothing (under 0.005 %): these steps wait for the host."""
    from tracesql import critical_path

    run = ingested(DATASETS / "hta_trace_filter")
    con = tracesql.connect(run)
    last = dict(con.sql("""SELECT CAST(hash(match_key) >> 1 AS BIGINT), arg_max(rank, device_ts)
                           FROM collective_calls() GROUP BY match_key""").fetchall())
    held = []
    for events, spans in con.sql("""SELECT flatten(list(events)), list(struct_pack(rank := CAST(rank AS BIGINT),
                                        ts := window_ts, te := window_te))
                                    FROM critical_path_events() GROUP BY step ORDER BY step""").fetchall():
        ev = {name: [e[name] for e in events] for name, _ in critical_path.EVENT_FIELDS}
        g, ends = critical_path.build(ev, spans)
        _, binding = critical_path._binding(g)
        for node in g.completions:
            key, rank = ev["collective"][g.event[node]], ev["rank"][g.event[node]]
            held.append((rank, last[key], ev["rank"][g.event[g.src[binding[node]]]]))
    # 14 completions wait for the other rank: of 20 calls, 6 of rank 0's ended before rank 1's started (its
    # clock is off, or the all_to_all calls of differing dtypes are no one collective), and tell nothing
    assert len(held) == 14 and all(by == last_rank for _, last_rank, by in held)
    assert sorted(held).count((0, 1, 1)) == 4  # rank 0 waited for rank 1
    straggler = _what_if(run, straggler_to_median=1)
    # (rank 1's cudaMemcpyAsync calls wait for the device work that ended while they ran: 1.8 and 27.4 µs)
    assert straggler.saving_ns.to_dict() == {(0, 551): 0, (0, 552): 0, (1, 551): 1_812, (1, 552): 27_424}
    assert (straggler.remote_ns == 0).all()



def test_a_what_if_walks_the_graph_of_the_unchanged_replay(ingested):
    """The replays of one step share one plan (the graph and its walk order, built for the unchanged replay):
    walked with a what-if's scales and gaps it gives the path a graph built for that what-if gives (the second
    method), segment for segment, on both ranks' steps of HTA's sampled trace."""
    from tracesql import critical_path

    run = ingested(DATASETS / "hta_trace_filter")
    con = tracesql.connect(run)
    rows = con.sql("""SELECT step, flatten(list(events)), list(struct_pack(rank := CAST(rank AS BIGINT),
                          ts := window_ts, te := window_te))
                      FROM critical_path_events(faster := '^aten::', faster_pct := 40)
                      GROUP BY step ORDER BY step""").fetchall()
    assert len(rows) == 2
    for _, events, spans in rows:
        changed = {name: [e[name] for e in events] for name, _ in critical_path.EVENT_FIELDS}
        unchanged = changed | {"scale": [None] * len(events)}
        assert any(s is not None for s in changed["scale"])
        plan = critical_path.Plan(unchanged, spans, changed=False)
        for gaps in (1.0, 0.0):
            walked = plan.segments(changed["scale"], gaps)
            assert walked == critical_path.path(changed, spans, gaps)
            assert walked != critical_path.path(unchanged, spans, None)


# Each event's scale as a CASE per event in SQL, with DuckDB's regular expressions: how critical_path_scales
# computed it before change_scales (the second method), of the straggler's scale the macro gives each window
SCALES_IN_SQL = """
SELECT l.run_id, l.rank, l.instance, [e.id FOR e IN l.events] AS ids,
    [CAST(CASE WHEN e.role IN ('stream_sync', 'context_sync', 'event_sync') THEN CASE WHEN $remove_syncs = 1 THEN 0 END
               WHEN e.role = 'communication' AND $hide_communication = 1 THEN 0
               WHEN e.role NOT IN ('device', 'communication') AND $remove_syncs = 1 AND e.sync_call THEN 0
               WHEN regexp_matches(e.name, $faster) THEN 1 - $faster_pct / 100
               WHEN e.straggles AND l.straggler_on_host = (e.role NOT IN ('device', 'communication'))
                   THEN l.straggler_scale
          END AS DOUBLE) FOR e IN l.events] AS scales,
    $faster IS NOT NULL AND COALESCE(list_bool_or([regexp_matches(e.name, $faster) FOR e IN l.events
                                                   IF e.role = 'range']), false) AS reroled
FROM critical_path_scales(straggler_to_median := $straggler_to_median) l
"""


@pytest.mark.parametrize("dataset", ["hta_trace_filter", "torch_gloo_4rank_straggler", "hta_nccl_parser_config"])
def test_the_scales_of_a_change_are_those_of_a_case_per_event(dataset, ingested):
    """critical_path_scales' scales (change_scales: arrays, each name matched once with Arrow's RE2) are those of
    a CASE per event in SQL (DuckDB's RE2), for every kind of change and the findings rules' patterns: a data
    loader's ranges (HTA's sampled trace: reroled), a straggler (four gloo ranks, one slow), the synchronisations
    and communication kernels of two NCCL ranks; a change of nothing has none."""
    con = tracesql.connect(ingested(DATASETS / dataset))
    changes = [{"faster": pattern, "faster_pct": pct} for pattern, pct in (
        (con.sql("SELECT data_loading_pattern()").fetchall()[0][0], 100.0), ("^Mem(cpy|set) ", 100.0),
        ("(?i)AtEn::(mm|addmm)$", 30.0), ("^(CompiledFunctionBackward|aten\\:\\:copy_)$", 50.0), ("nccl", None))]
    changes += [{"hide_communication": 1}, {"remove_syncs": 1}, {"straggler_to_median": 1}]
    changed = 0
    for change in changes:
        values = {"faster": None, "faster_pct": 0.0, "hide_communication": 0, "remove_syncs": 0,
                  "straggler_to_median": 0} | change
        arguments = ", ".join(f"{name} := ${name}" for name in values)
        got, expected = ({(run_id, rank, instance): (dict(zip(ids, scales or [None] * len(ids))), reroled)
                          for run_id, rank, instance, ids, scales, reroled in con.execute(sql, values).fetchall()}
                         for sql in (f"SELECT run_id, rank, instance, [e.id FOR e IN events], scales, reroled "
                                     f"FROM critical_path_scales({arguments})", SCALES_IN_SQL))
        # (each list's events in no order: by their ids)
        assert got == expected and got, change
        changed += any(s is not None for scales, _ in got.values() for s in scales.values())
    assert changed >= 2
    assert con.sql("SELECT DISTINCT scales IS NULL, reroled FROM critical_path_scales()").fetchall() == [(True, False)]


@pytest.mark.parametrize("dataset", ["hta_trace_filter", "torch_gloo_4rank_straggler"])
def test_replay_lengths_of_a_change_off_the_path_are_the_unchanged_ones(dataset, ingested, monkeypatch):
    """Plan.lengths (findings' priced what-ifs) gives a change the unchanged replay's lengths without a walk when
    no weight grows and none changes on any rank's unchanged path. Each step of HTA's sampled two-rank trace and
    of the four gloo ranks (collectives across ranks), with every event off the unchanged paths free (scale 0):
    no walk, and the lengths a walk gives; with every event 40 % faster, or the path's events free: walked, as
    long as a walk of those weights, and shorter (the path's events free: whole weights, whose lengths are the
    distances to the ends, without listing the paths' edges)."""
    from tracesql import critical_path, longest_path

    monkeypatch.setattr(longest_path, "_compiled", None)  # (walks in Python, whichever test ran before)
    walked = []  # (a walk: its longest-path sums, in arrays or in order)
    columns = critical_path.Plan._columns
    for name in ("_whole_distances", "_distances_in_order"):
        sums = getattr(critical_path.Plan, name)
        monkeypatch.setattr(critical_path.Plan, name,
                            lambda plan, weight, sums=sums: walked.append(1) or sums(plan, weight))
    con = tracesql.connect(ingested(DATASETS / dataset))
    rows = con.sql("""SELECT flatten(list(events ORDER BY rank)), list(struct_pack(rank := CAST(rank AS BIGINT),
                          ts := window_ts, te := window_te) ORDER BY rank)
                      FROM critical_path_events() GROUP BY step ORDER BY step""").fetchall()
    assert len(rows) >= 2
    skipped = 0
    for events, spans in rows:
        ev = {name: [e[name] for e in events] for name, _ in critical_path.EVENT_FIELDS}
        plan = critical_path.Plan(ev, spans, changed=False)
        path = plan.columns(ev["scale"], None)
        unchanged = critical_path._lengths(path)
        assert plan.unchanged is not None and plan.unchanged[1] == unchanged
        on_path = set(path["event_id"].tolist())
        off_path = [0.0 if event_id not in on_path else 1.0 for event_id in ev["id"]]
        for scales, shorter in ((off_path, False), ([0.6] * len(events), True),
                                ([1.0 - s for s in off_path], True)):
            del walked[:]
            got = plan.lengths(scales, 1.0)
            was_walked = bool(walked)
            assert got == critical_path._lengths(columns(plan, plan.weights(scales, 1.0)))
            if shorter:
                assert was_walked and all(got[rank] < unchanged[rank] for rank in got)
            elif not was_walked:
                skipped += 1
                assert got == unchanged
    assert skipped == len(rows)  # every step's off-path change was given its lengths without a walk


def test_a_replay_without_syncs_is_built_from_the_unchanged_shape(ingested):
    """A what-if that removes synchronisations walks a graph of its own, built from the shape of the step's
    unchanged replay (kept with its plan) with the events renumbered without the removed syncs (_Shape.of_rows):
    the same graph, edge for edge, as built from its own events, on HTA's cuda_event_sync trace."""
    from tracesql import critical_path

    run = ingested(corpus_path("hta", "tests", "data", "critical_path", "cuda_event_sync"))
    lists = tracesql.connect(run).sql("FROM critical_path_event_lists()").to_arrow_table()
    scales = critical_path.change_scales(lists.column("events"), None, 0.0, 0, 1)[0]
    removed = 0
    for _, _, ev, spans in critical_path._steps(lists, [[its] for its in scales]):
        changed = {name: values for name, values in ev.items() if name != "change_scales"}
        changed["scale"] = ev["change_scales"][:, 0]
        shape = critical_path.Plan(ev, spans, False).shape
        alone, reused = critical_path.Plan(changed, spans, True), critical_path.Plan(changed, spans, True, shape)
        removed += len(ev["id"]) - len(alone.keep)
        for name in ("src", "dst", "kind", "owner", "weighs", "time", "nodes", "held", "keep"):
            assert np.array_equal(getattr(alone, name), getattr(reused, name)), name
    assert removed > 0


@pytest.mark.parametrize("dataset", ["hta_trace_filter", "torch_gloo_4rank_straggler"])
def test_the_walk_in_arrays_equals_the_walk_in_order(dataset, ingested, monkeypatch):
    """Plan.distances walks whole-number weights in arrays (_whole_distances) and others one edge at a time in the
    walk's order (_distances_in_order), or both by the loop compiled (longest_path, which `tracesql findings`
    loads): on every walk the critical_path and what_if queries make of real steps (HTA's path; the replay
    unchanged, with ops or communication free or no launch overhead: whole numbers; ops 40 % faster, the
    straggler at the median: fractions) the three ways give the same distance and the same edge (of equal paths,
    the first in the walk's order) at every node, and fractional weights are walked in order. HTA's sampled
    two-rank GPU trace and the four gloo CPU ranks with a straggler (collectives across ranks). And each path's
    edges, listed in arrays (Plan._ways) and traced back by the compiled loop, are the same."""
    from tracesql import critical_path, longest_path

    # (the walks below in Python; as it was after)
    monkeypatch.setattr(longest_path, "_compiled", None)
    monkeypatch.setattr(longest_path, "_compiled_trace", None)
    walks = []
    distances = critical_path.Plan.distances

    def recorded(plan, weight, whole=None):
        walks.append((plan, weight))
        return distances(plan, weight, whole)

    monkeypatch.setattr(critical_path.Plan, "distances", recorded)
    critical_path._WALKED.clear()
    critical_path._PLANS.clear()
    run = ingested(DATASETS / dataset)
    tracesql.query("critical_path", run)
    for changes in ({}, {"faster": "^aten::", "faster_pct": 100}, {"hide_communication": 1},
                    {"no_launch_overhead": 1}, {"faster": "^aten::", "faster_pct": 40}, {"straggler_to_median": 1}):
        tracesql.query("what_if", run, **changes)
    in_python = [distances(plan, weight) for plan, weight in walks]
    ways = [plan._ways(via, [int(n) for n in plan.nodes[-3:]] + list(plan.end_nodes or []))
            for (plan, _), (_, via) in zip(walks, in_python)]
    longest_path.load()
    assert longest_path.compiled() is not None and longest_path.compiled_trace() is not None
    for (plan, _), (_, via), listed in zip(walks, in_python, ways):
        traced = plan._ways(via, [int(n) for n in plan.nodes[-3:]] + list(plan.end_nodes or []))
        assert len(traced) == len(listed) and all(np.array_equal(a, b) for a, b in zip(traced, listed))
        assert sum(len(a) for a in listed) > 0
    whole = fractional = 0
    for (plan, weight), walked in zip(walks, in_python):
        dist, via = plan._distances_in_order(weight)
        is_whole = bool((weight == np.rint(weight)).all())
        if is_whole:
            in_arrays = plan._whole_distances(weight.astype(np.int64))
            assert (in_arrays[0] == dist).all() and (in_arrays[1] == via).all()
            assert (via >= 0).sum() > len(via) // 2
        compiled = distances(plan, weight)
        for its in (walked, compiled):
            assert (its[0] == dist).all() and (its[1] == via).all()
            assert its[0].dtype == (np.int64 if is_whole else np.float64)
        whole, fractional = whole + is_whole, fractional + (not is_whole)
    assert whole >= 10 and fractional >= 2, (whole, fractional)


@pytest.mark.parametrize("dataset", ["hta_trace_filter", "torch_pipeline_1f1b_2stage", "tracelens_b200_eager"])
def test_the_compiled_order_and_nesting_build_the_graphs_of_the_arrays(dataset, ingested, monkeypatch):
    """Once `findings` has loaded numba, each graph's Kahn order where edges lead back (longest_path.kahn, else
    critical_path._taken) and the host's edges (longest_path.nest, else _nesting in arrays, and nest in Python
    where a thread's events do not nest) are compiled loops: every step's HTA graph and replay graph of HTA's two-rank
    sample, a pipeline's stages (threads whose events do not nest) and a B200 step are the same plan, edge for
    edge, both ways."""
    from tracesql import critical_path, longest_path

    longest_path.load()
    ordered = []  # (graphs where an edge leads back: Kahn's order walked)
    kahn = longest_path.compiled_kahn()
    compiled = {"_compiled_kahn": lambda *a: ordered.append(1) or kahn(*a),
                "_compiled_nest": longest_path.compiled_nest()}
    assert None not in compiled.values()
    con = tracesql.connect(ingested(DATASETS / dataset))
    lists = con.sql("FROM critical_path_event_lists()").to_arrow_table()
    stacked = 0
    for _, _, ev, spans in critical_path._steps(lists):
        for windows in (None, spans):
            plans = []
            for names in ({}, compiled):
                for name in compiled:
                    monkeypatch.setattr(longest_path, name, names.get(name))
                critical_path._latest_shape.kept = None  # (the shape built anew each way)
                plans.append(critical_path.Plan(ev, windows, False))
            for name in ("src", "dst", "kind", "owner", "weighs", "time", "nodes"):
                assert np.array_equal(getattr(plans[0], name), getattr(plans[1], name)), name
        monkeypatch.setattr(longest_path, "_compiled_nest", None)
        stacked += bool(critical_path._Shape(ev).host[1])  # (a thread whose events do not nest)
    assert ordered and (stacked or dataset != "torch_pipeline_1f1b_2stage")


@pytest.mark.parametrize("dataset", ["hta_trace_filter", "torch_gloo_4rank_straggler"])
def test_the_compiled_weights_and_the_kept_arrays_price_the_changes_as_the_arrays_do(dataset, ingested, monkeypatch):
    """`findings` prices its changes with each replay's weights and checks (whole, none longer than unchanged)
    made in one compiled pass (longest_path.weigh) and the lists' events read once, kept by walk_ahead for
    replay_lengths (_rows' keep and arrays): on every step of HTA's two-rank sample and four gloo ranks with a
    straggler, with the changes the rules make (ops faster by 40 % and 100 %, communication hidden, no launch
    overhead, no synchronisations, the straggler at the median), the weights are the arrays' bit for bit, the
    checks the same, and replay_lengths' predictions the same as from lists read again."""
    from tracesql import critical_path, findings, longest_path

    longest_path.load()
    weigh = longest_path.compiled_weigh()
    assert weigh is not None
    con = tracesql.connect(ingested(DATASETS / dataset))
    lists = con.sql("FROM critical_path_event_lists()").to_arrow_table()
    changes = [("^aten::", 40.0, 0, 0), ("^aten::", 100.0, 0, 0), (None, None, 1, 0), (None, None, 0, 0),
               (None, None, 0, 1)]
    events = critical_path.ListedEvents(lists.column("events"))
    each = [critical_path.change_scales(events, *change)[0] for change in changes]
    each.append(critical_path.change_scales(events, None, None, 0, 0, *findings._Scales(con, lists)._stragglers())[0])
    scales = [list(its) for its in zip(*each)]
    gaps = [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    kept: list = []
    for _ in critical_path._steps(lists, keep=kept):
        pass
    read, from_kept = (list(critical_path._steps(lists, scales, arrays=arrays)) for arrays in (None, kept))
    fractional = 0
    for (_, _, ev, spans), (_, _, ev_kept, _) in zip(read, from_kept, strict=True):
        assert ev.keys() == ev_kept.keys() and all(np.array_equal(ev[k], ev_kept[k], equal_nan=True) for k in ev)
        for change, gaps_scale in enumerate(gaps):
            changed = {name: values for name, values in ev.items() if name != "change_scales"}
            changed["scale"] = ev["change_scales"][:, change]
            plan = critical_path._plan(changed, spans, gaps_scale, critical_path._digest(spans, changed))
            monkeypatch.setattr(longest_path, "_compiled_weigh", None)
            in_arrays = plan._weighed(changed["scale"], gaps_scale)
            monkeypatch.setattr(longest_path, "_compiled_weigh", weigh)
            compiled = plan._weighed(changed["scale"], gaps_scale)
            assert np.array_equal(in_arrays[0], compiled[0]) and in_arrays[1:] == compiled[1:]
            fractional += not compiled[1]
    assert fractional > 0
    predicted = [critical_path.replay_lengths(lists, scales, gaps, arrays) for arrays in (None, kept)]
    for shared in predicted:
        shared.work()
    assert predicted[0].result().equals(predicted[1].result()) and predicted[0].result().num_rows > 0


def test_the_compiled_order_takes_the_nodes_kahns_way_on_any_graph(monkeypatch):
    """longest_path.kahn takes the nodes of a graph where edges lead back, and where some lie on cycles (never
    taken, nor what waits on them), in critical_path._taken's order: random graphs of 2 to 200 nodes."""
    from tracesql import critical_path, longest_path

    longest_path.load()
    kahn = longest_path.compiled_kahn()
    rng = np.random.default_rng(27)
    cycles = 0
    for _ in range(300):
        n = int(rng.integers(2, 200))
        ts = rng.integers(0, n // 2 + 1, n)
        m = int(rng.integers(1, 3 * n))
        src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
        forward = rng.random(m) < 0.9  # (most edges lead to a later node, as in a trace)
        src, dst = np.where(forward & (ts[src] > ts[dst]), dst, src), np.where(forward & (ts[src] > ts[dst]), src, dst)
        nodes = np.argsort(ts, kind="stable")
        position = np.empty(n, dtype=np.int64)
        position[nodes] = np.arange(n)
        back = position[src] >= position[dst]
        if not back.any():
            continue
        expected = critical_path._taken(nodes, position, src, dst, back)
        taken = np.empty(n, dtype=np.int64)
        count = kahn(nodes, position, src, dst, np.unique(position[dst[back]]), taken)
        assert np.array_equal(taken[:count], expected)
        cycles += count < n
    assert cycles > 10


def test_a_what_if_with_a_faster_that_is_no_regular_expression_says_so(ingested):
    """`faster` is a regular expression (RE2); one that is not (an unclosed group) fails the what-if with one line
    naming it, and a non-zero exit."""
    from click.testing import CliRunner

    from tracesql.cli import main

    run = ingested(DATASETS / "torch_gloo_2rank")
    done = CliRunner().invoke(main, ["query", "what_if", str(run), "-p", "faster=(aten::mm"])
    assert done.exit_code != 0
    (line,) = done.output.strip().splitlines()
    assert "faster = '(aten::mm' is not a regular expression: " in line and "missing )" in line


def test_without_numba_the_walks_stay_in_python(monkeypatch):
    """longest_path.load without numba (its import fails) leaves `compiled` None: every walk in Python."""
    import sys

    from tracesql import longest_path

    for name in ("_compiled", "_compiled_trace", "_compiled_kahn", "_compiled_nest", "_compiled_weigh"):
        monkeypatch.setattr(longest_path, name, None)
    monkeypatch.setitem(sys.modules, "numba", None)  # (import numba raises ImportError)
    longest_path.load()
    assert {longest_path.compiled(), longest_path.compiled_trace(), longest_path.compiled_kahn(),
            longest_path.compiled_nest(), longest_path.compiled_weigh()} == {None}


def test_the_unchanged_replay_of_a_what_if_ignores_its_changes(ingested):
    """The what_if macro's unchanged replay walks the what-if's events with gaps_scale NULL: it is the replay of
    the unchanged events, segment for segment, whichever a process walked first (the walks are kept by a digest
    of their input that leaves the scales out). HTA's sampled trace: its cudaMemcpyAsync calls wait for the device
    work that ended while they ran; made free (scale 0), the changed replay no longer waits for it, the unchanged
    one still does (it took another path through the step before, when walked first: 16 and 8 segments more)."""
    from tracesql import critical_path

    run = ingested(DATASETS / "hta_trace_filter")
    con = tracesql.connect(run)
    replay = """SELECT step, critical_path_walk(flatten(list(events ORDER BY rank)), list(struct_pack(
                        rank := CAST(rank AS BIGINT), ts := window_ts, te := window_te) ORDER BY rank), {}) AS path
                    FROM critical_path_events({}) GROUP BY step ORDER BY step"""
    free = "faster := '^cudaMemcpyAsync$', faster_pct := 100"

    def walks(changes, gaps="NULL"):
        return con.sql(replay.format(gaps, changes)).fetchall()

    def alone(changes):  # in a process that walked nothing before
        critical_path._WALKED.clear()
        critical_path._PLANS.clear()
        return walks(changes)

    unchanged = alone("")
    assert len(unchanged) == 2 and alone(free) == unchanged == walks("") == walks(free)
    assert walks(free, "1.0") != unchanged  # (the change does change the replay)

def test_the_walk_takes_its_events_in_any_order(ingested):
    """critical_path_walk orders its events (by rank, then id) and the replay's windows (by rank) before it builds
    the graph, whose walk breaks ties between equal paths by that order: the lists of the ranks and their windows
    in either order, each list reversed or not, give one path, segment for segment (the what_if macro's lists of a
    step's ranks came in any order of them, and with it, among equal paths, another path and remote_rank). HTA's
    sampled two-rank trace: the replay of each step and HTA's path of each rank's."""
    run = ingested(DATASETS / "hta_trace_filter")
    con = tracesql.connect(run)
    spans = "list(struct_pack(rank := CAST(rank AS BIGINT), ts := window_ts, te := window_te) ORDER BY {})"
    orders = ("rank", "rank DESC")
    replays = [con.sql(f"""SELECT step, critical_path_walk(flatten(list({events} ORDER BY {order})),
                                                          {spans.format(windows)}, NULL)
                           FROM critical_path_events() GROUP BY step ORDER BY step""").fetchall()
               for events in ("events", "list_reverse(events)") for order in orders for windows in orders]
    assert len(replays[0]) == 2 and all(len(path) > 100 for _, path in replays[0])
    assert all(replay == replays[0] for replay in replays)
    paths = [con.sql(f"""SELECT rank, step, critical_path_walk({events}, NULL, NULL) FROM critical_path_events()
                         ORDER BY rank, step""").fetchall() for events in ("events", "list_reverse(events)")]
    assert len(paths[0]) == 4 and paths[1] == paths[0]


@pytest.mark.slow  # ingests a corpus trace (the ingest the corpus replay test above shares)
def test_replay_queues_behind_device_work_launched_before_the_trace(ingested):
    """TraceLens' MI300 resnet_act_checkpoint: its first step's device work queues behind 968 kernels launched
    before the profile began (no launch in the trace), 30 ms of them. Free launches do not start it earlier: the
    step can take no less than, on each stream, the end of that work plus the step's own work on it (from the
    slices, the second method); with no launch overhead the replay takes exactly that on the communication stream,
    whose kernels wait for nothing else it sees."""
    run = ingested(corpus_path("tracelens/tests/traces/mi300/resnet_act_checkpoint.json.gz"))
    con = tracesql.connect(run)
    floor = dict(con.sql("""
        WITH launchless AS (
            SELECT stream, max(ts + dur) AS free FROM slices
            WHERE kind IN ('kernel', 'memcpy', 'memset') AND launch_id IS NULL GROUP BY stream)
        SELECT st.step, max(floor_ns) FROM (
            SELECT st.step, f.free - st.ts + sum(d.dur) AS floor_ns
            FROM steps st
            JOIN slices l ON l.ts BETWEEN st.ts AND st.ts + st.dur
            JOIN slices d ON d.launch_id = l.slice_id AND d.kind IN ('kernel', 'memcpy', 'memset')
            JOIN launchless f ON f.stream = d.stream AND d.ts >= f.free
            GROUP BY st.step, d.stream, f.free, st.ts) st
        GROUP BY step""").fetchall())
    freed = _what_if(run, no_launch_overhead=1).predicted_ns.to_dict()
    assert floor[15] == freed[(0, 15)] == 45_615_917  # (it predicted 24,998,161: the launch waited 29.4 ms)
    assert all(freed[(0, step)] >= ns for step, ns in floor.items())


@pytest.mark.slow  # ingests a corpus trace (the ingest the corpus replay test above shares)
def test_one_window_reads_the_device_work_before_it(ingested):
    """One step's event lists read only the device work near its time (what bounds the read: the rank's longest
    event and longest launch wait). HTA's ns_resolution_trace runs its device a step behind its host, so each
    step's launches queue behind, and its first kernels follow, work launched in the step before. Per step taken
    alone, each device event's queue lengths are its stream's launches minus starts up to then over the whole
    trace, and its stream_free the end of the event before it on its stream when that ends in the window (from
    the slices, the second method)."""
    run = ingested(corpus_path("hta/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"))
    con = tracesql.connect(run)
    expected = con.sql("""
        WITH queued AS (
            SELECT d.slice_id, d.stream, d.ts, d.dur, d.launch_ts FROM slices d JOIN slices l ON l.slice_id = d.launch_id
            WHERE d.kind IN ('kernel', 'memcpy', 'memset') AND d.launch_dur > 0 AND is_queued_launch(l.name)
        ), queue AS (
            SELECT slice_id, at_start,
                sum(delta) OVER (PARTITION BY stream ORDER BY t, at_start, slice_id ROWS UNBOUNDED PRECEDING) AS length
            FROM (SELECT stream, slice_id, launch_ts AS t, 1 AS delta, 0 AS at_start FROM queued
                  UNION ALL SELECT stream, slice_id, ts, -1, 1 FROM queued)
        )
        SELECT d.slice_id, ql.length AS queue_at_launch, qs.length AS queue_at_start,
            lag(d.ts + d.dur) OVER (PARTITION BY d.stream ORDER BY d.ts, d.slice_id) AS previous_end
        FROM slices d
        LEFT JOIN queue ql ON ql.slice_id = d.slice_id AND ql.at_start = 0
        LEFT JOIN queue qs ON qs.slice_id = d.slice_id AND qs.at_start = 1
        WHERE d.kind IN ('kernel', 'memcpy', 'memset')""").df().set_index("slice_id")
    steps = con.sql("SELECT count(*) FROM steps").fetchall()[0][0]
    held_over = 0
    for step in range(steps):
        events = con.sql(f"""SELECT window_ts, e.id, e.queue_at_launch, e.queue_at_start, e.stream_free
                             FROM (SELECT window_ts, unnest(events) AS e FROM critical_path_event_lists(occurrence := {step}))
                             WHERE e.role IN ('device', 'communication')""").df().set_index("id")
        mine = expected.loc[events.index]
        assert (events.queue_at_launch == mine.queue_at_launch).all()
        assert (events.queue_at_start == mine.queue_at_start).all()
        in_window = mine.previous_end >= events.window_ts
        assert (events.stream_free[in_window] == mine.previous_end[in_window]).all()
        held_over += int((mine.queue_at_launch > 1).sum())
    assert steps == 5 and held_over > 0


def test_one_window_reads_the_work_running_into_it(tmp_path):
    """A kernel launched in step 1 runs 200 µs, well into step 2, and step 2's kernel queues behind it on its
    stream: step 2 taken alone (its read bounded by the rank's longest device event before its start) still
    sees the stream free only when that kernel ends."""
    host = {"pid": 1, "tid": 1}
    trace = write_trace(tmp_path / "t.json", [
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "ts": 0, "dur": 100, **host},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10, "dur": 2, **host,
         "args": {"correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 20, "dur": 200, "pid": 0, "tid": 7,
         "args": {"correlation": 1, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#2", "ts": 100, "dur": 100, **host},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 110, "dur": 2, **host,
         "args": {"correlation": 2}},
        {"ph": "X", "cat": "kernel", "name": "relu", "ts": 220, "dur": 10, "pid": 0, "tid": 7,
         "args": {"correlation": 2, "device": 0, "stream": 7}},
    ])
    tracesql.ingest([trace], tmp_path / "run")
    con = tracesql.connect(tmp_path / "run")
    for lists in ("critical_path_event_lists(occurrence := 1)", "critical_path_event_lists()"):
        kernels = con.sql(f"""SELECT instance, e.queue_at_launch, e.queue_at_start, e.stream_free
                              FROM (SELECT instance, unnest(events) AS e FROM {lists}) WHERE e.role = 'device'
                              ORDER BY instance""").fetchall()
        assert kernels[-1] == (1, 1, 0, 220_000), lists
