"""The time-side queries on real traces, each number checked a second way: against HTA 0.5.0's own output
(../shared/corpus/reference/hta/*_hta050.txt) or brute-force Python over the raw trace JSON."""

from __future__ import annotations

import statistics
from collections import defaultdict

import pytest

import tracesql
from conftest import DATASETS, corpus_path, empty_session, raw_events
from test_hta_crosscheck import REFERENCE_SETS

HTA = dict(class_scheme="hta", analysis_window="hta", time_unit_ns=1000)
TRACE_FILTER = DATASETS / "hta_trace_filter"
CATEGORIES = ("host_wait", "kernel_wait", "other")


def reference_idle(text: str) -> dict[tuple, dict]:
    """HTA's get_idle_time_breakdown: (rank, stream, category) -> idle_time (µs), count, min (µs) of its intervals."""
    section = text.split("=== get_idle_time_breakdown", 1)[1].split("=== get_gpu_kernel_breakdown", 1)[0]
    out: dict[tuple, dict] = defaultdict(dict)
    for line in section.splitlines()[1:]:
        f = line.split()
        if len(f) == 6 and f[3] in CATEGORIES:  # idle time table: index rank stream category idle_time ratio
            out[(int(f[1]), int(f[2]), f[3])]["idle_us"] = float(f[4])
        elif len(f) == 11 and f[0] in CATEGORIES:  # interval stats: category rank stream count mean std min ...
            out[(int(f[1]), int(f[2]), f[0])].update(count=float(f[3]), min_us=float(f[6]))
    return {k: v for k, v in out.items() if v.get("count", 0) > 0}


def assert_bubbles_agree_with_hta(run, text: str):
    """HTA's intervals are 'start − previous kernel's end' for every pair of consecutive kernels on a stream; ours
    are gaps > 0 after everything that ran before. They are the same intervals except two cases, both kernel_wait
    in HTA: 0 (back to back after its µs rounding: no gap for us) and negative (kernels overlapping on one
    queue, MTIA: no gap for us). So host_wait and other agree exactly in count and time, and kernel_wait's time
    agrees wherever HTA's shortest interval is ≥ 0, with at most HTA's count."""
    df = tracesql.query("bubbles", run, **HTA)
    ours = {(r.rank, r.stream, r.category): r for r in df.itertuples()}
    for key, ref in reference_idle(text).items():
        mine = ours.get(key)
        if key[2] != "kernel_wait":
            assert mine is not None and mine.gaps == ref["count"] and mine.idle_ns == ref["idle_us"] * 1000, key
        elif ref["min_us"] >= 0:
            assert mine.idle_ns == ref["idle_us"] * 1000 and mine.gaps <= ref["count"], key
        else:  # HTA subtracts the overlaps of kernels on one queue
            assert mine.idle_ns > ref["idle_us"] * 1000, key
    return ours


def test_bubbles_on_trace_filter_are_htas_idle_breakdown(ingested):
    """HTA 0.5.0 printed these per-stream numbers for the bundled trace (the corpus test below compares all)."""
    df = tracesql.query("bubbles", ingested(TRACE_FILTER), **HTA)
    ours = {(r.rank, r.stream, r.category): r for r in df.itertuples()}
    assert (ours[(0, 7, "host_wait")].gaps, ours[(0, 7, "host_wait")].idle_ns) == (82, 213_825_000)
    assert (ours[(0, 7, "kernel_wait")].gaps, ours[(0, 7, "kernel_wait")].idle_ns) == (196, 1_985_000)
    assert (ours[(0, 7, "other")].gaps, ours[(0, 7, "other")].idle_ns) == (247, 261_740_000)
    assert ours[(1, 84, "other")].max_ns == 23_247_000


@pytest.mark.corpus
@pytest.mark.parametrize("name", REFERENCE_SETS)
def test_bubbles_match_hta_reference(name, ingested):
    reference = corpus_path("reference", "hta", f"{name}_hta050.txt").read_text()
    run = ingested(corpus_path("hta", "tests", "data", REFERENCE_SETS[name]))
    assert_bubbles_agree_with_hta(run, reference)


def test_device_gaps_are_the_idle_time_of_the_raw_intervals(ingested):
    """scope 'device': the gaps add up to window − |union of device intervals|, computed here from the JSON."""
    run = ingested(TRACE_FILTER)
    gaps = tracesql.query("bubbles", run, scope="device").groupby("rank").idle_ns.sum()
    for rank in (0, 1):
        intervals = sorted((e["ts"], e["ts"] + e["dur"]) for e in raw_events(TRACE_FILTER / f"sampled_rank-{rank}.json.gz")
                           if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
        busy, end = 0, intervals[0][0]
        for ts, te in intervals:
            busy += max(te, end) - max(ts, end)
            end = max(end, te)
        idle_us = end - intervals[0][0] - busy
        assert gaps[rank] == idle_us * 1000
    breakdown = tracesql.query("temporal_breakdown", run).set_index("rank").idle_ns
    assert (breakdown == gaps).all()


def test_largest_bubbles_name_the_kernels_around_them(ingested):
    df = tracesql.query("bubbles_largest", ingested(TRACE_FILTER), top=3)
    top = df[df["rank"] == 0].iloc[0]
    assert top.dur == 58_862_000 and top.next_kernel.startswith("ncclKernel_SendRecv")
    assert top.prev_kernel.startswith("void cutlass::Kernel") and top.category == "other"
    assert list(df.rank_in_rank) == [1, 2, 3, 1, 2, 3] and df.groupby("rank").dur.is_monotonic_decreasing.all()


def reference_kernel_types(text: str) -> dict[str, float]:
    section = text.split("=== get_gpu_kernel_breakdown", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    out = {}
    for line in section:
        words = line.split()
        if not words[0].isdigit() or "name" in words:
            break
        out[" ".join(words[1:-2]).lower().replace("computation", "compute")] = float(words[-2])
    return out


@pytest.mark.corpus
@pytest.mark.parametrize("name", REFERENCE_SETS)
def test_kernel_breakdown_matches_hta_reference(name, ingested):
    """HTA's kernel_type table sums the ranks; its zero-length combinations (a state lasting 0 µs) have no row.
    Exact on every set (on MTIA since the DMA requests whose events name no stream are out of HTA's window)."""
    reference = reference_kernel_types(corpus_path("reference", "hta", f"{name}_hta050.txt").read_text())
    df = tracesql.query("kernel_breakdown", ingested(corpus_path("hta", "tests", "data", REFERENCE_SETS[name])), **HTA)
    ours = (df.groupby("kernel_type").busy_ns.sum() / 1000).to_dict()
    reference = {k: v for k, v in reference.items() if v > 0}
    assert ours == reference


def test_kernel_breakdown_on_trace_filter(ingested):
    """HTA 0.5.0 on these two ranks: COMMUNICATION 305584 µs, COMPUTATION overlapping COMMUNICATION 56747 µs."""
    df = tracesql.query("kernel_breakdown", ingested(TRACE_FILTER), **HTA)
    sums = df.groupby("kernel_type").busy_ns.sum()
    assert sums["communication"] == 305_584_000 and sums["compute overlapping communication"] == 56_747_000
    assert sums["compute overlapping communication overlapping memory"] == 12_000
    busy = tracesql.query("temporal_breakdown", ingested(TRACE_FILTER), **HTA).set_index("rank")
    per_rank = df.groupby("rank").busy_ns.sum()
    assert (per_rank == busy.window_ns - busy.idle_ns).all()


def test_per_step_overlap_and_breakdown_of_the_first_step_are_htas(ingested):
    """HTA's window is the first of the two steps: per step, tracesql's first step gives HTA's numbers."""
    run = ingested(TRACE_FILTER)
    overlap = tracesql.query("overlap", run, per="step", **HTA).set_index(["rank", "step"]).overlap_pct
    assert overlap[(0, 551)] == 11.81 and overlap[(1, 551)] == 20.05
    assert (551 in overlap.index.get_level_values("step")) and 552 not in overlap.index.get_level_values("step")
    breakdown = tracesql.query("temporal_breakdown", run, per="step").set_index(["rank", "step"])
    steps = tracesql.connect(run).sql("SELECT rank, step, device_dur FROM steps").df().set_index(["rank", "step"])
    assert (breakdown.window_ns == steps.device_dur).all()  # a step's window is its device projection
    parts = breakdown[["compute_ns", "exposed_comm_ns", "exposed_memory_ns", "idle_ns"]].sum(axis=1)
    assert (parts == breakdown.window_ns).all()
    hta_step = tracesql.query("temporal_breakdown", run, per="step", **HTA).set_index(["rank", "step"])
    assert hta_step.loc[(0, 551), "idle_pct"] == 53.56 and hta_step.loc[(1, 551), "compute_pct"] == 22.57


def test_overlap_per_process_group_adds_up_to_the_rank(ingested):
    """nccl_parser_config records its one group ('0', default_pg) on every collective: the group is the rank."""
    run = ingested(DATASETS / "hta_nccl_parser_config")
    per_rank = tracesql.query("overlap", run)
    per_group = tracesql.query("overlap", run, per="process_group")
    assert list(per_group.process_group) == ["0"] and per_group.compute_ns.isna().all()
    assert per_group.comm_ns[0] == per_rank.comm_ns[0] == 46_876_493
    assert per_group.overlap_ns[0] == per_rank.overlap_ns[0]


@pytest.fixture(scope="module")
def macros():
    """The functions over empty tables (the macros bind to them), installed once for the name checks below."""
    return empty_session()


@pytest.mark.parametrize("name, family", [
    ("ampere_sgemm_128x64_nn", "ampere_sgemm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)",
     "at::native::vectorized_elementwise_kernel"),
    ("triton_poi_fused_0d1d2de", "triton_poi_fused"),
    ("kernel_1_2", "kernel_1"),
    # XLA instance numbers fold, also on ROCm ('.kd': the code object's symbol)
    ("fusion.3", "fusion"), ("copy-start.4", "copy-start"), ("fusion_1.2", "fusion"),
    ("input_transpose_fusion_1", "input_transpose_fusion"), ("input_transpose_fusion_1.kd", "input_transpose_fusion"),
    # a library kernel's trailing numbers name its variant (Tensile: workgroup shape), not an instance
    ("Cijk_Alik_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_WG32_8.kd",
     "Cijk_Alik_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_1LDSB0_WG32_8.kd"),
])
def test_kernel_family(name, family, macros):
    assert macros.execute("SELECT kernel_family(?)", [name]).fetchone()[0] == family


# Kernel names as PyTorch's profiler wrote them in DeepSeek's public training profile (deepseek-ai/profile-data,
# train.json, 449602428a1b023acb8a505d4f34fef536535db6; no licence given, so not bundled; argument lists cut):
# DeepEP's all-to-all runs as kernels, which HTA's rule and tracesql's before issue 25 counted as compute
DEEPSEEK_KERNELS = {
    "void dpsk::ep::internode::dispatch<false, 8, true, 8>(int4*, float*, long*, float*, "
    "dpsk::ep::internode::SourceMeta*, int4 const*, float const*, long const*, float const*, int*)": "communication",
    "void dpsk::ep::internode::combine<false, 8, __nv_bfloat16, 8, 2, 16, 24>(int4*, float*, bool const*)":
        "communication",
    "void dpsk::ep::internode::notify_dispatch<false, 8>(int const*, long*, int, int const*, int*)": "communication",
    "void dpsk::ep::internode::cached_notify<false>(int, int, int, int, int*, int, int, int const*)": "communication",
    # DeepEP's open-source namespace (deep_ep::), low-latency mode included, as public profiling reports quote them
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*)": "communication",
    "void deep_ep::internode_ll::combine<(bool)0, (int)6144, (int)11>(void *, void *)": "communication",
    # the routing layout is computed locally: compute
    "void dpsk::ep::cuda::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)":
        "compute",
}


@pytest.mark.parametrize("name", list(DEEPSEEK_KERNELS))
def test_expert_parallel_all_to_all_kernels_are_communication(name, macros):
    got = macros.execute("SELECT arg_min(class, priority) FROM kernel_classes WHERE scheme = 'default' "
                      "AND (kind IS NULL OR kind = 'kernel') AND (name_regex IS NULL OR regexp_matches(?, name_regex)) "
                      "AND category_regex IS NULL", [name]).fetchone()[0]
    assert got == DEEPSEEK_KERNELS[name]


def test_symmetric_memory_all_reduce_is_communication(ingested):
    """Issue 25 (7e): the B200 trace's vLLM all-reduce runs as PyTorch's symmetric-memory kernel
    (multimem_all_reduce_kernel), not NCCL: its time is communication, counted against the raw trace's kernels."""
    b200 = DATASETS / "tracelens_b200_eager"
    kernels = [e for e in raw_events(b200 / "eager_trace.json.gz") if e.get("cat") == "kernel"]
    comm = [e for e in kernels if "multimem_all_reduce_kernel" in e["name"] or "nccl" in e["name"].lower()]
    assert len(comm) == 74  # 73 symmetric-memory all-reduces, 1 NCCL all-gather
    row = tracesql.query("overlap", ingested(b200)).iloc[0]
    assert row.comm_ns == 2_141_501 == pytest.approx(sum(e["dur"] for e in comm) * 1000, abs=len(comm))
    calls = tracesql.connect(ingested(b200)).sql("SELECT collective, count(*) FROM collectives "
                                                 "WHERE source_name LIKE '%multimem_all_reduce_kernel%' GROUP BY 1")
    assert calls.fetchall() == [("all_reduce", 73)]


def test_hotspots_fold_kernel_families_and_op_arguments(ingested):
    run = ingested(TRACE_FILTER)
    df = tracesql.query("hotspots", run, top=1000, levels="kernel_family,op,op_args")
    names = [e["name"] for rank in (0, 1) for e in raw_events(TRACE_FILTER / f"sampled_rank-{rank}.json.gz")
             if e.get("cat") == "kernel"]
    cutlass = df[(df.level == "kernel_family") & (df.name == "cutlass::Kernel")].iloc[0]
    raw = [n for n in names if n.startswith("void cutlass::Kernel<")]
    assert cutlass["count"] == len(raw) == 616 and cutlass.variants == len(set(raw)) == 53
    ops, op_args = df[df.level == "op"].set_index("name"), df[df.level == "op_args"]
    by_args = op_args.groupby("name").device_ns.sum()
    assert by_args.to_dict() == ops.device_ns.loc[by_args.index].to_dict()  # each op's argument sets add up to it
    assert (ops.inclusive_ns >= ops.device_ns).all() and (ops.inclusive_ns > ops.device_ns).any()
    assert df.groupby("level").share.sum().round(9).eq(1).all()


def test_hotspots_count_op_calls_whose_device_time_rounds_to_zero(ingested):
    """On the TPU profile, some copy-start.1 executions last under 1 ns: each still counts as a call (before:
    392 of its 400 calls, the others dropped as if they had no device time)."""
    run = ingested(DATASETS / "xprof_tpu_inference")
    ops = tracesql.query("hotspots", run, top=1000, levels="op").set_index("name")
    events = tracesql.connect(run).sql("SELECT name, count(*), count(*) FILTER (WHERE dur = 0) FROM slices "
                                       "WHERE kind = 'kernel' AND starts_with(name, 'copy-start') GROUP BY 1").fetchall()
    assert len(events) == 6 and sum(zero for _, _, zero in events) > 0
    for name, count, _ in events:
        assert ops.loc[name, "count"] == count == 400, name


def correlated(path):
    """Device events and the runtime calls that launched them, matched by correlation id in the raw JSON."""
    events = raw_events(path)
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    return events, [(e, calls[e["args"]["correlation"]]) for e in events
                    if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["args"].get("correlation") in calls]


def test_steps_are_the_profiler_step_ranges_projected_by_correlation(ingested):
    df = tracesql.query("steps", ingested(TRACE_FILTER)).set_index(["step", "rank"])
    device = {}
    for rank in (0, 1):
        events, launched = correlated(TRACE_FILTER / f"sampled_rank-{rank}.json.gz")
        firsts, last_end = {}, 0
        for step in (e for e in events if e.get("name", "").startswith("ProfilerStep#")):
            number = int(step["name"].split("#")[1])
            inside = [k for k, call in launched if step["ts"] <= call["ts"] <= step["ts"] + step["dur"]]
            firsts[number] = min(k["ts"] for k in inside)
            last_end = max(last_end, max(k["ts"] + k["dur"] for k in inside))
            assert df.loc[(number, rank), "cpu_ns"] == step["dur"] * 1000
            assert df.loc[(number, rank), "kernel_count"] == len(inside)
        # a step's window: from its first kernel to the next step's first (the last step: to the last end)
        order = sorted(firsts, key=firsts.get)
        for number, after in zip(order, order[1:] + [None]):
            device[(number, rank)] = ((firsts[after] if after else last_end) - firsts[number]) * 1000
    assert df.device_ns.to_dict() == device
    step_552 = df.loc[552]
    assert (step_552.slowest_rank == 1).all() and (step_552.skew_ns == device[(552, 1)] - device[(552, 0)]).all()
    assert df.loc[(551, 0), "device_p50_ns"] == statistics.median([device[(551, 0)], device[(552, 0)]])


def test_launch_delays_are_device_start_minus_runtime_call_start(ingested):
    df = tracesql.query("launch", ingested(TRACE_FILTER))
    _, launched = correlated(TRACE_FILTER / "sampled_rank-0.json.gz")
    delays = [(k["ts"] - call["ts"]) * 1000 for k, call in launched]
    whole = df[(df["rank"] == 0) & df.step.isna()].iloc[0]
    assert whole.launches == len(delays) == 1204 and whole.delay_max_ns == max(delays) == 111_023_000
    assert whole.delay_p50_ns == statistics.median(delays)
    assert whole.runtime_p50_ns == statistics.median(call["dur"] * 1000 for _, call in launched)
    assert set(df.verdict) <= {"cpu_bound", "not_cpu_bound", None} and (df.host_wait_share.between(0, 1)).all()


def test_annotations_project_device_time_through_launches(ingested):
    df = tracesql.query("annotations", ingested(TRACE_FILTER), top=1000)
    host = df[df.source == "host"].set_index("name")
    expected = 0
    for rank in (0, 1):
        events, launched = correlated(TRACE_FILTER / f"sampled_rank-{rank}.json.gz")
        for a in (e for e in events if e.get("cat") == "user_annotation" and e["name"] == "## forward ##"):
            expected += sum(k["dur"] for k, call in launched
                            if call["tid"] == a["tid"] and a["ts"] <= call["ts"] < a["ts"] + a["dur"])
    assert host.loc["## forward ##", "device_ns"] == expected * 1000 == 326_187_000
    assert not any(name.startswith("ProfilerStep#") for name in host.index)
