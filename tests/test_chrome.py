"""Chrome trace JSON beyond Kineto, on real traces made by Chromium, Node.js, VizTracer and JAX: begin/end and
async pairs, flows, counters, the array format, and the JAX JSON agreeing with the XPlane of the same session.
Every number is checked against the raw JSON read by json.loads (or, for JAX, against the other format)."""

from __future__ import annotations

import bisect
import gzip
import json
import shutil
from collections import Counter, defaultdict

import pytest

import tracesql
from conftest import DATASETS, raw_events
from tracesql import queries
from tracesql.readers import reader_for

CHROMIUM = DATASETS / "chromium_json" / "chromium_trace.json.gz"
NODE = DATASETS / "nodejs_async" / "node_trace.json.gz"
VIZ = DATASETS / "viztracer_counters" / "viz_trace.json"
JAX = DATASETS / "jax_cpu_mlp"


def run_sql(run, sql):
    return tracesql.connect(run).execute(sql).fetchall()


def ns(us: float) -> int:
    return round(us * 1000)


@pytest.mark.parametrize("trace", [CHROMIUM, NODE, VIZ], ids=lambda p: p.parent.name)
def test_generic_chrome_traces_are_read_as_chrome_and_every_query_runs(trace, ingested):
    run = ingested(trace)
    assert reader_for(trace).FORMAT == "kineto"  # one reader for Chrome JSON; the dialect decides the rest
    assert run_sql(run, "SELECT source_format FROM ranks") == [("chrome",)]
    con = tracesql.connect(run)
    for query in queries.catalogue():
        queries.run(con, query).fetchall()


def test_thread_begin_end_pairs_match_the_end_event_of_the_same_name(ingested):
    """Node writes the name on both B and E; the matcher does not use it, so the names check the matching."""
    events = raw_events(NODE)
    ends = {(e["pid"], e["tid"], ns(e["ts"]), e["name"]) for e in events if e["ph"] == "E"}
    rows = run_sql(ingested(NODE), f"""
        SELECT pid, tid, ts, dur, name FROM slices
        WHERE slice_id IN ({", ".join(str(i) for i, e in enumerate(events) if e["ph"] == "B")})""")
    assert len(rows) == sum(e["ph"] == "B" for e in events) == 9
    base = min(ns(e["ts"]) for e in events if "ts" in e)  # the reader keeps absolute µs -> ns; no base here
    assert base > 0
    for pid, tid, ts, dur, name in rows:
        assert (pid, tid, ts + dur, name) in ends


def test_async_pairs_are_slices_on_async_tracks_and_unended_ones_are_reported(tmp_path):
    # Node writes the name on the end too: matching by (category, id, name), which the reader does not use, is a
    # second method (a resource's callbacks nest inside it under the same id)
    open_by_key, expected = defaultdict(list), []
    for e in sorted(raw_events(NODE), key=lambda e: e.get("ts", 0)):
        if e["ph"] == "b":
            open_by_key[(e["cat"], e["id"], e["name"])].append(e)
        elif e["ph"] == "e":
            begin = open_by_key[(e["cat"], e["id"], e["name"])].pop()
            expected.append((e["name"], ns(e["ts"]) - ns(begin["ts"])))
    result = tracesql.ingest([NODE], tmp_path / "run")
    rows = run_sql(tmp_path / "run", "SELECT name, dur FROM slices WHERE track LIKE '% / async %' ORDER BY 1, 2")
    assert rows == sorted(expected) and len(rows) == 106
    unended = sum(map(len, open_by_key.values()))
    assert unended == 100
    assert any(f"{unended} begin that never ends" in w for w in result.warnings)
    tracks = run_sql(tmp_path / "run", "SELECT DISTINCT track FROM slices WHERE track LIKE '% / async %'")
    assert ("node / async FSREQPROMISE",) in tracks


def _enclosing_slices(events):
    """Per (pid, tid): complete events sorted by start, for a brute-force 'innermost slice enclosing t'."""
    lanes = defaultdict(list)
    for i, e in enumerate(events):
        if e.get("ph") == "X" and "dur" in e:
            lanes[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), i))
    for lane in lanes.values():
        lane.sort()
    return lanes


def test_flows_give_the_slices_they_bind_to_a_shared_correlation_id(ingested):
    events = raw_events(CHROMIUM)
    lanes = _enclosing_slices(events)
    bound = defaultdict(set)
    for e in events:
        if e.get("ph") in ("s", "f"):
            lane, t = lanes.get((e["pid"], e["tid"]), []), ns(e["ts"])
            k = bisect.bisect_right(lane, (t, float("inf"), 0)) - 1  # the latest to start at or before t
            if k >= 0 and lane[k][0] <= t <= lane[k][1]:
                bound[lane[k][2]].add(e["id"])
    rows = run_sql(ingested(CHROMIUM), f"""
        SELECT slice_id, correlation FROM slices WHERE slice_id IN ({", ".join(map(str, bound))}) ORDER BY 1""")
    # where several flows bind to one slice, the smallest id is its correlation
    assert rows == sorted((i, min(ids)) for i, ids in bound.items()) and len(rows) == 347
    # flows that connect two slices (a task posted on one thread, run on another)
    shared = Counter(min(ids) for ids in bound.values())
    linked = run_sql(ingested(CHROMIUM), """
        SELECT count(*) FROM (SELECT correlation FROM slices WHERE correlation IS NOT NULL
                              GROUP BY 1 HAVING count(*) >= 2)""")[0][0]
    assert linked == sum(n >= 2 for n in shared.values()) == 69


def test_counter_events_become_one_row_per_series(ingested):
    expected = sorted((e["name"], key, ns(e["ts"]), float(v)) for e in raw_events(VIZ) if e.get("ph") == "C"
                      for key, v in e["args"].items())
    rows = run_sql(ingested(VIZ), "SELECT name, series, ts, value FROM counters ORDER BY 1, 2, 3")
    assert sorted(rows) == expected and len(rows) == 6
    assert run_sql(ingested(VIZ), "SELECT DISTINCT track FROM counters") == [("MainProcess",)]


def test_labelled_step_annotations_are_steps(ingested):
    """VizTracer names a log_event 'ProfilerStep#0 (generate.py:20)': still step 0, with its calls inside."""
    events = raw_events(VIZ)
    steps = sorted((int(e["name"].split("#")[1].split()[0]), ns(e["dur"])) for e in events
                   if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#"))
    run = ingested(VIZ)
    assert run_sql(run, "SELECT step, dur FROM steps ORDER BY 1") == steps and len(steps) == 3
    per_step = run_sql(run, "SELECT step, count(*) FROM slices WHERE depth = 1 GROUP BY 1 ORDER BY 1")
    assert per_step == [(0, 4), (1, 4), (2, 4)]  # forward, backward, time.sleep, the optimizer instant


def test_array_format_without_its_closing_bracket_reads_like_the_object(tmp_path, ingested):
    events = raw_events(VIZ)
    text = json.dumps(events)
    (tmp_path / "array").mkdir()
    (tmp_path / "array" / "viz.json").write_text(text[:-1] + ",\n")  # a tracer stopped before closing the list
    tracesql.ingest([tmp_path / "array" / "viz.json"], tmp_path / "a")
    sql = "SELECT slice_id, kind, name, ts, dur, depth, step FROM slices ORDER BY 1"
    assert run_sql(tmp_path / "a", sql) == run_sql(ingested(VIZ), sql)
    assert len(run_sql(tmp_path / "a", sql)) == 15


# dataset, XLA ops in it (json.loads: events with hlo_op and device_ordinal args); the 4-device session (11 s in
# CI) is slow: the MLP's keeps the two readers' agreement in `pytest`
JAX_SESSIONS = [pytest.param(("jax_cpu_mlp", 30), id="jax_cpu_mlp"),
                pytest.param(("jax_cpu_4dev_allreduce", 156), id="jax_cpu_4dev_allreduce", marks=pytest.mark.slow)]


@pytest.fixture(scope="module", params=JAX_SESSIONS)
def jax_runs(request, tmp_path_factory, ingested):
    """A JAX session's Chrome JSON and its XPlane, each ingested, and its number of XLA ops."""
    name, xla_ops = request.param
    folder = DATASETS / name
    tmp = tmp_path_factory.mktemp(name)
    (tmp / "json").mkdir()
    shutil.copy(folder / "vm.trace.json.gz.crosscheck", tmp / "json" / "vm.trace.json.gz")
    tracesql.ingest([tmp / "json"], tmp / "from_json")
    return tmp / "from_json", ingested(folder / "vm.xplane.pb"), xla_ops


def test_jax_chrome_json_and_xplane_agree(jax_runs):
    from_json, from_xplane, xla_ops = jax_runs
    for sql in ("SELECT kind, count(*), sum(dur), count(step) FROM slices GROUP BY 1 ORDER BY 1",
                "SELECT step, dur, device_dur, kernel_count FROM steps ORDER BY 1",
                "SELECT name, device_id, count(*), sum(dur) FROM slices WHERE kind = 'kernel' GROUP BY 1, 2 ORDER BY 1, 2",
                "SELECT collective, device_id, seq, step, device_dur FROM collectives ORDER BY 2, 3"):
        assert run_sql(from_json, sql) == run_sql(from_xplane, sql), sql
    assert run_sql(from_json, "SELECT count(*) FROM slices WHERE kind = 'kernel'") == [(xla_ops,)]
    assert run_sql(from_json, "SELECT count(*), sum(kernel_count) FROM steps") == [(3, xla_ops)]


def test_jax_hotspots_agree(jax_runs):
    from_json, from_xplane, _ = jax_runs

    def hotspots(run):
        con = tracesql.connect(run)
        return [row[1:] for row in queries.run(con, queries.find("hotspots"), {"top": 10}).fetchall()]  # no run_id

    assert hotspots(from_json) == hotspots(from_xplane)
    assert len(hotspots(from_json)) >= 10


def test_xla_all_reduce_ops_are_collectives_per_device(ingested):
    """pmean over 4 devices: one XLA all-reduce per device per step, numbered per device, each in its step;
    their times are the all-reduce events of the session's Chrome JSON (json.loads)."""
    folder = DATASETS / "jax_cpu_4dev_allreduce"
    events = raw_events(folder / "vm.trace.json.gz.crosscheck")
    expected = sorted((int(e["args"]["device_ordinal"]), ns(e["dur"])) for e in events
                      if e.get("ph") == "X" and e["name"] == "all-reduce" and "hlo_op" in e.get("args", {}))
    run = ingested(folder / "vm.xplane.pb")
    rows = run_sql(run, "SELECT device_id, seq, step, collective, kernel_dur FROM collectives ORDER BY 1, 2")
    assert [(d, s, st, c) for d, s, st, c, _ in rows] == [(d, i, i, "all_reduce") for d in range(4) for i in range(3)]
    assert sorted((d, t) for d, _, _, _, t in rows) == expected
    # per device, communication time is its all-reduces' time: on the CPU backend nothing runs beside them
    overlap = tracesql.query("overlap", run)
    assert list(zip(overlap.device_id, overlap.comm_ns, overlap.overlap_ns)) == [
        (d, sum(t for dd, t in expected if dd == d), 0) for d in range(4)]


def test_chromium_perfetto_trace_times_are_on_the_monotonic_clock(ingested):
    """Chromium times track events as µs deltas on an incremental clock of each packet sequence; read as
    plain ns they would end before they begin."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket

    path = DATASETS / "chromium_perfetto" / "chromium.perfetto-trace.gz"
    trace = Trace.FromString(gzip.decompress(path.read_bytes()))
    monotonic = [c.timestamp for p in trace.packet if p.HasField("clock_snapshot")
                 for c in p.clock_snapshot.clocks if c.clock_id == 3]
    run = ingested(path)
    (first, last, negative), = run_sql(run, "SELECT min(ts), max(ts + dur), count(*) FILTER (dur < 0) FROM slices")
    assert negative == 0
    assert min(monotonic) - 2e9 < first < last < max(monotonic) + 2e9
    assert run_sql(run, "SELECT skipped_count < 0.01 * event_count FROM ranks") == [(True,)]
    # thread CPU time: an incremental counter track per thread, its values carried by the thread's slices through
    # the sequence's default extra counter tracks; a cleared incremental state starts the sum again
    tracks = {p.track_descriptor.uuid: p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")}
    thread = next(u for u, d in tracks.items() if d.thread.thread_name == "VizCompositorThread")
    counter = next(u for u, d in tracks.items() if d.HasField("counter") and d.parent_uuid == thread)
    defaults, sums, expected = {}, {}, []
    for p in trace.packet:
        seq = p.trusted_packet_sequence_id
        if p.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            sums[seq] = 0
        if p.HasField("trace_packet_defaults"):
            defaults[seq] = list(p.trace_packet_defaults.track_event_defaults.extra_counter_track_uuids)
        e = p.track_event
        for uuid, value in zip(list(e.extra_counter_track_uuids) or defaults.get(seq, []), e.extra_counter_values):
            if uuid == counter:
                sums[seq] = sums.get(seq, 0) + value
                expected.append(sums[seq] * tracks[counter].counter.unit_multiplier)
    values = [v for v, in run_sql(run, """SELECT value FROM counters
                                        WHERE track = 'GPU Process / VizCompositorThread' AND name = 'thread_time'""")]
    assert sorted(values) == sorted(expected) and len(values) == 380


def test_counter_values_that_are_not_numbers_are_counted_not_stored(tmp_path):
    """A real VizTracer trace whose first counter event had a series damaged into text."""
    trace = json.loads(VIZ.read_text())
    first = next(e for e in trace["traceEvents"] if e.get("ph") == "C")
    first["args"]["allocated"] = "lots"
    (tmp_path / "damaged.json").write_text(json.dumps(trace))
    result = tracesql.ingest([tmp_path / "damaged.json"], tmp_path / "run")
    assert any("1 counter value that is not a number" in w for w in result.warnings), result.warnings
    assert run_sql(tmp_path / "run", "SELECT count(*), count(*) FILTER (series = 'allocated') FROM counters") == [(5, 2)]
