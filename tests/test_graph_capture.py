"""CUDA/HIP-graph replays attributed to the ops that captured them (readers/graph_capture.py), on SGLang's real
decode trace and its capture trace. The second method: the raw capture trace walked by hand — the launches between
hipStreamBeginCapture and hipStreamEndCapture, in order, each to its cpu_op by `External id` — against the replayed
kernels in the order they ran."""

import pytest
from click.testing import CliRunner

import tracesql
from tracesql.cli import main
from conftest import DATASETS, raw_events

SGLANG = DATASETS / "tracelens_sglang_decode"
CAPTURES = SGLANG / "capture_traces"
VLLM_GRAPH = DATASETS / "tracelens_vllm_graph_execution"


def captured_ops() -> list[tuple[str, str, list]]:
    """(kernel, op name, op Input Dims) of each launch of the capture, in launch order."""
    events = raw_events(CAPTURES / "bs_32_rank0.json.gz")
    begin, end = (next(e for e in events if e.get("name") == n) for n in ("hipStreamBeginCapture", "hipStreamEndCapture"))
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op"}
    launches = sorted((e for e in events if e.get("cat") == "cuda_runtime" and "kernel" in e["args"]
                       and e["tid"] == begin["tid"] and begin["ts"] <= e["ts"] <= end["ts"]), key=lambda e: e["ts"])
    return [(e["args"]["kernel"], ops[e["args"]["External id"]]["name"],
             ops[e["args"]["External id"]]["args"]["Input Dims"]) for e in launches]


def replayed(run) -> list[tuple]:
    """(kernel, its op's name, input_dims, track, args) of each kernel of the graph launch, in the order they ran."""
    return tracesql.connect(run).sql("""
        SELECT k.name, o.name, o.input_dims, s.track, s.args
        FROM slices k JOIN slices l ON l.slice_id = k.launch_id JOIN ops o ON o.op_id = k.op_id
        JOIN slices s ON s.slice_id = o.op_id
        WHERE k.kind = 'kernel' AND l.name = 'hipGraphLaunch' ORDER BY k.ts, k.slice_id""").fetchall()


def test_capture_folder_is_not_a_rank(ingested):
    run = ingested(SGLANG)
    assert tracesql.connect(run).execute("SELECT rank, source_path FROM ranks").fetchall() == [
        (0, "sglang_Qwen3-8B_decode.json.gz")]


def test_replayed_kernels_get_the_op_that_captured_them(ingested):
    rows = replayed(ingested(SGLANG))
    expected = captured_ops()
    assert len(rows) == len(expected) == 544
    assert [(k, op, dims) for k, op, dims, _, _ in rows] == expected
    assert {track for *_, track, _ in rows} == {"process 251 / thread 251 / graph replay"}
    assert all('"graph_capture": "capture_traces/bs_32_rank0.json.gz", "graph_launch": 92178' in args
               for *_, args in rows)
    # the copies nest as the ops did at capture (the capture's 145 aten::mm each in an aten::matmul), on their own
    # track: no host op of the replay is their parent
    con = tracesql.connect(ingested(SGLANG))
    assert con.sql("""SELECT p.name, count(*) FROM ops o LEFT JOIN ops p ON p.op_id = o.parent_op_id
                      WHERE o.name = 'aten::mm' GROUP BY 1""").fetchall() == [("aten::matmul", 145)]
    # the replayed kernels' time is the copies' own, and the outermost copies' total (raw trace: 544 kernels)
    events = raw_events(SGLANG / "sglang_Qwen3-8B_decode.json.gz")
    replay_us = sum(e["dur"] for e in events if e.get("cat") == "kernel" and e["args"]["correlation"] == 92178)
    own, total = con.sql("""SELECT sum(device_self_ns), sum(device_total_ns) FILTER (WHERE parent_op_id IS NULL)
                            FROM ops WHERE tid < 0""").fetchall()[0]
    assert own == total == pytest.approx(replay_us * 1000, abs=544)
    # timed on the device after the host step `step[DECODE bs=32]` ends, the copies are in their graph launch's step
    assert con.sql("SELECT step, count(*) FROM ops WHERE tid < 0 GROUP BY step").fetchall() == [(0, 1376)]


def test_capture_traces_option_names_a_folder_elsewhere(tmp_path):
    (tmp_path / "job").mkdir()
    trace = tmp_path / "job" / "sglang_Qwen3-8B_decode.json.gz"
    trace.write_bytes((SGLANG / trace.name).read_bytes())
    result = CliRunner().invoke(main, ["ingest", str(trace), "-o", str(tmp_path / "run"), "-q",
                                       "--capture-traces", str(CAPTURES)])
    assert result.exit_code == 0, result.output
    assert [(k, op, dims) for k, op, dims, _, _ in replayed(tmp_path / "run")] == captured_ops()


def test_capture_that_does_not_match_leaves_the_replay_with_a_note(tmp_path):
    """vLLM's replay with SGLang's capture: none of its 421 kernels is attributed, and the warning says why."""
    result = tracesql.ingest([VLLM_GRAPH], tmp_path / "run", capture_traces=CAPTURES)
    assert [w.split(": ", 1)[1] for w in result.warnings if "graph" in w] == [
        "421 graph-replayed kernels keep the graph launch as their op: no capture region launches all their kernels"]
    rows = tracesql.query("cost_coverage", tmp_path / "run", per="kernel", top=1000)
    assert rows[rows.reason == "graph replay"].kernels.sum() == 421


def test_capture_trace_of_another_rank_is_not_read(tmp_path):
    """A capture folder of a job holds every rank's captures: the replay of rank 0 reads only those whose name
    gives rank 0 (or none)."""
    (tmp_path / "captures").mkdir()
    (tmp_path / "captures" / "bs_32_rank1.json.gz").write_bytes((CAPTURES / "bs_32_rank0.json.gz").read_bytes())
    result = tracesql.ingest([SGLANG / "sglang_Qwen3-8B_decode.json.gz"], tmp_path / "run",
                             capture_traces=tmp_path / "captures")
    assert [w.split(": ", 1)[1] for w in result.warnings if "graph" in w] == [
        "544 graph-replayed kernels keep the graph launch as their op: the capture traces hold no capture region of "
        "this rank"]


def test_capture_traces_option_must_name_a_folder_of_traces(tmp_path):
    with pytest.raises(tracesql.TraceError, match="--capture-traces: not a folder of trace files"):
        tracesql.ingest([VLLM_GRAPH], tmp_path / "run", capture_traces=tmp_path)
