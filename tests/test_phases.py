"""Training phases (issue 14): forward->backward links, annotations projected over every thread of the process with
self and child time, `phases` per rank and step, `modules` per nn.Module, `launch` on traces without steps.

Numbers are checked against a second computation from the raw trace events (json + pandas), on real traces: the
bundled HTA nccl_parser_config (DDP training on an A100: '## forward/backward/optimizer ##' annotations, backward on
the autograd thread, 543 fwdbwd flows) and, when the corpus is there, more real traces."""

from __future__ import annotations

import bisect
import json
import math
import shutil
import statistics
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


def test_without_flows_backward_ops_link_by_sequence_number(ingested):
    """The rule PyTorch writes the flows by (same autograd sequence number, latest forward op before): on a trace
    with flows it finds exactly the flows' links; HTA's trace_filter ranks have no flows and get links from it."""
    from tracesql.normalize import SEQUENCE_LINKS_SQL

    con = tracesql.connect(ingested(NCCL))
    by_rule = set(con.execute(f"SELECT slice_id, fwd_slice_id FROM ({SEQUENCE_LINKS_SQL})").fetchall())
    assert by_rule == set(con.execute("SELECT op_id, fwd_op_id FROM ops WHERE fwd_op_id IS NOT NULL").fetchall())
    assert len(by_rule) == 543
    rows = sql(ingested(DATASETS / "hta_trace_filter"), """
        SELECT b.rank, count(*), count(*) FILTER (WHERE b.sequence_number = f.sequence_number AND f.ts <= b.ts
                                                  AND b.tid <> f.tid AND COALESCE(f.fwd_thread_id, 0) = 0)
        FROM ops b JOIN ops f ON f.rank = b.rank AND f.op_id = b.fwd_op_id GROUP BY 1 ORDER BY 1""")
    assert rows == [(0, 91, 91), (1, 87, 87)]  # a sampled trace: most forward ops were filtered out


def test_fwd_op_id_in_runs_of_an_older_schema_reads_as_null(ingested, tmp_path):
    run = tmp_path / "v3"
    shutil.copytree(ingested(NCCL), run)
    for part in (run / "ops").glob("*.parquet"):  # as schema version 3 wrote it: no fwd_op_id
        table = pq.read_table(part)
        pq.write_table(table.drop_columns(["fwd_op_id"]), part)
    manifest = json.loads((run / "tracesql.json").read_text())
    manifest.pop("files", None)  # schema version 3 recorded no file list
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


def no_step_trace(tmp_path):
    """A crafted trace without steps: the main thread's '## forward ##' launches two kernels, an autograd thread
    (it runs a backward op) launches one, then an NCCL kernel; µs: forward 10-20 and 15-25 (overlapping streams),
    backward 30-40, all-reduce 35-50 (5 µs hidden under backward), idle 25-30."""
    main, autograd = dict(pid=1, tid=1), dict(pid=1, tid=2)
    events = [{"ph": "X", "cat": "user_annotation", "name": "## forward ##", "ts": 0.0, "dur": 5.0, **main},
              {"ph": "X", "cat": "cpu_op", "name": "MmBackward0", "ts": 6.0, "dur": 3.0, **autograd,
               "args": {"Sequence number": 7, "Fwd thread id": 1}}]
    kernels = [(1.0, main, "gemm", 10.0, 10.0, 7), (2.0, main, "relu", 15.0, 10.0, 8),
               (7.0, autograd, "gemm_bwd", 30.0, 10.0, 7), (8.0, main, "ncclDevKernel_AllReduce", 35.0, 15.0, 9)]
    for i, (launch, where, name, ts, dur, stream) in enumerate(kernels):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": launch, "dur": 0.5,
                       **where, "args": {"correlation": i + 1}})
        events.append({"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream,
                       "args": {"correlation": i + 1, "device": 0, "stream": stream}})
    run = tmp_path / "run"
    tracesql.ingest([write_trace(tmp_path / "t.json", events)], run)
    assert sql(run, "SELECT count(*) FROM steps") == [(0,)]
    return run


def test_launch_on_a_trace_without_steps_is_one_row_per_rank(tmp_path):
    """No steps: the rank's row once (the previous query repeated it 8 times: 2 x 2 x 2 NULL-step groups joined)."""
    df = tracesql.query("launch", no_step_trace(tmp_path))
    assert len(df) == 1 and pd.isna(df.step.iloc[0])
    row = df.iloc[0]
    assert (row.launches, row.calls, row.delay_max_ns) == (4, 4, 27_000)  # the all-reduce: launched at 8, ran at 35
    assert row.delay_p50_ns == statistics.median([9_000, 13_000, 23_000, 27_000])


def test_range_bounds_nesting_and_threads(tmp_path):
    """A crafted trace: a launch at a range's start is inside it, one at its end is not; a range holds the launches
    of another thread of its process only under projection 'process'; another process's never."""
    main, worker, other = dict(pid=1, tid=1), dict(pid=1, tid=2), dict(pid=2, tid=3)
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "outer", "ts": 100.0, "dur": 100.0, **main},
        {"ph": "X", "cat": "user_annotation", "name": "inner", "ts": 120.0, "dur": 30.0, **main},
    ]
    launches = [(100.0, main, 1.0), (130.0, main, 2.0), (150.0, main, 4.0), (200.0, main, 8.0),
                (160.0, worker, 16.0), (160.0, other, 32.0)]
    for i, (ts, where, dur) in enumerate(launches):
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 0.5,
                       **where, "args": {"correlation": i + 1}})
        events.append({"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": 300.0 + 50 * i, "dur": dur, "pid": 0,
                       "tid": 7, "args": {"correlation": i + 1, "device": 0, "stream": 7}})
    run = tmp_path / "run"
    tracesql.ingest([write_trace(tmp_path / "t.json", events)], run)
    process = host_rows(tracesql.query("annotations", run))
    thread = host_rows(tracesql.query("annotations", run, projection="thread"))
    # outer: k0 (at its start), k1 (inside inner), k2 (at inner's end: outer's self), k4 (worker thread); not k3
    # (at outer's end) nor k5 (another process)
    assert process.loc["outer", ["kernels", "device_ns", "self_device_ns", "child_device_ns", "other_thread_ns"]] \
        .tolist() == [4, 23_000, 21_000, 2_000, 16_000]
    assert thread.loc["outer", ["kernels", "device_ns", "self_device_ns", "other_thread_ns"]].tolist() == \
        [3, 7_000, 5_000, 0]
    assert process.loc["inner", ["kernels", "device_ns", "device_span_ns"]].tolist() == [1, 2_000, 2_000]
    assert thread.loc["inner", "device_ns"] == 2_000


# ---------------------------------------------------------------------------------------------- phases

PHASES = ["forward_ns", "backward_ns", "optimizer_ns", "data_loading_ns", "exposed_communication_ns", "other_ns",
          "idle_ns"]


def exclusive_times(window: tuple[int, int], intervals: dict[str, list[tuple[int, int]]]) -> dict[str, int]:
    """The window cut at every interval edge; each piece goes to the first label (in dict order) running then,
    else 'idle'. A sweep written apart from the query's, in plain Python: each label's intervals merged, each
    piece looked up by bisection."""
    start, end = window
    cuts = {start, end}
    merged = {}
    for label, spans in intervals.items():
        union: list[list[int]] = []
        for a, b in sorted((max(a, start), min(b, end)) for a, b in spans if a < end and b > start):
            if union and a <= union[-1][1]:
                union[-1][1] = max(union[-1][1], b)
            else:
                union.append([a, b])
        merged[label] = ([a for a, _ in union], [b for _, b in union])
        for a, b in union:
            cuts.update((a, b))
    cuts = sorted(cuts)
    out = dict.fromkeys([*intervals, "idle"], 0)
    for a, b in zip(cuts, cuts[1:]):
        label = "idle"
        for lb, (starts, ends) in merged.items():
            i = bisect.bisect_right(starts, a) - 1
            if i >= 0 and a < ends[i]:
                label = lb
                break
        out[label] += b - a
    return out


def test_phases_of_each_step_match_a_sweep_of_the_raw_trace(ingested, nccl_events):
    """nccl_parser_config: forward/backward/optimizer from the '## ... ##' annotations and the autograd thread, every
    instant of each step's device window given to one phase, recomputed from the raw JSON."""
    run = ingested(NCCL)
    df = tracesql.query("phases", run).set_index("step")
    base = sql(run, "SELECT base_time_ns FROM ranks")[0][0]
    ranges = {name: [(ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in nccl_events
                     if e.get("cat") == "user_annotation" and e["name"] == name]
              for name in ("## forward ##", "## backward ##", "## optimizer ##", "Optimizer.zero_grad#SGD.zero_grad")}
    autograd = {e["tid"] for e in nccl_events if e.get("name", "").startswith("autograd::engine::evaluate_function")}
    assert autograd == {2919752}
    labels = defaultdict(list)
    counts = defaultdict(int)
    for k, call in launched(nccl_events):
        t = ns(call["ts"])
        within = {name for name, spans in ranges.items() if any(a <= t < b for a, b in spans)}
        if "nccl" in k["name"].lower():
            label = "communication"
        elif "## backward ##" in within or call["tid"] in autograd:
            label = "backward"
        elif within & {"## optimizer ##", "Optimizer.zero_grad#SGD.zero_grad"}:
            label = "optimizer"
        elif "## forward ##" in within:
            label = "forward"
        else:
            label = "other"
        labels[label].append((ns(k["ts"]), ns(k["ts"]) + ns(k["dur"])))
    steps = [e for e in nccl_events if e.get("name", "").startswith("ProfilerStep#")]
    assert sorted(df.index) == [4, 5, 6]
    # each step's device window (docs/concepts/steps.md): from its first kernel to the next step's first, the last
    # step to the last end of any step's kernels
    firsts, last_end = {}, 0
    for step in steps:
        number, s0, s1 = int(step["name"].split("#")[1]), ns(step["ts"]), ns(step["ts"]) + ns(step["dur"])
        mine = [(ns(k["ts"]), ns(k["ts"]) + ns(k["dur"])) for k, call in launched(nccl_events) if s0 <= ns(call["ts"]) <= s1]
        firsts[number], last_end = min(a for a, _ in mine), max(last_end, max(b for _, b in mine))
    order = sorted(firsts, key=firsts.get)
    windows = {n: (firsts[n], firsts[after] if after else last_end) for n, after in zip(order, order[1:] + [None])}
    for step in steps:
        number = int(step["name"].split("#")[1])
        window = windows[number]
        ordered = {lb: labels[lb] for lb in ("forward", "backward", "optimizer", "other", "communication")}
        want = exclusive_times(window, ordered)
        row = df.loc[number]
        assert row.window_ns == window[1] - window[0] == sql(run, f"SELECT device_dur FROM steps WHERE step = {number}")[0][0]
        assert (row.forward_ns, row.backward_ns, row.optimizer_ns, row.other_ns, row.exposed_communication_ns,
                row.idle_ns) == (want["forward"], want["backward"], want["optimizer"], want["other"],
                                 want["communication"], want["idle"])
        assert row.data_loading_ns == 0 and row[PHASES].sum() == row.window_ns
        comm = exclusive_times(window, {"communication": labels["communication"]})["communication"]
        assert row.communication_ns == comm
    assert df.backward_ns.min() > 25_000_000 and df.forward_ns.min() > 12_000_000  # the example is not vacuous
    assert (df.forward_kernels == 450).all() and (df.backward_kernels == 792).all() and (df.optimizer_kernels == 9).all()
    del base


@pytest.mark.parametrize("source", ["hta_trace_filter", "hta_nccl_parser_config", "tracelens_b200_eager",
                                    "tracelens_vllm_graph_execution", "torch_gloo_2rank", "jax_cpu_mlp"])
def test_phases_add_up_to_the_device_window_on_bundled_traces(ingested, source):
    check_phases_add_up(ingested(DATASETS / source))


@pytest.mark.corpus
@pytest.mark.parametrize("path", [
    "hta/tests/data/df_index_resolver/df_index_resolver.json.gz",
    "tracelens/tests/traces/mi300/resnet_act_checkpoint.json.gz",
    "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "hta/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "tracelens/tests/traces/inference/sglang_decode/sglang_Qwen3-8B_decode.json.gz",
])
def test_phases_add_up_to_the_device_window_on_corpus_traces(ingested, path):
    check_phases_add_up(ingested(corpus_path(path)))


def check_phases_add_up(run):
    df = tracesql.query("phases", run)
    con = tracesql.connect(run)
    has_device = con.execute("SELECT count(*) FROM slices WHERE kind IN ('kernel', 'memcpy', 'memset')").fetchone()[0]
    assert (len(df) > 0) == (has_device > 0)
    assert (df[PHASES] >= 0).all().all() and (df[PHASES].sum(axis=1) == df.window_ns).all()
    assert (df.communication_ns >= df.exposed_communication_ns).all()
    steps = dict(con.execute("SELECT rank || '/' || step, device_dur FROM steps WHERE device_dur IS NOT NULL").fetchall())
    if steps:
        assert {f"{r}/{s}": w for r, s, w in zip(df["rank"], df.step, df.window_ns)} == steps
    else:  # one window per rank: its first to last device event
        spans = dict(con.execute("SELECT rank, max(ts + dur) - min(ts) FROM slices WHERE kind IN ('kernel', "
                                 "'memcpy', 'memset') GROUP BY rank").fetchall())
        assert df.step.isna().all() and dict(zip(df["rank"], df.window_ns)) == spans


def test_phases_without_steps_cover_the_rank(tmp_path):
    """No steps: one row per rank over its whole device time, every phase worked out by hand."""
    df = tracesql.query("phases", no_step_trace(tmp_path))
    assert len(df) == 1 and pd.isna(df.step.iloc[0])
    row = df.iloc[0]
    assert row.window_ns == 40_000  # 10 µs to 50 µs
    assert (row.forward_ns, row.backward_ns, row.exposed_communication_ns, row.idle_ns, row.other_ns) == \
        (15_000, 10_000, 10_000, 5_000, 0)
    assert (row.communication_ns, row.forward_kernels, row.backward_kernels) == (15_000, 2, 1)
    assert row.busy_share == pytest.approx(35 / 40)


# ---------------------------------------------------------------------------------------------- modules

QWEN = "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"


@pytest.mark.corpus
def test_decoder_layer_device_time_from_the_module_stack(ingested):
    """Qwen1.5-0.5B on an H100 (with_stack): one decoder layer's call ≈ 1.32 ms of device time; every instance's
    kernels recomputed from the raw JSON (launches from the layer's thread while its 'nn.Module' range ran)."""
    path = corpus_path(QWEN)
    run = ingested(path)
    events = raw_events(path)
    pairs = launched(events)
    per_instance = {}
    for m in (e for e in events if e.get("name", "").startswith("nn.Module: Qwen2DecoderLayer_")):
        start, end = ns(m["ts"]), ns(m["ts"]) + ns(m["dur"])
        inside = [k for k, call in pairs if call["tid"] == m["tid"] and start <= ns(call["ts"]) < end]
        per_instance[m["name"][len("nn.Module: "):]] = (len(inside), sum(ns(k["dur"]) for k in inside))
    assert len(per_instance) == 24
    instances = tracesql.query("modules", run, per="instance", top=1000).set_index("module")
    layers = instances[instances.module_type == "Qwen2DecoderLayer"]
    assert {name: (row.kernels, row.device_ns) for name, row in layers.iterrows()} == per_instance
    types = tracesql.query("modules", run).set_index("module")
    layer = types.loc["Qwen2DecoderLayer"]
    assert (layer.calls, layer.instances, layer.module_depth) == (24, 24, 1)
    assert layer.device_ns == sum(d for _, d in per_instance.values())
    assert layer.device_mean_ns == pytest.approx(1.32e6, rel=0.01)
    step = sql(run, "SELECT device_dur FROM steps")[0][0]
    assert layer.step_share == pytest.approx(layer.device_ns / step)


@pytest.mark.corpus
def test_module_types_add_their_instances_and_self_time_adds_up(ingested):
    run = ingested(corpus_path(QWEN))
    types = tracesql.query("modules", run, top=1000).set_index("module")
    instances = tracesql.query("modules", run, per="instance", top=1000)
    summed = instances.groupby("module_type")[["calls", "kernels", "device_ns", "self_device_ns", "host_ns"]].sum()
    assert (summed.loc[types.index] == types[summed.columns]).all().all()
    # every module call runs inside the model's: the self times of all modules are the model's device time, once
    assert types.self_device_ns.sum() == types.loc["Qwen2Model", "device_ns"]
    assert (types.loc[["Linear", "SiLU", "Qwen2RMSNorm"], "self_device_ns"] ==
            types.loc[["Linear", "SiLU", "Qwen2RMSNorm"], "device_ns"]).all()  # leaves


def test_module_types_from_the_raw_module_stack_of_a_bundled_trace(ingested):
    """GPT-OSS on a B200 (bundled, with_stack): each module type's calls, kernels and device time recomputed from the
    raw JSON's 'nn.Module: X_N' ranges and the launches of their thread."""
    path = next((DATASETS / "tracelens_b200_eager").glob("*.json.gz"))
    events = raw_events(path)
    pairs = launched(events)
    by_thread = defaultdict(list)
    for k, call in pairs:
        by_thread[call["tid"]].append((ns(call["ts"]), ns(k["dur"])))
    expected = defaultdict(lambda: [0, 0, 0])
    for m in (e for e in events if e.get("name", "").startswith("nn.Module: ")):
        start, end = ns(m["ts"]), ns(m["ts"]) + ns(m["dur"])
        inside = [d for t, d in by_thread[m["tid"]] if start <= t < end]
        kind = m["name"][len("nn.Module: "):].rsplit("_", 1)[0]
        expected[kind][0] += 1
        expected[kind][1] += len(inside)
        expected[kind][2] += sum(inside)
    df = tracesql.query("modules", ingested(DATASETS / "tracelens_b200_eager"), top=1000).set_index("module")
    assert {name: [r.calls, r.kernels, r.device_ns] for name, r in df.iterrows()} == dict(expected)
    assert df.loc["TransformerBlock", "calls"] == 36 and df.loc["GptOssForCausalLM", "module_depth"] == 0


def test_modules_need_the_module_stack(ingested):
    assert tracesql.query("modules", ingested(NCCL)).empty
