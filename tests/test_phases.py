"""Training phases (issue 14): forward->backward links, annotations projected over every thread of the process with
self and child time, `phases` per rank and step, `modules` per nn.Module, `launch` on traces without steps.

Numbers are checked against a second computation from the raw trace events (json + pandas), on real traces: the
bundled HTA nccl_parser_config (DDP training on an A100: '## forward/backward/optimizer ##' annotations, backward on
the autograd thread, 543 fwdbwd flows) and, when the corpus is there, more real traces."""

from __future__ import annotations

import json
import math
import shutil
from collections import defaultdict
from decimal import ROUND_HALF_EVEN, Decimal

import pandas as pd
import pyarrow.parquet as pq
import pytest

import tracesql
from conftest import DATASETS, corpus_path, raw_events, write_trace

NCCL = DATASETS / "hta_nccl_parser_config"
NCCL_FILE = NCCL / "nccl_data.json.gz"
VLLM = DATASETS / "tracelens_vllm_graph_execution"
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def ns(us: float) -> int:
    """Kineto µs as the reader turns them into ns: whole µs, and the fraction rounded half to even."""
    whole = math.floor(us)
    return whole * 1000 + int(Decimal(repr((us - whole) * 1000)).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def sql(run, query: str) -> list[tuple]:
    return tracesql.connect(run).execute(query).fetchall()


@pytest.fixture(scope="module")
def nccl_events():
    return raw_events(NCCL_FILE)


def launched(events: list[dict]) -> list[tuple[dict, dict]]:
    """(device event, the runtime call that launched it) by correlation id, from the raw events."""
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    return [(e, calls[e["args"]["correlation"]]) for e in events
            if e.get("cat") in DEVICE_CATS and e["args"].get("correlation") in calls]


# ---------------------------------------------------------------------------------------------- fwd -> bwd links

def test_backward_ops_link_to_their_forward_op_by_fwdbwd_flows(ingested, nccl_events):
    run = ingested(NCCL)
    links = sql(run, """
        SELECT b.name, b.ts, b.tid, f.name, f.ts, f.tid, b.sequence_number, f.sequence_number
        FROM ops b JOIN ops f ON f.rank = b.rank AND f.op_id = b.fwd_op_id""")
    assert len(links) == 543
    # second method: each flow's start and end, and the ops starting there on their threads, from the raw JSON
    ops = defaultdict(list)
    for e in nccl_events:
        if e.get("cat") == "cpu_op":
            ops[(e["tid"], ns(e["ts"]))].append(e)
    ends = defaultdict(dict)
    for e in nccl_events:
        if e.get("cat") == "fwdbwd":
            ends[e["id"]][e["ph"]] = e
    expected = set()
    for flow in ends.values():
        fwd = min(ops[(flow["s"]["tid"], ns(flow["s"]["ts"]))], key=lambda e: e["dur"])  # the innermost
        bwd = min(ops[(flow["f"]["tid"], ns(flow["f"]["ts"]))], key=lambda e: e["dur"])
        expected.add((bwd["name"], ns(bwd["ts"]), bwd["tid"], fwd["name"], ns(fwd["ts"]), fwd["tid"]))
    base = sql(run, "SELECT base_time_ns FROM ranks")[0][0]
    assert {(b, bts - base, btid, f, fts - base, ftid) for b, bts, btid, f, fts, ftid, *_ in links} == expected
    # what the links mean: the autograd node's backward op (autograd thread) and its forward op (main thread)
    # carry the same autograd sequence number
    assert all(b_seq == f_seq for *_, b_seq, f_seq in links)
    assert {(tid_b, tid_f) for _, _, tid_b, _, _, tid_f, _, _ in links} == {(2919752, 2910249)}
    assert ("AddmmBackward0", "aten::addmm") in {(b, f) for b, _, _, f, *_ in links}


def test_fwd_op_id_is_null_without_flows_and_in_runs_of_an_older_schema(ingested, tmp_path):
    assert sql(ingested(DATASETS / "hta_trace_filter"), "SELECT count(fwd_op_id), count(*) > 0 FROM ops") == [(0, True)]
    run = tmp_path / "v3"
    shutil.copytree(ingested(NCCL), run)
    for part in (run / "ops").glob("*.parquet"):  # as schema version 3 wrote it: no fwd_op_id
        table = pq.read_table(part)
        pq.write_table(table.drop_columns(["fwd_op_id"]), part)
    manifest = json.loads((run / "tracesql.json").read_text())
    (run / "tracesql.json").write_text(json.dumps({**manifest, "schema_version": 3}))
    with pytest.warns(tracesql.errors.OlderSchemaWarning):
        con = tracesql.connect(run)
    assert con.execute("SELECT count(*), count(fwd_op_id), count(sequence_number) FROM ops").fetchall() == \
        [(14346, 0, 2286)]
    assert [r[0] for r in con.execute("DESCRIBE ops").fetchall()] == tracesql.schema.TABLES["ops"].column_names
    with pytest.warns(tracesql.errors.OlderSchemaWarning):
        df = host_rows(tracesql.query("annotations", run))  # the queries run on it
    assert df.loc["## backward ##", "kernels"] == 2391


# ---------------------------------------------------------------------------------------------- annotations

def host_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The annotations query's host rows, by name."""
    return df[df.source == "host"].set_index("name")


def annotation_expectation(events: list[dict], name: str, same_thread: bool) -> tuple[int, int, int]:
    """(kernels, device ns, device ns launched from other threads) under the ranges called `name`, computed from
    the raw events: launches (by correlation) that started inside a range, from its process (or thread)."""
    pairs = launched(events)
    kernels = device = other = 0
    for a in (e for e in events if e.get("cat") == "user_annotation" and e["name"] == name):
        start, end = ns(a["ts"]), ns(a["ts"]) + ns(a["dur"])
        for k, call in pairs:
            if call["pid"] == a["pid"] and (not same_thread or call["tid"] == a["tid"]) and \
                    start <= ns(call["ts"]) < end:
                kernels += 1
                device += ns(k["dur"])
                other += ns(k["dur"]) if call["tid"] != a["tid"] else 0
    return kernels, device, other


def test_backward_annotation_holds_the_autograd_threads_kernels(ingested, nccl_events):
    """The issue's example: '## backward ##' on the main thread, backward kernels launched by the autograd thread."""
    run = ingested(NCCL)
    process = host_rows(tracesql.query("annotations", run))
    thread = host_rows(tracesql.query("annotations", run, projection="thread"))
    bwd = process.loc["## backward ##"]
    assert bwd.projection == "process" and (bwd.kernels, bwd.device_ns) == (2391, 124_339_538)
    assert round(bwd.device_ns / 1e6, 2) == 124.34
    assert (bwd.kernels, bwd.device_ns, bwd.other_thread_ns) == annotation_expectation(nccl_events, "## backward ##",
                                                                                        same_thread=False)
    old = thread.loc["## backward ##"]  # the NVTX-style rule: the 18 kernels the main thread launched
    assert old.projection == "thread" and (old.kernels, old.device_ns, old.other_thread_ns) == (18, 57_312, 0)
    assert (old.kernels, old.device_ns, 0) == annotation_expectation(nccl_events, "## backward ##", same_thread=True)
    assert bwd.other_thread_ns == bwd.device_ns - old.device_ns
    # forward and the optimizer run on the main thread: the two rules agree
    for name in ("## forward ##", "## optimizer ##", "DistributedDataParallel.forward"):
        assert process.loc[name, ["kernels", "device_ns", "device_span_ns"]].tolist() == \
            thread.loc[name, ["kernels", "device_ns", "device_span_ns"]].tolist()
        assert process.loc[name, "kernels"] == annotation_expectation(nccl_events, name, same_thread=True)[0]


def test_self_and_child_device_time_of_nested_annotations(ingested, nccl_events):
    """'## forward ##' holds 'DistributedDataParallel.forward', which holds the 'nccl:broadcast' ranges: the outer
    range's time is all child time, the middle one's self time is what the broadcasts do not hold."""
    df = host_rows(tracesql.query("annotations", ingested(NCCL)))
    fwd, ddp, bcast = df.loc["## forward ##"], df.loc["DistributedDataParallel.forward"], df.loc["nccl:broadcast"]
    assert (fwd.self_device_ns, fwd.child_device_ns) == (0, fwd.device_ns)
    assert ddp.child_device_ns == bcast.device_ns == 114_334 and ddp.self_device_ns == ddp.device_ns - 114_334
    assert (df.self_device_ns + df.child_device_ns == df.device_ns).all()
    # second method: kernels under DDP.forward minus those under a broadcast nested in it
    _, outer, _ = annotation_expectation(nccl_events, "DistributedDataParallel.forward", same_thread=True)
    _, inner, _ = annotation_expectation(nccl_events, "nccl:broadcast", same_thread=True)
    assert (ddp.device_ns, ddp.self_device_ns) == (outer, outer - inner)
    opt, step = df.loc["## optimizer ##"], df.loc["Optimizer.step#SGD.step"]
    assert (opt.child_device_ns, step.self_device_ns) == (opt.device_ns, step.device_ns) == (2_078_278,) * 2


def test_annotation_span_per_instance(ingested, nccl_events):
    df = host_rows(tracesql.query("annotations", ingested(NCCL)))
    pairs = launched(nccl_events)
    span = 0
    for a in (e for e in nccl_events if e.get("cat") == "user_annotation" and e["name"] == "## backward ##"):
        inside = [k for k, call in pairs if call["pid"] == a["pid"] and ns(a["ts"]) <= ns(call["ts"]) < ns(a["ts"]) + ns(a["dur"])]
        span += max(ns(k["ts"]) + ns(k["dur"]) for k in inside) - min(ns(k["ts"]) for k in inside)
    assert df.loc["## backward ##", "device_span_ns"] == span


def test_projection_parameter_is_checked(ingested):
    with pytest.raises(tracesql.TraceError, match="projection"):
        tracesql.query("annotations", ingested(NCCL), projection="stream")


# ---------------------------------------------------------------------------------------------- launch

def test_launch_has_one_row_per_step_and_one_for_the_rank(ingested, nccl_events):
    df = tracesql.query("launch", ingested(NCCL))
    assert df.step.isna().sum() == 1 and sorted(df.step.dropna().astype(int)) == [4, 5, 6]
    whole = df[df.step.isna()].iloc[0]
    assert whole.launches == len(launched(nccl_events)) == df.launches[df.step.notna()].sum()


def test_launch_on_a_trace_without_steps_is_one_row_per_rank(ingested):
    """vLLM decode replaying a HIP graph: no ProfilerStep; the rank's row once (the old query repeated it 8 times)."""
    run = ingested(VLLM)
    assert sql(run, "SELECT count(*) FROM steps") == [(0,)]
    df = tracesql.query("launch", run)
    assert len(df) == 1 and pd.isna(df.step.iloc[0])
    assert df.launches.iloc[0] == sql(run, "SELECT count(*) FROM slices WHERE kind IN ('kernel', 'memcpy', "
                                           "'memset') AND launch_id IS NOT NULL")[0][0]
