"""`tracesql export`: the written Perfetto trace read back with the perfetto package's protos, slice by slice,
against the run's tables (slices, steps, temporal_breakdown, warnings, counters) and against a crafted trace whose
numbers are known by hand."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracesql
from conftest import DATASETS, write_trace
from tracesql.cli import main
from tracesql.export import export, read

WINDOW = "run_id = $run AND rank = $rank AND ts <= $t1 AND ts + dur >= $t0"


def parse(path: Path) -> dict:
    """The file's tracks and events: slices rebuilt from begin/end pairs per track (which must nest and move
    forward in time), instants, flows, counters."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TrackEvent

    tracks, open_, slices, instants, counters = {}, {}, [], [], []
    last: dict[int, int] = {}
    for p in read(path):
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            name = d.name or d.thread.thread_name or d.process.process_name
            tracks[d.uuid] = (name, d.parent_uuid or None)
            continue
        e = p.track_event
        assert p.trusted_packet_sequence_id == 1 and e.track_uuid in tracks
        assert p.timestamp >= last.get(e.track_uuid, 0), "events of a track go forward in time"
        last[e.track_uuid] = p.timestamp
        ann = {a.name: (a.string_value if a.HasField("string_value") else a.int_value) for a in e.debug_annotations}
        if e.type == TrackEvent.TYPE_SLICE_BEGIN:
            open_.setdefault(e.track_uuid, []).append((p.timestamp, e))
        elif e.type == TrackEvent.TYPE_SLICE_END:
            ts, begin = open_[e.track_uuid].pop()
            slices.append({"track": tracks[e.track_uuid][0], "parent": tracks[e.track_uuid][1], "uuid": e.track_uuid,
                           "name": begin.name, "ts": ts, "dur": p.timestamp - ts, "cat": list(begin.categories),
                           "flow_out": list(begin.flow_ids), "flow_in": list(begin.terminating_flow_ids),
                           "ann": {a.name: (a.string_value if a.HasField("string_value") else a.int_value)
                                   for a in begin.debug_annotations}})
        elif e.type == TrackEvent.TYPE_INSTANT:
            instants.append({"track": tracks[e.track_uuid][0], "name": e.name, "ts": p.timestamp, "ann": ann})
        elif e.type == TrackEvent.TYPE_COUNTER:
            counters.append((tracks[e.track_uuid][0], p.timestamp, e.double_counter_value))
    assert all(not stack for stack in open_.values()), "every slice that begins ends"
    return {"tracks": tracks, "slices": slices, "instants": instants, "counters": counters}


def trace_slices(parsed) -> list[dict]:
    return [s for s in parsed["slices"] if s["cat"] != ["tracesql"]]


def lane_ns(parsed, lane: str, device_track: str) -> int:
    parent = next(u for u, (name, _) in parsed["tracks"].items() if name == device_track)
    return sum(s["dur"] for s in parsed["slices"] if s["track"] == f"tracesql · {lane}" and s["parent"] == parent)


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    """One step: two ops that overlap without nesting (b starts inside a, ends after it), a GEMM launched at 12 µs
    running 15–45 µs, an NCCL all-reduce launched at 25 µs running 30–70 µs, an allocator event."""
    tmp = tmp_path_factory.mktemp("crafted")
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::a", "pid": 1, "tid": 1, "ts": 10, "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": "aten::b", "pid": 1, "tid": 1, "ts": 20, "dur": 20},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 12, "dur": 2,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "gemm <script>alert(1)</script>", "pid": 0, "tid": 7, "ts": 15,
         "dur": 30, "args": {"correlation": 7, "device": 0, "stream": 7}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 25, "dur": 2,
         "args": {"correlation": 8}},
        {"ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce", "pid": 0, "tid": 8, "ts": 30, "dur": 40,
         "args": {"correlation": 8, "device": 0, "stream": 8}},
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 50, "s": "t",
         "args": {"Device Type": 1, "Device Id": 0, "Bytes": 1024, "Total Allocated": 1024,
                  "Total Reserved": 2048, "Addr": 1}},
    ]
    run = tmp / "run"
    tracesql.ingest([write_trace(tmp / "t.json", events)], run)
    result = export(run, tmp / "step1.pftrace", step=1)
    return result, parse(tmp / "step1.pftrace")


def test_crafted_step_lanes_flows_and_nesting_by_hand(crafted):
    result, parsed = crafted
    us = 1000
    # tracesql's lanes over the step's device window 15–70 µs: compute 15–45, communication 30–70, exposed 45–70
    assert result.device_windows == {0: (15 * us, 70 * us)}
    got = {(s["track"], s["ts"], s["dur"]) for s in parsed["slices"] if s["cat"] == ["tracesql"]}
    assert got == {("tracesql · compute", 15 * us, 30 * us), ("tracesql · communication", 30 * us, 40 * us),
                   ("tracesql · exposed communication", 45 * us, 25 * us)}  # no memory, no idle
    assert result.lanes[(0, "exposed communication")] == 25 * us and result.lanes[(0, "idle")] == 0
    # aten::b overlaps aten::a without nesting: it goes to a second lane of the thread, nothing is cut
    by_name = {s["name"]: s for s in trace_slices(parsed)}
    assert by_name["aten::a"]["track"] == "process 1 / thread 1" and by_name["aten::b"]["track"] == "thread 1 (2)"
    assert (by_name["aten::b"]["ts"], by_name["aten::b"]["dur"]) == (20 * us, 20 * us)
    # flows: each launch to its kernel
    launches = sorted((s["ts"], s["flow_out"]) for s in trace_slices(parsed) if s["name"] == "cudaLaunchKernel")
    gemm, nccl = by_name["gemm <script>alert(1)</script>"], by_name["ncclKernel_AllReduce"]
    assert [f for _, f in launches] == [gemm["flow_in"], nccl["flow_in"]] and result.flows == 2
    assert gemm["ann"]["class"] == "compute" and nccl["ann"]["class"] == "communication"
    assert gemm["track"] == "device 0 / stream 7" and gemm["ann"]["kind"] == "kernel" and gemm["ann"]["step"] == 1
    # the allocator event as an instant, the unterminated-step warning as an instant at the window's start
    assert [(i["name"], i["ts"]) for i in parsed["instants"] if i["track"] == "process 1 / thread 1"] == \
        [("[memory]", 50 * us)]
    (warning,) = [i for i in parsed["instants"] if i["track"] == "rank 0 · tracesql · warnings"]
    assert warning["name"] == "warning: unterminated_step" and warning["ts"] == 0
    assert "end after every other event" in warning["ann"]["message"] and warning["ann"]["event_count"] == 1


@pytest.mark.parametrize("rank, step", [(0, 551), (1, 552)])
def test_step_round_trip_matches_the_tables(ingested, tmp_path, rank, step):
    """hta_trace_filter (2 ranks of an NCCL job): every slice of the window, with its track, start and duration;
    the flows; and tracesql's lanes equal to temporal_breakdown per=step."""
    run = ingested(DATASETS / "hta_trace_filter")
    out = tmp_path / "s.pftrace"
    result = export(run, out, rank=rank, step=step)
    parsed = parse(out)
    con = tracesql.connect(run)
    params = {"run": result.run_id, "rank": rank, "t0": result.window[0], "t1": result.window[1]}
    expected = con.execute(f"SELECT name, ts, dur FROM slices WHERE {WINDOW} AND kind NOT IN ('instant', 'memory')",
                       params).fetchall()
    got = trace_slices(parsed)
    assert Counter((s["name"], s["ts"], s["dur"]) for s in got) == Counter(expected)
    assert result.slices == len(got) == len(expected) > 2000
    host, device = con.execute(f"SELECT count(*) FILTER (WHERE device_id IS NULL), count(*) FILTER (WHERE device_id "
                           f"IS NOT NULL) FROM slices WHERE {WINDOW}", params).fetchone()
    on_device = [s for s in got if s["track"].startswith("device ")]
    assert len(on_device) == device and len(got) - len(on_device) == host
    # flows: one per device event whose launch is in the file, each starting and ending once
    launched = con.execute(f"SELECT count(*) FROM slices k JOIN slices l ON l.run_id = k.run_id AND l.rank = k.rank AND "
                       f"l.slice_id = k.launch_id WHERE k.run_id = $run AND k.rank = $rank AND k.ts <= $t1 AND "
                       f"k.ts + k.dur >= $t0 AND l.ts <= $t1 AND l.ts + l.dur >= $t0", params).fetchone()[0]
    outs = [f for s in got for f in s["flow_out"]]
    ins = [f for s in got for f in s["flow_in"]]
    assert len(outs) == len(set(outs)) == len(ins) == result.flows == launched > 500 and set(outs) == set(ins)
    # the step's host range is the window's start; the ProfilerStep slice is in the file
    (host_ts, host_dur), = con.execute("SELECT ts, dur FROM steps WHERE rank = $rank AND step = $step",
                                   {"rank": rank, "step": step}).fetchall()
    assert any(s["name"] == f"ProfilerStep#{step}" and (s["ts"], s["dur"]) == (host_ts, host_dur) for s in got)
    breakdown = tracesql.query("temporal_breakdown", run, per="step")
    row = breakdown[(breakdown["rank"] == rank) & (breakdown.step == step)].iloc[0]
    track = f"rank {rank} · device {row.device_id}"
    assert lane_ns(parsed, "compute", track) == row.compute_ns
    assert lane_ns(parsed, "exposed communication", track) == row.exposed_comm_ns
    assert lane_ns(parsed, "idle", track) == row.idle_ns
    assert result.device_windows[row.device_id][1] - result.device_windows[row.device_id][0] == row.window_ns


def test_whole_trace_without_steps_matches_temporal_breakdown_per_rank(ingested, tmp_path):
    """tracelens_b200_eager: no ProfilerStep; the rank's whole trace, shapes and args kept as annotations."""
    run = ingested(DATASETS / "tracelens_b200_eager")
    result = export(run, tmp_path / "all.pftrace")
    parsed = parse(tmp_path / "all.pftrace")
    con = tracesql.connect(run)
    total, kernels = con.execute("SELECT count(*) FILTER (WHERE kind NOT IN ('instant', 'memory')), "
                             "count(*) FILTER (WHERE kind = 'kernel') FROM slices").fetchone()
    got = trace_slices(parsed)
    assert result.step is None and len(got) == result.slices == total
    assert sum(1 for s in got if s["ann"].get("kind") == "kernel") == kernels
    row = tracesql.query("temporal_breakdown", run).iloc[0]
    for lane, column in (("compute", "compute_ns"), ("exposed communication", "exposed_comm_ns"), ("idle", "idle_ns")):
        assert lane_ns(parsed, lane, f"rank 0 · device {row.device_id}") == row[column]
    with_args = [s for s in got if "args" in s["ann"]]
    assert with_args and all(len(s["ann"]["args"]) <= 4096 for s in with_args)


def test_counters_and_warnings_of_the_run(ingested, tmp_path):
    run = ingested(DATASETS / "viztracer_counters")
    result = export(run, tmp_path / "c.pftrace")
    parsed = parse(tmp_path / "c.pftrace")
    con = tracesql.connect(run)
    values = sorted(con.execute("SELECT ts, value FROM counters").fetchall())
    assert sorted((t, v) for _, t, v in parsed["counters"]) == values and result.counter_values == len(values) > 0
    checks = [c for (c,) in con.execute("SELECT check_name FROM warnings ORDER BY 1").fetchall()]
    assert [i["name"] for i in parsed["instants"] if i["track"].endswith("tracesql · warnings")] == \
        [f"warning: {c}" for c in checks] and checks


def test_cli_writes_one_file_and_says_what_is_in_it(ingested, tmp_path):
    run = ingested(DATASETS / "hta_trace_filter")
    out = tmp_path / "deep" / "r1.pftrace"
    result = CliRunner().invoke(main, ["export", str(run), "--rank", "1", "--step", "552", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{out}: hta_trace_filter rank 1 step 552, ") and "ui.perfetto.dev" in result.output
    assert [p.name for p in out.parent.iterdir()] == ["r1.pftrace"]  # written aside, renamed: no temp file left


@pytest.mark.parametrize("args, message", [
    ([], "the run has 2 ranks (0, 1); pick one with --rank"),
    (["--rank", "5"], "--rank 5: no such rank in hta_trace_filter (ranks: 0, 1)"),
    (["--rank", "0", "--step", "9"], "--step 9: rank 0 of hta_trace_filter has no such step (steps: 551, 552)"),
])
def test_bad_rank_or_step_is_a_one_line_error(ingested, tmp_path, args, message):
    run = ingested(DATASETS / "hta_trace_filter")
    result = CliRunner().invoke(main, ["export", str(run), *args, "-o", str(tmp_path / "x.pftrace")])
    assert result.exit_code == 1 and message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "x.pftrace").exists()
