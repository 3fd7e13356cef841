"""cost_coverage: the share of compute time under an op the cost model counts, and what is left, on real traces.

The second method: the same sums walked in pandas over the run's Parquet tables (ops' parent links, the kernels'
launching ops) and, for the kernels no op launched, over the raw trace's events."""

import json
from collections import Counter

import pandas as pd
import pytest

import tracesql
from conftest import DATASETS, corpus_path, raw_events, write_trace

B200 = DATASETS / "tracelens_b200_eager"
GRAPH = DATASETS / "tracelens_vllm_graph_execution"
SGLANG = DATASETS / "tracelens_sglang_decode"


def walked(run) -> tuple[int, int]:
    """(compute_ns, costed_ns) by walking each compute kernel's launching op up its parents to a counted op (a
    kernel with no launch: costed when it is itself a counted row, cost_source 'identical kernel')."""
    con = tracesql.connect(run)
    counted = set(con.sql("SELECT op_id FROM op_costs() WHERE counted").df().op_id)
    parent = dict(con.sql("SELECT op_id, parent_op_id FROM ops").df().itertuples(index=False))
    kernels = con.sql("SELECT slice_id, op_id, dur FROM device_activity() WHERE class = 'compute'").df()

    def costed(kernel) -> bool:
        op_id = kernel.op_id
        if pd.isna(op_id):
            return kernel.slice_id in counted
        while not pd.isna(op_id):
            if op_id in counted:
                return True
            op_id = parent[op_id]
        return False

    return int(kernels.dur.sum()), int(kernels[[costed(k) for k in kernels.itertuples()]].dur.sum())


def launchless_kernel_costs(run) -> dict[int, tuple]:
    """Second method for the kernels with no launch (nor op): per such kernel, (the one cost (op name, FLOPs, bytes)
    of the counted ops that launched kernels of the same name, grid, block, registers and shared memory and no
    other kernel, or None when those ops' costs differ or some have none; the one cost of the ops that launched the
    identical kernels at its place when its stream's launchless kernels are slid along the launched ones to the
    shifts where most match, or None); kernels with no identical launched kernel of a cost are left out."""
    con = tracesql.connect(run)
    costs = {r[0]: r[1:] for r in con.sql("SELECT op_id, name, flops, bytes FROM op_costs() WHERE counted "
                                          "AND cost_source NOT IN ('identical kernel', 'aligned kernel')").fetchall()}
    parent = dict(con.sql("SELECT op_id, parent_op_id FROM ops").fetchall())
    kernels = con.sql("SELECT slice_id, op_id, name, args, launch_id, stream FROM slices WHERE kind = 'kernel' "
                      "ORDER BY ts, slice_id").fetchall()

    def counted_op(op_id):
        while op_id is not None and op_id not in costs:
            op_id = parent[op_id]
        return op_id

    def launch(k) -> tuple:
        args = json.loads(k[3])
        return (k[2], *(str(args.get(a)) for a in ("grid", "block", "registers per thread", "shared memory")))

    identity = {k[0]: launch(k) for k in kernels}
    launched = [(k, counted_op(k[1])) for k in kernels if k[1] is not None or k[4] is not None]
    kernels_of = Counter(op for _, op in launched)
    cost_of = {k[0]: costs[op] if op is not None and kernels_of[op] == 1 else None for k, op in launched}
    seen: dict[tuple, set] = {}
    for k, _ in launched:
        if k[1] is not None:
            seen.setdefault(identity[k[0]], set()).add(cost_of[k[0]])
    found = {}
    for stream in {k[5] for k in kernels}:
        tail = [k for k in kernels if k[5] == stream and k[1] is None and k[4] is None]
        sequence = [k for k, _ in launched if k[5] == stream]
        matches = {shift: {t[0]: cost_of[sequence[i + shift][0]] for i, t in enumerate(tail)
                           if 0 <= i + shift < len(sequence) and identity[t[0]] == identity[sequence[i + shift][0]]}
                   for shift in range(-len(tail), len(sequence))}
        most = max(map(len, matches.values()), default=0)
        aligned: dict[int, set] = {}
        for matched in (m for m in matches.values() if most and len(m) == most):
            for t in tail:  # no identical kernel at its place in one of the best shifts: no cost from there
                aligned.setdefault(t[0], set()).add(matched.get(t[0]))
        for t in tail:
            candidates = seen.get(identity[t[0]], set())
            if candidates - {None}:
                here = aligned.get(t[0], {None})
                found[t[0]] = (next(iter(candidates)) if len(candidates) == 1 else None,
                               next(iter(here)) if len(here) == 1 else None)
    return found


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
    # aten::index: its indices, a list of optional tensors, are recorded with neither type nor shape
    assert list(rows.reason) == ["no launch recorded", "shapes not recorded"]
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
def test_h100_kernels_without_launch_costed_by_identical_kernels(ingested):
    """A third of the Qwen trace's kernel time ran before its first host event (the previous iteration's tail): no
    launch, no op, no shapes. The kernels whose identical kernels (same name and launch configuration) were
    launched later by ops of one cost take that cost: 303 of the 436, 20 points of compute time. 113 have identical
    kernels launched by ops of different costs (a cuBLAS GEMM of one grid for K = 1,024 and 2,816; a bf16 mul of
    one grid over two broadcasts): lined up with the traced kernel sequence, each takes the cost of the op at its
    place, 8 points more; 20 (aten::cat's kernel) stay uncosted, that op having no cost."""
    path = corpus_path("tracelens", "tests", "traces", "h100", "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")
    run = ingested(path)
    rank = tracesql.query("cost_coverage", run).iloc[0]
    assert walked(run) == (rank.compute_ns, rank.costed_ns) == (45_432_698, 42_579_272)
    # 65.46 before the kernels with no launch took their identical kernels' cost, 85.45 before the aligned ones;
    # 1,504 ns less before aten::arange (its bounds recorded) had a cost
    assert rank.costed_pct == 93.72
    events = raw_events(path)
    launched = {e["args"]["correlation"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    orphans = [e for e in events if e.get("cat") == "kernel" and e["args"]["correlation"] not in launched]
    assert len(orphans) == 436 and sum(e["dur"] for e in orphans) * 1000 == pytest.approx(13_672_640, abs=436)
    rows = tracesql.query("cost_coverage", run, per="kernel", top=1000)
    by_reason = rows.groupby("reason")[["kernels", "uncosted_ns"]].sum()
    assert "identical kernels, different costs" not in by_reason.index
    assert by_reason.loc["no launch recorded"].tolist() == [20, 835_644]
    # the second method: the same matching and alignment walked in Python, and the costs op_costs() gives
    found = launchless_kernel_costs(run)
    inferred = tracesql.connect(run).sql(
        "SELECT op_id, name, flops, bytes, counted, cost_source FROM op_costs() "
        "WHERE cost_source IN ('identical kernel', 'aligned kernel')").fetchall()
    assert {op_id: ((name, flops, b) if counted else None, source)
            for op_id, name, flops, b, counted, source in inferred} == {
        op_id: (identical, "identical kernel") if identical else (aligned, "aligned kernel" if aligned else
                                                                   "identical kernel")
        for op_id, (identical, aligned) in found.items()}
    # where identical kernels agree, their place in the sequence gives the same cost
    assert all(aligned == identical for identical, aligned in found.values() if identical)
    assert Counter((identical is not None, aligned is not None) for identical, aligned in found.values()) == {
        (True, True): 303, (False, True): 113}


def test_kernel_without_launch_costed_by_identical_kernels_or_by_place(tmp_path):
    """Kernels with no launch (the previous iteration's tail: mul, relu, a relu of another grid, mul): the relu,
    whose identical kernel was launched by an op of one cost, takes it (cost source 'identical kernel'); the first
    mul, whose identical kernels were launched by two muls of different costs, takes the cost of the one at its
    place when the tail is lined up with the launched sequence (mul, mul, relu) where most kernels match: the
    second, broadcasting mul (cost source 'aligned kernel'); the last mul has no place there and stays uncosted,
    saying why; the relu of another grid than any launched kernel has no launch recorded."""
    host, events = dict(pid=1, tid=1), []
    ops = [("aten::mul", [[64, 32], [64, 32]], "mul_kernel"), ("aten::mul", [[64, 32], [1, 32]], "mul_kernel"),
           ("aten::relu", [[64, 32]], "relu_kernel")]
    for i, (op, dims, kernel) in enumerate(ops):
        events += [
            {"ph": "X", "cat": "cpu_op", "name": op, "ts": 10.0 * i + 10, "dur": 5.0, **host,
             "args": {"Input Dims": dims, "Input type": ["float"] * len(dims)}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 10.0 * i + 11, "dur": 1.0, **host,
             "args": {"correlation": i + 1}}]
        events.append(launchless := {"ph": "X", "cat": "kernel", "name": kernel, "ts": 10.0 * i + 13, "dur": 2.0,
                                     "pid": 0, "tid": 7, "args": {"correlation": i + 1, "device": 0, "stream": 7,
                                                                  "grid": [4, 1, 1], "block": [128, 1, 1]}})
    for i, (kernel, grid) in enumerate([("mul_kernel", [4, 1, 1]), ("relu_kernel", [4, 1, 1]),
                                        ("relu_kernel", [8, 1, 1]), ("mul_kernel", [4, 1, 1])]):
        events.append({**launchless, "name": kernel, "ts": 2.0 * i, "dur": 1.0,
                       "args": {**launchless["args"], "correlation": 100 + i, "grid": grid}})
    run = tmp_path / "run"
    tracesql.ingest([write_trace(tmp_path / "t.json", events)], run)
    rows = tracesql.query("cost_coverage", run, per="kernel", top=10)
    assert sorted(zip(rows.name, rows.reason, rows.kernels)) == [
        ("mul_kernel", "identical kernels, different costs", 1), ("relu_kernel", "no launch recorded", 1)]
    costs = tracesql.connect(run).sql(
        "SELECT name, family, flops, bytes, counted, cost_source, device_total_ns FROM op_costs() "
        "WHERE cost_source IN ('identical kernel', 'aligned kernel') ORDER BY op_id").fetchall()
    # mul of 64 × 32 by 1 × 32 fp32: 2,048 FLOPs, 8 KiB + 128 bytes read, 8 KiB written; relu of 64 × 32 fp32:
    # 2,048 FLOPs, 8 KiB read and 8 KiB written
    assert costs == [("aten::mul", "elementwise", 2_048.0, 16_512.0, True, "aligned kernel", 1_000),
                     ("aten::relu", "elementwise", 2_048.0, 16_384.0, True, "identical kernel", 1_000),
                     ("mul_kernel", None, None, None, False, "identical kernel", 1_000)]
    # 10 µs of compute: the launched 6, the first mul and the relu with no launch costed
    assert tracesql.query("cost_coverage", run).costed_pct.iloc[0] == round(100 * 8 / 10, 2)


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
    assert walked(run) == (rank.compute_ns, rank.costed_ns) == (9_765_437, 9_735_758)
    # without the capture trace: 0.77; without the paged attention's cost: 77.86; without aten::arange's: 99.65
    assert rank.costed_pct == 99.7
    assert list(zip(rank.top_uncosted[:1], rank.top_uncosted_ns[:1])) == [("aten::_foreach_copy_", 12_096)]


@pytest.mark.parametrize("trace, compute_ns, costed_ns, pct, index_ns", [
    ("vllm_decode_full", 10_674_517, 10_671_558, 99.97, 2_959),
    ("vllm_prefilldecode_piecewise", 156_008_506, 156_004_867, 100.0, 3_639)])
def test_vllm_graph_replays_costed_through_their_capture_trace(ingested, trace, compute_ns, costed_ns, pct, index_ns):
    """vLLM's MI300X decode (one full graph) and prefill+decode (piecewise graphs): with their capture traces the
    replayed kernels have their capture ops, the MoE a cost from the buffers its capture allocated
    (test_serving_costs.py), aiter's CK RMS norms theirs (25.04 / 17.40 % before). What stays uncosted is one
    aten::index, whose indices (a list of optional tensors) are recorded without shapes."""
    run = ingested(corpus_path("tracelens", "tests", "traces", "inference", trace))
    rank = tracesql.query("cost_coverage", run).iloc[0]
    assert walked(run) == (rank.compute_ns, rank.costed_ns) == (compute_ns, costed_ns)
    assert rank.costed_pct == pct
    rows = tracesql.query("cost_coverage", run, per="kernel", top=1000)
    assert list(zip(rows.name, rows.reason, rows.kernels, rows.uncosted_ns)) == [
        ("aten::index", "shapes not recorded", 1, index_ns)]
    assert tracesql.connect(run).sql("SELECT DISTINCT input_types FROM ops WHERE name = 'aten::index'").fetchall() == [
        (["c10::BFloat16", ""],)]


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
