"""cost_coverage: the share of compute time under an op the cost model counts, and what is left, on real traces.

The second method: the same sums walked in pandas over the run's Parquet tables (ops' parent links, the kernels'
launching ops) and, for the kernels no op launched, over the raw trace's events."""

import pandas as pd
import pytest

import tracesql
from conftest import DATASETS, corpus_path, raw_events, write_trace

B200 = DATASETS / "tracelens_b200_eager"
GRAPH = DATASETS / "tracelens_vllm_graph_execution"
SGLANG = DATASETS / "tracelens_sglang_decode"


def walked(run) -> tuple[int, int]:
    """(compute_ns, costed_ns) by walking each compute kernel's launching op up its parents to a counted op."""
    con = tracesql.connect(run)
    counted = set(con.sql("SELECT op_id FROM op_costs() WHERE counted").df().op_id)
    parent = dict(con.sql("SELECT op_id, parent_op_id FROM ops").df().itertuples(index=False))
    kernels = con.sql("SELECT op_id, dur FROM device_activity() WHERE class = 'compute'").df()

    def costed(op_id) -> bool:
        while not pd.isna(op_id):
            if op_id in counted:
                return True
            op_id = parent[op_id]
        return False

    return int(kernels.dur.sum()), int(kernels[[costed(o) for o in kernels.op_id]].dur.sum())


@pytest.mark.slow
def test_b200_costed_share_walked_and_uncosted_rows_add_up(ingested):
    run = ingested(B200)
    rank = tracesql.query("cost_coverage", run).iloc[0]
    compute_ns, costed_ns = walked(run)
    # the 73 symmetric-memory all-reduce kernels (2,119,548 ns) are communication, not compute
    # vLLM's MoE with MXFP4 weights (6,078,426 ns) is costed from the buffers it allocates, its FP8 paged attention
    # (485,821 ns) from the step's batch (test_serving_costs.py)
    assert (rank.compute_ns, rank.costed_ns) == (compute_ns, costed_ns) == (8_721_415, 8_712_423)
    assert rank.costed_pct == 99.9 and rank.uncosted_ns == compute_ns - costed_ns
    assert list(zip(rank.top_uncosted, rank.top_uncosted_ns)) == [
        ("_copy_page_indices_kernel", 5_088), ("aten::index", 3_904)]
    rows = tracesql.query("cost_coverage", run, per="kernel", top=1000)
    assert rows.uncosted_ns.sum() == rank.uncosted_ns and rows.kernels.sum() < rank.kernels
    assert rows.costed_ns.isna().all() and (rows.compute_ns == compute_ns).all()
    assert list(rows.reason) == ["no launch recorded", "no formula"]
    # the rows are what the rank's top_uncosted lists
    assert list(zip(rank.top_uncosted, rank.top_uncosted_ns)) == list(zip(rows.name[:5], rows.uncosted_ns[:5]))


def test_graph_replay_kernels_named_with_their_reason(ingested):
    """vLLM's full CUDA graph: the kernels of a replay are the graph launch's (its correlation id in the raw
    trace), none has a cost without the capture trace."""
    run = ingested(GRAPH)
    rows = tracesql.query("cost_coverage", run, per="kernel", top=1000)
    replay = rows[rows.reason == "graph replay"]
    events = raw_events(next(GRAPH.glob("*.json.gz")))
    graph_launches = {e["args"]["correlation"] for e in events if e.get("name") in ("cudaGraphLaunch", "hipGraphLaunch")}
    replayed = [e for e in events if e.get("cat") == "kernel" and e["args"]["correlation"] in graph_launches]
    assert replay.kernels.sum() == len(replayed) == 421
    assert replay.uncosted_ns.sum() == pytest.approx(sum(e["dur"] for e in replayed) * 1000, abs=len(replayed))
    assert replay.name.iloc[0] == "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1"
    assert (rows.compute_ns == 10_674_517).all()


@pytest.mark.slow
def test_h100_kernels_without_launch_match_the_raw_trace(ingested):
    """A third of the Qwen trace's kernel time ran before its first host event: no launch, no op, no shapes."""
    path = corpus_path("tracelens", "tests", "traces", "h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    run = ingested(path)
    rank = tracesql.query("cost_coverage", run).iloc[0]
    assert walked(run) == (rank.compute_ns, rank.costed_ns) == (45_432_698, 29_740_772)
    events = raw_events(path)
    launched = {e["args"]["correlation"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    orphans = [e for e in events if e.get("cat") == "kernel" and e["args"]["correlation"] not in launched]
    rows = tracesql.query("cost_coverage", run, per="kernel", top=1000)
    orphan_rows = rows[rows.reason == "no launch recorded"]
    assert orphan_rows.kernels.sum() == len(orphans) == 436
    assert orphan_rows.uncosted_ns.sum() == 13_672_640 == pytest.approx(sum(e["dur"] for e in orphans) * 1000, abs=436)


def test_capture_traces_folder_is_not_a_second_rank(tmp_path):
    """vLLM and SGLang write their graph-capture traces to capture_traces/ beside the profile, with the same rank:
    a folder holding both is one rank (the capture traces attribute graph replays: test_graph_capture.py), not a
    rank clash."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 5}]
    job = tmp_path / "job"
    (job / "capture_traces").mkdir(parents=True)
    write_trace(job / "trace.json", events, distributedInfo={"rank": 0, "world_size": 1})
    write_trace(job / "capture_traces" / "bs_32_rank0.json", events, distributedInfo={"rank": 0, "world_size": 1})
    tracesql.ingest([job], tmp_path / "run")
    ranks = tracesql.connect(tmp_path / "run").execute("SELECT rank, source_path FROM ranks").fetchall()
    assert ranks == [(0, "trace.json")]
    # named itself, the folder is read
    tracesql.ingest([job / "capture_traces"], tmp_path / "capture")
    assert tracesql.connect(tmp_path / "capture").execute("SELECT source_path FROM ranks").fetchall() == [
        ("bs_32_rank0.json",)]


def test_graph_replay_costed_through_its_capture_trace(ingested):
    """SGLang's decode replays one HIP graph (544 of its 555 kernels): with its capture trace beside it, the
    replayed kernels have the capture ops (aten::mm, rmsnorm, paged attention, ...) and their costs (the paged
    decode attention's from the step's batch: test_serving_costs.py). What stays uncosted is the copy of the
    batch into the graph's inputs (a TensorList's, whose shapes are not recorded) and kernels no op launched."""
    run = ingested(SGLANG)
    rank = tracesql.query("cost_coverage", run).iloc[0]
    assert walked(run) == (rank.compute_ns, rank.costed_ns) == (9_765_437, 9_731_512)
    assert rank.costed_pct == 99.65  # without the capture trace: 0.77; without the paged attention's cost: 77.86
    assert list(zip(rank.top_uncosted[:1], rank.top_uncosted_ns[:1])) == [("aten::_foreach_copy_", 12_096)]


def test_tensor_list_ops_are_uncosted_for_want_of_shapes(ingested):
    """aten::cat takes a TensorList, whose tensors' shapes Kineto does not keep (it records `[[null, null], []]`):
    its kernels are uncosted because the shapes are not in the trace, not for want of a formula."""
    run = ingested(DATASETS / "hta_trace_filter")
    rows = tracesql.query("cost_coverage", run, per="kernel", top=1000)
    cat = rows[rows.name == "aten::cat"]
    assert list(zip(cat["rank"], cat.reason, cat.kernels, cat.uncosted_ns)) == [
        (0, "shapes not recorded", 34, 11_380_000), (1, "shapes not recorded", 34, 11_578_000)]
    types = tracesql.connect(run).execute(
        "SELECT DISTINCT input_types FROM ops WHERE name = 'aten::cat'").fetchall()
    assert len(types) == 2 and all("TensorList" in t for (t,) in types)
