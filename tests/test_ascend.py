"""torch_npu (Ascend NPU) profiler exports: a real 2-rank export (MindStudio Insight's test data) read as NPU
devices, kernels, HCCL collectives and CANN launches; overlap checked against torch_npu's own step_trace_time.csv
and against plain Python over trace_view.json."""

from __future__ import annotations

import csv
import gzip
import json
from decimal import Decimal

import pandas as pd
import pytest

import tracesql
from conftest import DATASETS, write_trace
from tracesql.readers import ascend, is_companion, reader_for

EXPORT = DATASETS / "torch_npu_ascend_2rank"
COMPUTE = ascend._COMPUTE_TASKS


@pytest.fixture(scope="module")
def run(ingested):
    out = ingested(EXPORT)
    sources = json.loads((out / "tracesql.json").read_text())["sources"]
    assert sorted(sources) == [f"rank{r}_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json.gz" for r in (0, 1)]
    return out


def events(rank: int) -> list[dict]:
    path = EXPORT / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json.gz"
    return json.loads(gzip.decompress(path.read_bytes()))


def step_trace_time(rank: int) -> dict:
    path = EXPORT / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "step_trace_time.csv"
    return next(csv.DictReader(path.open()))


def ns(value) -> int:
    """µs (number or text) -> ns, to the nearest (device times carry fractions of a ns)."""
    return round(Decimal(str(value)) * 1000)


def union(intervals) -> list[list[int]]:
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(intervals) -> int:
    return sum(e - s for s, e in intervals)


def intersection(a, b) -> int:
    i = j = t = 0
    while i < len(a) and j < len(b):
        t += max(0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return t


def by_hand(rank: int) -> dict:
    """Second method, from trace_view.json alone: computing = the union of the Ascend Hardware compute tasks,
    communication = the union of the HCCL operations (threads 'Group N Communication')."""
    ev = events(rank)
    name = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    thread = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "thread_name"}
    x = [e for e in ev if e.get("ph") == "X"]
    comp = union((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in x if name.get(e["pid"]) == "Ascend Hardware"
                 and e["args"].get("Task Type") in COMPUTE)
    comm = union((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in x if name.get(e["pid"]) == "HCCL"
                 and thread.get((e["pid"], e["tid"]), "").endswith("Communication"))
    overlap = intersection(comm, comp)
    return {"compute_ns": length(comp), "comm_ns": length(comm), "overlap_ns": overlap,
            "exposed_comm_ns": length(comm) - overlap}


def test_detected_and_companions_skipped():
    out = EXPORT / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    assert reader_for(out / "trace_view.json.gz") is ascend
    assert is_companion(out / "communication.json") and is_companion(EXPORT / "rank0_ascend_pt" / "profiler_info_0.json")
    assert not is_companion(DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz")
    # a whole export folder also holds msprof's own JSON timeline of the same events: not a second trace
    raw = EXPORT / "rank0_ascend_pt" / "PROF_000001_20250109_abc" / "mindstudio_profiler_output" / "msprof_1.json"
    assert is_companion(raw) and not is_companion(out / "trace_view.json")


def test_ranks_devices_groups(run):
    con = tracesql.connect(run)
    ranks = con.sql("SELECT rank, source_format, backend FROM ranks ORDER BY rank").fetchall()
    assert ranks == [(0, "torch_npu", "hccl"), (1, "torch_npu", "hccl")]
    # the device id is in the device processes' pid (pid & 31): rank 1 ran on NPU 1
    assert con.sql("SELECT rank, device_id FROM devices ORDER BY rank").fetchall() == [(0, 0), (1, 1)]
    assert con.sql("SELECT DISTINCT group_size, group_ranks FROM process_groups").fetchall() == [(8, list(range(8)))]
    kinds = dict(con.sql("SELECT kind || '/' || category, count(*) FROM slices WHERE rank = 0 GROUP BY 1").fetchall())
    assert kinds["kernel/ascend_hardware"] == 187 and kinds["kernel/hccl"] == 4 and kinds["memcpy/ascend_hardware"] == 24
    assert kinds["runtime/cann_acl"] == 512 and kinds["runtime/cann_node"] == 191
    # every device task is linked to what launched it: the op's torch_to_npu flow, else its CANN call
    unlinked = con.sql("SELECT count(*) FROM slices WHERE kind IN ('kernel', 'memcpy') AND launch_id IS NULL")
    assert unlinked.fetchall()[0][0] == 0
    via_cann = con.sql("""SELECT count(*) FROM slices d JOIN slices l ON l.rank = d.rank AND l.slice_id = d.launch_id
                          WHERE d.kind IN ('kernel', 'memcpy', 'sync') AND starts_with(l.category, 'cann_')""")
    assert via_cann.fetchall()[0][0] > 0
    # kernel_details.csv adds shapes to the tasks it lists
    shaped = con.sql("SELECT count(*) FROM slices WHERE rank = 0 AND category = 'ascend_hardware' AND kind = 'kernel' "
                     "AND json_extract_string(args, '$.\"Input Shapes\"') <> ''").fetchall()[0][0]
    details = EXPORT / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv"
    rows = [r for r in csv.DictReader(details.open()) if r["Accelerator Core"] != "HCCL"]
    assert shaped == sum(r["Input Shapes"] not in ("", "N/A") for r in rows) == 174
    assert con.sql("SELECT count(*) FROM counters WHERE name = 'AI Core Freq'").fetchall()[0][0] > 0
    steps = con.sql("SELECT rank, step, rule FROM steps ORDER BY rank").fetchall()
    assert steps == [(0, 50, "profiler_step"), (1, 50, "profiler_step")]


@pytest.mark.parametrize("rank", [0, 1])
def test_overlap_equals_torch_npus_step_trace_time_and_an_independent_count(run, rank):
    row = tracesql.query("overlap", run).set_index("rank").loc[rank]
    hand = by_hand(rank)
    for col, value in hand.items():
        assert row[col] == value, col
    ref = step_trace_time(rank)  # µs, as torch_npu's Overlap Analysis computed them
    assert abs(row.comm_ns - float(ref["Communication"]) * 1000) <= 25
    assert abs(row.compute_ns - float(ref["Computing"]) * 1000) <= 25
    assert abs(row.exposed_comm_ns - float(ref["Communication(Not Overlapped)"]) * 1000) <= 25
    assert abs(row.overlap_ns - float(ref["Overlapped"]) * 1000) <= 25
    if rank == 0:
        assert (row.comm_ns, row.compute_ns, row.exposed_comm_ns) == (105_991_878, 8_873_734, 101_963_207)


def test_collectives_and_other_queries(run):
    got = tracesql.query("collectives", run).sort_values("seq")
    assert len(got) == 4 and got.consistent.all() and (got.ranks_seen == 2).all()
    assert set(got.collective) == {"all_reduce"} and set(got.group_size) == {8}
    counts = [e["args"]["count"] for e in events(0) if e.get("ph") == "X" and str(e["name"]).startswith("hcom_")]
    assert list(got.size_bytes) == [4 * c for c in counts]  # FP32
    first = [e for e in events(1) if e.get("ph") == "X" and e["name"] == "hcom_allReduce__586_0_1"][0]
    assert got.duration_ns.iloc[0] == ns(first["dur"])  # the shorter of the two ranks' calls
    tb = tracesql.query("temporal_breakdown", run)
    assert ((tb.compute_ns + tb.exposed_comm_ns + tb.exposed_memory_ns + tb.idle_ns) == tb.window_ns).all()
    hot = tracesql.query("hotspots", run, top=3)
    assert hot[hot.level == "kernel"].name.iloc[0] == "hcom_allReduce__586_0_1"
    assert not tracesql.query("bubbles", run).empty and not tracesql.query("launch", run).empty


def test_a_minimal_export(tmp_path):
    """The reader's rules on a hand-made trace_view.json: device from the pid, task types, the flow link."""
    out = tmp_path / "r_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    host, dev = 100, (100 << 10) | (13 << 5) | 3
    ev = [
        {"ph": "M", "name": "process_name", "pid": host, "tid": 0, "args": {"name": "Python"}},
        {"ph": "M", "name": "process_name", "pid": dev, "tid": 0, "args": {"name": "Ascend Hardware"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": host, "tid": 1, "ts": "1000.000", "dur": 50,
         "args": {"Input Dims": "8,16;\r\n16,4", "Input type": "float;\r\nfloat"}},
        {"ph": "s", "cat": "async_npu", "name": "torch_to_npu", "id": 7, "pid": host, "tid": 1, "ts": "1010.000"},
        {"ph": "f", "cat": "async_npu", "name": "torch_to_npu", "id": 7, "pid": dev, "tid": 2, "ts": "1100.500",
         "bp": "e"},
        {"ph": "X", "name": "MatMul", "pid": dev, "tid": 2, "ts": "1100.500", "dur": 20.25,
         "args": {"Task Type": "AI_CORE", "Physic Stream Id": 2, "Task Id": 1}},
        {"ph": "X", "name": "EVENT_WAIT", "pid": dev, "tid": 2, "ts": "1130.000", "dur": 5,
         "args": {"Task Type": "EVENT_WAIT_SQE", "Physic Stream Id": 2, "Task Id": 2}},
    ]
    (out / "trace_view.json").write_text(json.dumps(ev))
    run = tmp_path / "run"
    tracesql.ingest([tmp_path], run, rank=0)
    con = tracesql.connect(run)
    rows = con.sql("SELECT kind, name, ts, dur, device_id, stream, op_id IS NOT NULL FROM slices "
                   "WHERE device_id IS NOT NULL ORDER BY ts").fetchall()
    assert rows == [("kernel", "MatMul", 1_100_500, 20_250, 3, 2, True), ("sync", "EVENT_WAIT", 1_130_000, 5_000, 3, 2, False)]
    op = con.sql("SELECT name, input_dims, device_total_ns FROM ops").fetchall()
    assert op == [("aten::mm", [[8, 16], [16, 4]], 20_250)]
    launch = tracesql.query("launch", run)
    assert launch.delay_max_ns.iloc[0] == 1_100_500 - 1_010_000  # from the op's dispatch to the task's start


def test_a_lone_surrogate_is_replaced_not_a_traceback(tmp_path):
    """JSON may escape a lone UTF-16 surrogate ("\\ud800"), which no UTF-8 text holds: it becomes U+FFFD (before:
    a UnicodeEncodeError traceback); a pair stays the character it encodes."""
    out = tmp_path / "r_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out / "trace_view.json").write_text('[{"ph":"X","pid":1,"tid":1,"ts":1,"dur":1,"name":"a\\ud800b \\ud834\\udd1e"}]')
    run = tmp_path / "run"
    tracesql.ingest([tmp_path], run, rank=0)
    assert tracesql.connect(run).sql("SELECT name FROM slices").fetchall() == [("a\ufffdb \U0001d11e",)]


def test_an_early_2024_export_whose_tasks_are_all_other_keeps_its_compute(tmp_path):
    """torch_npu 2.1 (January 2024) wrote `Task Type: "Other"` for every device task (aclnnAdd_AddAiCore_Add,
    MEMCPY_ASYNC): operators are computing, as in the export's own Overlap Analysis "Computing" lane (before: classed
    as sync, compute 327.6 µs of the lane's 1.788 ms, idle 89 %)."""
    export = DATASETS / "torch_npu_2024_untyped"
    trace = export / "ASCEND_PROFILER_OUTPUT" / "trace_view.json.gz"
    ev = json.loads(gzip.decompress(trace.read_bytes()))
    name = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    lanes = [e for e in ev if e.get("ph") == "X" and name[e["pid"]] == "Overlap Analysis"]
    computing = union((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])) for e in lanes if e["name"] == "Computing")
    tasks = {e["args"]["Task Type"] for e in ev if e.get("ph") == "X" and name[e["pid"]] == "Ascend Hardware"}
    assert tasks == {"Other", "AI_CPU"}
    run = tmp_path / "run"
    tracesql.ingest([export], run)
    con = tracesql.connect(run)
    kinds = dict(con.sql("SELECT kind, count(*) FROM slices WHERE device_id IS NOT NULL GROUP BY 1").fetchall())
    assert kinds == {"kernel": 274, "memcpy": 2}
    row = tracesql.query("temporal_breakdown", run).iloc[0]
    # the lane writes the two AI_CPU tasks' durations rounded to 0.1 ns (188.148 for 188.14802169799805 µs): 1 ns
    assert length(computing) == 1_788_266 and row.compute_ns == 1_788_267
    assert row.window_ns == computing[-1][1] - computing[0][0] == 11_269_917
    assert row.idle_ns + row.exposed_memory_ns == row.window_ns - row.compute_ns  # torch_npu's "Free", to 1 ns


def memory_csv(rank: int, name: str) -> list[dict]:
    path = EXPORT / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / f"{name}.csv.gz"
    return list(csv.DictReader(gzip.decompress(path.read_bytes()).decode().splitlines()))


def mib(value: str) -> int | None:
    return int(Decimal(value) * 2**20) if value else None


@pytest.mark.parametrize("rank", [0, 1])
def test_memory_equals_torch_npus_memory_files(run, rank):
    """memory_record.csv (profile_memory=True): PTA's peaks are the caching allocator's, GE and APP their own rows,
    npu_module_mem.csv's modules theirs; the op at PTA's peak is operator_memory.csv's (before: no rows, and a note
    asking for profile_memory=True, which was on)."""
    got = tracesql.query("memory", run).query(f"rank == {rank}").set_index("allocator")
    records = memory_csv(rank, "memory_record")
    for component in ("PTA", "GE", "APP"):
        rows = [r for r in records if r["Component"] == component]
        allocated = [mib(r["Total Allocated(MB)"]) for r in rows if r["Total Allocated(MB)"]]
        row = got.loc[component]
        assert row.events == len(rows) and (row.device_type, row.device_id) == ("npu", rank)
        assert row.peak_reserved_bytes == max(mib(r["Total Reserved(MB)"]) for r in rows)
        if component == "APP":  # the process's reservation: no allocated figure
            assert allocated == [] and pd.isna(row.peak_allocated_bytes)
        else:
            assert row.peak_allocated_bytes == max(allocated)
    assert got.loc["PTA"].peak_allocated_bytes == 1_245_688_832  # 1187.9814453125 MiB, both ranks
    peak = min((-mib(r["Total Allocated(MB)"]), ns(r["Timestamp(us)"].strip())) for r in records
               if r["Component"] == "PTA")
    names = {ns(r["Allocation Time(us)"].strip()): r["Name"] for r in memory_csv(rank, "operator_memory")}
    assert got.loc["PTA"].peak_op == names[peak[1]] and got.loc["PTA"].peak_allocated_ts == peak[1]
    modules = {}
    for r in memory_csv(rank, "npu_module_mem"):
        modules[r["Component"]] = max(modules.get(r["Component"], 0), mib(r["Total Reserved(MB)"]))
    assert {a.removeprefix("module "): v for a, v in got.peak_reserved_bytes.items() if a.startswith("module ")} \
        == {m: v for m, v in modules.items() if v}


@pytest.mark.parametrize("rank", [0, 1])
def test_step_window_starts_at_the_first_copy_torch_npus_stage_at_the_first_computing_task(run, rank):
    """The step's device window (docs/concepts/steps.md) starts at its first device event, the input batch's
    MEMCPY_ASYNC; torch_npu's "Stage" (step_trace_time.csv) starts at the first computing task and ends where
    the window does: idle + exposed memory exceed its "Free" by the same gap (4.58 ms on rank 0, 5.28 ms on 1)."""
    row = tracesql.query("temporal_breakdown", run, per="step").set_index("rank").loc[rank]
    con = tracesql.connect(run)
    first_copy, first_kernel = con.sql(
        f"SELECT min(ts) FILTER (WHERE kind = 'memcpy'), min(ts) FILTER (WHERE kind = 'kernel') FROM slices "
        f"WHERE rank = {rank} AND device_id IS NOT NULL AND step = 50").fetchall()[0]
    gap = first_kernel - first_copy
    assert first_copy == con.sql(f"SELECT device_ts FROM steps WHERE rank = {rank}").fetchall()[0][0]
    assert gap == {0: 4_583_391, 1: 5_275_986}[rank]
    ref = step_trace_time(rank)  # Stage: a difference of epoch µs in float64, which are 0.25 µs apart
    assert abs(row.window_ns - gap - float(ref["Stage"]) * 1000) <= 250
    assert abs(row.idle_ns + row.exposed_memory_ns - gap - float(ref["Free"]) * 1000) <= 250
