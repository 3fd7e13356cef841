"""FLOPs macros against torch's FlopCounterMode, and roofline / MFU numbers against the raw trace JSON.

tests/data/flop_reference.json (made by tests/data/make_flop_reference.py with torch 2.13.0+cpu) holds, for
each case, FlopCounterMode's FLOPs and the Kineto events torch.profiler(record_shapes=True) recorded for the same
ops. The events are ingested here as a real trace, so the shapes reach the macros exactly as they would from a
user's profile. When torch is importable the reference is also recomputed live.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

import tracesql
from tracesql.errors import TraceError
from conftest import DATASETS, empty_session, raw_events, write_trace

DATA = Path(__file__).parent / "data"
REFERENCE = json.loads((DATA / "flop_reference.json").read_text())
CASES = REFERENCE["cases"]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The profiled reference ops as an ingested run."""
    folder = tmp_path_factory.mktemp("flop_reference")
    write_trace(folder / "rank-0.json", REFERENCE["trace_events"])
    out = folder / "run"
    tracesql.ingest([folder / "rank-0.json"], out)
    return out


def case_costs(run, convention: str) -> dict[str, list[tuple]]:
    """case name -> (op name, flops, counted) of the GEMM/conv/attention ops recorded inside its `case:<name>`
    annotation: the ops FlopCounterMode counts (it counts elementwise ops, reductions, copies as 0 FLOPs)."""
    con = tracesql.connect(run)
    rows = con.execute("""
        SELECT substr(a.name, 6) AS case_name, c.name, c.flops, c.counted
        FROM op_costs(attention_convention := $convention) c
        JOIN ops o USING (run_id, rank, op_id)
        JOIN slices a ON a.kind = 'user_annotation' AND a.name LIKE 'case:%' AND a.tid = o.tid
                     AND o.ts >= a.ts AND o.ts + o.dur <= a.ts + a.dur
        WHERE c.flops IS NOT NULL AND c.family IN ('gemm', 'conv', 'attention')
        ORDER BY o.ts""", {"convention": convention}).fetchall()
    out: dict[str, list[tuple]] = {}
    for case, name, flops, counted in rows:
        out.setdefault(case, []).append((name, flops, counted))
    return out


def test_every_case_was_recorded(reference_run):
    assert set(case_costs(reference_run, "torch")) == set(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_counted_flops_equal_flop_counter_mode(case, reference_run):
    """The counted ops of each case (innermost op with a formula) add up to FlopCounterMode's total."""
    ops = case_costs(reference_run, "torch")[case]
    assert sum(f for _, f, counted in ops if counted) == CASES[case]["flop_counter"]["total"]


@pytest.mark.parametrize("case", sorted(c for c, v in CASES.items() if v["reference_device"] == v["device"]))
def test_each_op_equals_flop_counter_mode(case, reference_run):
    """Op by op, where FlopCounterMode counted the same aten op that the profiler recorded."""
    ops = case_costs(reference_run, "torch")[case]
    for op, expected in CASES[case]["flop_counter"]["by_op"].items():
        assert sum(f for name, f, _ in ops if name == op) == expected, op


def test_wrappers_are_not_counted_twice(reference_run):
    costs = case_costs(reference_run, "torch")
    counted = {case: [name for name, _, c in ops if c] for case, ops in costs.items()}
    assert counted["linear"] == ["aten::addmm"]
    assert counted["linear_3d_no_bias"] == ["aten::mm"]
    assert counted["conv2d"] == ["aten::mkldnn_convolution"]
    assert counted["conv2d_dilation_asymmetric"] == ["aten::_convolution"]  # slow_conv_dilated2d has no formula
    assert counted["sdpa"] == ["aten::_scaled_dot_product_flash_attention_for_cpu"]
    # every wrapper carries the same FLOPs as the op it wraps
    assert {f for _, f, _ in costs["conv2d"]} == {69984}


def test_causal_attention_conventions(reference_run):
    """'flash' halves causal attention (metrics.md, flash-attn); 'torch' counts it whole, as FlopCounterMode."""
    torch_ = case_costs(reference_run, "torch")
    flash = case_costs(reference_run, "flash")
    for case in ("sdpa_causal", "flash_attention", "flash_attention_backward"):
        assert sum(f for _, f, c in flash[case] if c) * 2 == sum(f for _, f, c in torch_[case] if c), case
    # not causal: the same either way
    assert flash["sdpa"] == torch_["sdpa"] and flash["efficient_attention_gqa"] == torch_["efficient_attention_gqa"]
    # 4·B·H·Sq·Skv·d / 2 for the causal flash call: B=2, H=4, Sq=16, Skv=32, d=8
    assert sum(f for _, f, c in flash["flash_attention"] if c) == 4 * 2 * 4 * 16 * 32 * 8 / 2


def test_profiler_key_averages_agree(reference_run):
    """torch.profiler(with_flops=True) counts FLOPs in memory (key_averages) but, in torch 2.13, writes none
    into the exported JSON; its in-memory numbers per op name equal the macros' sums."""
    assert REFERENCE["kineto_flops_args"] == []
    con = tracesql.connect(reference_run)
    assert con.execute("SELECT count(flops) FROM ops").fetchall()[0][0] == 0
    ours = dict(con.sql("SELECT name, sum(flops) FROM op_costs() GROUP BY name").fetchall())
    for name, flops in REFERENCE["profiler_key_averages_flops"].items():
        assert ours[name] == flops, name


def test_grouped_convolution_backward_is_groups_aware():
    """FlopCounterMode counts the weight gradient of a grouped convolution groups× too high (it ignores groups);
    here each gradient costs one forward: 2 · 10800 for this call, where torch says 32400."""
    flops = empty_session().execute("""SELECT op_flops('aten::convolution_backward',
        [[2, 6, 5, 5], [2, 4, 9, 9], [6, 2, 3, 3], [], [], [], [], [], [], [], []],
        ['float', 'float', 'float', 'ScalarList', 'ScalarList', 'ScalarList', 'ScalarList', 'Scalar',
         'ScalarList', 'Scalar', 'ScalarList'],
        ['', '', '', '[0]', '[2, 2]', '[1, 1]', '[1, 1]', 'False', '[0, 0]', '2', '[True, True, False]'])""")
    assert flops.fetchall()[0][0] == 2 * 10800


def test_reference_is_what_torch_says_now():
    """With torch installed, FlopCounterMode still gives the stored numbers (the reference is not stale)."""
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("make_flop_reference", DATA / "make_flop_reference.py")
    maker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(maker)
    for case, stored in CASES.items():
        assert maker.torch_flops(case) == stored["flop_counter"], case


# --- roofline and MFU on bundled traces, checked against the raw JSON ---------------------------------------


def launched_device_time(events: list[dict], host_events: list[dict]) -> list[dict]:
    """The kernels, copies and memsets launched by runtime calls made inside any of `host_events` (same thread)."""
    launches = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = e
    spans = [(h["tid"], h["ts"], h["ts"] + h["dur"]) for h in host_events]
    out = []
    for k in events:
        if k.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        launch = launches.get(k.get("args", {}).get("correlation"))
        if launch and any(t == launch["tid"] and a <= launch["ts"] <= b for t, a, b in spans):
            out.append(k)
    return out


def test_roofline_on_b200_matches_json(ingested):
    """The top row of the B200 trace: aten::addmm (bias [640], x [888, 2880], w^T [2880, 640]) in bf16."""
    events = raw_events(DATASETS / "tracelens_b200_eager" / "eager_trace.json.gz")
    calls = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"
             and e["args"]["Input Dims"][:3] == [[640], [888, 2880], [2880, 640]]]
    m, k, n = 888, 2880, 640
    flops = 2 * m * k * n
    bytes_ = (640 + m * k + k * n + m * n) * 2  # bf16 in, bf16 out
    device_ns = round(sum(e["dur"] for e in launched_device_time(events, calls)) * 1000)
    peak, bandwidth = 2.25e15, 8e12  # device_peaks 'B200' (NVIDIA B200 matched by name)
    roofline_ns = max(flops / peak, bytes_ / bandwidth) * 1e9 * len(calls)

    df = tracesql.query("roofline", ingested(DATASETS / "tracelens_b200_eager"), top=5)
    # above it: vLLM's MoE (6.1 ms in 36 calls), its paged attention (649 µs: test_serving_costs.py) and fused add
    # + RMS norm (452 µs in 72 calls), all memory-bound
    assert list(df.name[:3]) == ["vllm::moe_forward", "vllm::unified_attention_with_output", "_C::fused_add_rms_norm"]
    assert set(df.bound[:3]) == {"memory"}
    row = df[df.name == "aten::addmm"].iloc[0]
    assert (row["name"], row["device"], row["dtype"], row["calls"]) == ("aten::addmm", "B200", "bf16", len(calls))
    assert len(calls) == 36 and row["ranks"] == 1
    assert list(map(list, row["input_dims"][:3])) == [[640], [888, 2880], [2880, 640]]
    assert row["flops"] == flops == 3_273_523_200 and row["bytes"] == bytes_ == 9_939_200
    assert row["device_ns"] == device_ns == 287_423
    assert row["arithmetic_intensity"] == pytest.approx(flops / bytes_)
    assert row["achieved_flops_per_s"] == pytest.approx(flops * 36 / device_ns * 1e9)  # ≈ 410 TFLOP/s
    assert row["ridge_point"] == pytest.approx(peak / bandwidth) == 281.25
    assert row["bound"] == "compute" and row["attainable_flops_per_s"] == peak
    assert row["roofline_ns"] == pytest.approx(roofline_ns) and row["roofline_pct"] == pytest.approx(
        100 * roofline_ns / device_ns)
    assert round(row["roofline_pct"], 2) == 18.22
    # the rows below it are ranked by device time
    assert df.device_ns.is_monotonic_decreasing


def test_roofline_does_not_count_linear_and_addmm_twice(ingested):
    df = tracesql.query("roofline", ingested(DATASETS / "tracelens_b200_eager"), top=100)
    assert "aten::linear" not in set(df.name) and "aten::matmul" not in set(df.name)
    assert df[df.name == "aten::addmm"].calls.sum() == 108 and df[df.name == "aten::mm"].calls.sum() == 1


def test_mfu_on_trace_filter_matches_json(ingested):
    """Two ranks of a 128-rank A100 job. The trace names no device: the peak comes from the device parameter."""
    run = ingested(DATASETS / "hta_trace_filter")
    params, tokens = 1e8, 1e6  # a 100M-parameter model, 1M tokens per step
    df = tracesql.query("mfu", run, device="A100-SXM-40GB", dtype="fp32", params=params, tokens_per_step=tokens)
    assert list(df.step) == [551, 552] and (df.ranks == 2).all() and (df.devices == 128).all()
    per_rank = {r: raw_events(DATASETS / "hta_trace_filter" / f"sampled_rank-{r}.json.gz") for r in (0, 1)}
    con = tracesql.connect(run)
    for _, row in df.iterrows():
        windows, gemm_flops = [], 0
        for events in per_rank.values():
            step = next(e for e in events if e.get("name") == f"ProfilerStep#{row.step}")
            launched = launched_device_time(events, [step])
            # the step's device window (docs/concepts/steps.md): from its first device event to the next step's
            # first, the last step to its last end
            after = [e for e in events if e.get("name") == f"ProfilerStep#{row.step + 1}"]
            end = min(e["ts"] for e in launched_device_time(events, after)) if after \
                else max(e["ts"] + e["dur"] for e in launched)
            windows.append(end - min(e["ts"] for e in launched))
            # GEMMs of the step (any thread): mm, addmm, bmm never nest in one another in this trace
            for e in events:
                if e.get("cat") == "cpu_op" and step["ts"] <= e["ts"] < step["ts"] + step["dur"]:
                    d = e["args"].get("Input Dims")
                    if e["name"] == "aten::mm":
                        gemm_flops += 2 * d[0][0] * d[0][1] * d[1][1]
                    elif e["name"] == "aten::addmm":
                        gemm_flops += 2 * d[1][0] * d[1][1] * d[2][1]
                    elif e["name"] == "aten::bmm":
                        gemm_flops += 2 * d[0][0] * d[0][1] * d[0][2] * d[1][2]
        step_time_ns = round(max(windows) * 1000)
        assert row.step_time_ns == step_time_ns
        assert row.peak_flops_per_s == 19.5e12 and row.model_flops == 6 * params * tokens
        assert row.mfu == pytest.approx(6 * params * tokens / (step_time_ns / 1e9 * 128 * 19.5e12))
        sql_gemm = con.execute("SELECT sum(flops) FROM op_costs() WHERE counted AND family = 'gemm' AND step = ?",
                               [int(row.step)]).fetchall()[0][0]
        assert sql_gemm == gemm_flops
        # the rest of the counted FLOPs are elementwise/norm ops and FBGEMM's index bounds checks: about 0.1 % here
        assert 0 < row.formula_flops - gemm_flops < 2e-3 * row.formula_flops
        assert row.hardware_flops == row.formula_flops and math.isnan(row.profiler_flops)
        assert row.hfu == pytest.approx(row.formula_flops / (step_time_ns / 1e9 * 2 * 19.5e12))
    assert [round(x, 4) for x in df.mfu] == [0.3954, 0.3857]  # step 551 ends where 552 begins
    assert [round(x, 4) for x in df.hfu] == [0.0724, 0.0683]


def test_mfu_without_model_flops_is_null_and_hfu_is_not(ingested):
    df = tracesql.query("mfu", ingested(DATASETS / "hta_trace_filter"), device="A100-SXM")
    assert df.mfu.isna().all() and df.model_flops.isna().all()
    assert (df.hfu > 0).all() and (df.dtype == "fp32").all()  # the dtype that carries the trace's FLOPs


def test_device_is_matched_by_name(ingested):
    df = tracesql.query("mfu", ingested(DATASETS / "hta_nccl_parser_config"))
    assert (df.device == "A100-SXM-40GB").all() and (df.peak_flops_per_s == 312e12).all()  # 'A100-PG509-200'
    assert df.hfu.isna().all()  # that trace records no shapes


REAL_DEVICE_NAMES = {
    "NVIDIA H100 80GB HBM3": "H100-SXM", "NVIDIA H100 PCIe": "H100-PCIE", "NVIDIA H100 NVL": "H100-NVL",
    "NVIDIA H200": "H200", "NVIDIA H200 NVL": "H200-NVL", "NVIDIA GH200 480GB": "GH200-96GB",
    "NVIDIA GH200 144G HBM3e": "GH200-144GB", "Tesla V100-SXM2-32GB": "V100-SXM2", "Tesla V100-PCIE-16GB": "V100-PCIE",
    "NVIDIA A100-SXM4-80GB": "A100-SXM", "NVIDIA A100-PG509-200": "A100-SXM-40GB", "NVIDIA A100 80GB PCIe": "A100-PCIE",
    "NVIDIA B200": "B200", "NVIDIA GB200": "GB200", "NVIDIA B300 SXM6 AC": "B300", "NVIDIA GB300": "GB300",
    "NVIDIA L40S": "L40S", "NVIDIA A10": "A10", "AMD Instinct MI210": "MI210",
    "AMD Instinct MI250X": "MI250X", "AMD Instinct MI250": "MI250", "AMD Instinct MI300X": "MI300X",
    "AMD Instinct MI300X VF": "MI300X", "AMD Instinct MI308X": "MI308X", "AMD Instinct MI350X": "MI350X",
    "AMD Instinct MI355X": "MI355X", "TPU v4": "TPU-v4", "TPU v5 lite": "TPU-v5e", "TPU v5p": "TPU-v5p",
    "TPU v6 lite": "TPU-v6e", "TPU v6e": "TPU-v6e", "TPU7x": "TPU-v7x", "Ascend910B2": "Ascend-910B",
    "Ascend910": "Ascend-910", "NVIDIA H20": "H20", "Ascend910_9392": "Ascend-910C",
    # not in the table, or not one device: no match / several
    "NVIDIA A10G": None, "NVIDIA H100": None, "TPU v5": None, "AMD Radeon Graphics": None,
}


def test_device_peaks_match_real_names():
    """Every real device name matches exactly one row; the patterns never overlap on these names."""
    con = empty_session()
    for name, device in REAL_DEVICE_NAMES.items():
        got = [r[0] for r in con.execute("SELECT device FROM device_peaks WHERE regexp_matches(?, name_regex)",
                                         [name]).fetchall()]
        assert got == ([device] if device else []), name
    # the numbers metrics.md states
    rows = {device: (bf16, bandwidth)
            for device, bf16, bandwidth in con.sql("SELECT device, bf16, bytes_per_s FROM device_peaks").fetchall()}
    for device, bf16, bandwidth in [("H100-SXM", 989.4e12, 3.35e12), ("A100-SXM", 312e12, 2.039e12),
                                    ("H200", 989.4e12, 4.8e12), ("MI300X", 1307.4e12, 5.3e12),
                                    ("TPU-v5e", 197e12, 0.819e12)]:
        assert rows[device] == (bf16, bandwidth), device
    # GB200 is not the HGX B200: 2.5 vs 2.25 PFLOP/s dense bf16 per GPU
    assert rows["GB200"][0] / rows["B200"][0] == pytest.approx(2.5 / 2.25)
    assert con.execute("SELECT count(*) FROM device_peaks WHERE source NOT LIKE '%https://%'").fetchall()[0][0] == 0


def _ranks_with_device(con, names: dict[int, str]):
    con.execute("DELETE FROM ranks; DELETE FROM devices")
    for rank, name in names.items():
        con.execute("INSERT INTO ranks (run_id, rank) VALUES ('r', ?)", [rank])
        con.execute("INSERT INTO devices (run_id, rank, device_id, name) VALUES ('r', ?, 0, ?)", [rank, name])


def test_every_peak_column_is_a_dtype_the_queries_take():
    """Issue 28: FP6, FP4 and MX columns and the structured-sparsity peaks. rank_device_peaks lists every FLOP/s
    column of the table (the `peak dtype` parameters accept those), the sparse figures are the datasheets' 2:4
    ones (twice dense on NVIDIA and AMD), and an FP4 tensor is rated as fp4 at one byte per (packed) element."""
    from tracesql.queries import find, check, peak_dtypes

    con = empty_session()
    _ranks_with_device(con, {0: "NVIDIA B200"})
    rated = dict(con.execute("SELECT dtype, peak_flops_per_s FROM rank_device_peaks()").fetchall())
    assert sorted(rated) == sorted(peak_dtypes()) and len(rated) == 19
    assert (rated["bf16"], rated["fp8"], rated["fp4"], rated["mxfp4"], rated["fp4_sparse"]) == (
        2.25e15, 4.5e15, 9e15, 9e15, 18e15)
    pairs = con.sql("SELECT device, bf16, bf16_sparse, fp8, fp8_sparse FROM device_peaks "
                    "WHERE bf16_sparse IS NOT NULL AND device NOT LIKE 'Trainium%'").fetchall()
    assert len(pairs) >= 20 and all(b * 2 == bs and (f is None or f * 2 == fs) for _, b, bs, f, fs in pairs)
    assert check(find("roofline"), {"dtype": "fp8_sparse"}) == {"dtype": "fp8_sparse"}
    with pytest.raises(TraceError, match="is not a device_peaks dtype"):
        check(find("mfu"), {"dtype": "fp3"})
    assert con.execute("SELECT dtype_bytes('Float4_e2m1fn_x2'), op_dtype(['Float4_e2m1fn_x2', 'Float8_e8m0fnu']), "
                       "op_dtype(['Float8_e4m3fn']), dtype_bytes('double')").fetchone() == (1, "fp4", "fp8", 8)


def test_rank_device_peaks_reports_ambiguous_and_unknown_names():
    con = empty_session()
    _ranks_with_device(con, {0: "AMD Instinct MI250X / MI250", 1: "NVIDIA GB200", 2: "Mystery GPU 9000", 3: None})
    rows = {r[0]: r[1:] for r in con.execute(
        "SELECT rank, device, device_note, peak_flops_per_s, link_bytes_per_s FROM rank_device_peaks() "
        "WHERE dtype = 'bf16' ORDER BY rank").fetchall()}
    assert rows[0][:2] == (None, "ambiguous device name 'AMD Instinct MI250X / MI250': MI250 or MI250X")
    assert rows[1] == ("GB200", None, 2.5e15, 900e9)
    assert rows[2][:3] == (None, "unknown device 'Mystery GPU 9000' (not in device_peaks)", None)
    assert rows[3][:2] == (None, "the trace names no device")
    # a user-given peak serves any device, also one the table lacks, for every dtype
    given = con.execute("SELECT DISTINCT rank, peak_flops_per_s, peak_bytes_per_s FROM rank_device_peaks("
                        "peak_flops := 1e15, peak_bytes_per_s := 2e12) ORDER BY rank").fetchall()
    assert given == [(r, 1e15, 2e12) for r in range(4)]


def test_mfu_of_an_inference_iteration(ingested):
    """The B200 eager trace has no ProfilerStep: its one vLLM `execute_model` range is the step (iteration 0),
    and MFU is over the device window of the work launched inside it."""
    run = ingested(DATASETS / "tracelens_b200_eager")
    events = raw_events(DATASETS / "tracelens_b200_eager" / "eager_trace.json.gz")
    iteration = [e for e in events if e.get("cat") == "python_function" and e.get("name", "").endswith(": execute_model")]
    assert len(iteration) == 1
    device = launched_device_time(events, iteration)
    window_ns = round((max(e["ts"] + e["dur"] for e in device) - min(e["ts"] for e in device)) * 1000)
    df = tracesql.query("mfu", run, model_flops_per_step=1e12)
    assert len(df) == 1 and df.step[0] == 0 and df.device[0] == "B200"
    assert abs(df.step_time_ns[0] - window_ns) <= 1  # µs with fractions in the JSON
    # rated at the peak of the dtype with most counted FLOPs: the MoE's MXFP8 GEMMs (1.21 of 1.47 TFLOP), 4.5 PFLOP/s
    assert df.dtype[0] == "mxfp8" and df.hardware_flops[0] == 1_472_680_373_771
    assert df.mfu[0] == pytest.approx(1e12 / (df.step_time_ns[0] / 1e9 * df.devices[0] * 4.5e15))
    assert df.warning.isna()[0]


def test_mfu_says_when_it_cannot_be_trusted(ingested):
    vllm = ingested(DATASETS / "tracelens_vllm_graph_execution")  # its trace names no device
    df = tracesql.query("mfu", vllm, model_flops_per_step=1e12)
    assert df.mfu.isna()[0] and df.warning[0] == "the trace names no device: give -p device= or -p peak_flops="
    given = tracesql.query("mfu", vllm, model_flops_per_step=1e12, peak_flops=1e15)
    assert given.peak_flops_per_s[0] == 1e15 and given.mfu[0] > 0 and given.warning.isna()[0]
    too_high = tracesql.query("mfu", ingested(DATASETS / "hta_nccl_parser_config"), model_flops_per_step=1e15)
    assert (too_high.mfu > 1).all()
    peak = too_high.peak_flops_per_s[0]
    assert (too_high.warning == [f"exceeds the device's peak: {mfu * peak:.4g} FLOP/s per device > {peak:.4g} FLOP/s "
                                 "per device (MFU above 1: the model FLOPs, the step time or the peak is wrong)"
                                 for mfu in too_high.mfu]).all()


def test_hfu_takes_the_profilers_count_per_op_and_the_formula_elsewhere(tmp_path):
    """The profiler counts the GEMM but not attention: HFU's FLOPs are the GEMM's counted FLOPs plus the
    attention formula, not the profiler's total alone (which would drop attention without a word)."""
    b, h, s, d = 2, 4, 128, 64
    mm_flops, mm_dims = 2 * 256 * 512 * 1024, [[256, 512], [512, 1024]]
    recorded = 300_000_000  # what the profiler wrote for the mm (not the formula's value: the rule must take it)
    attention = 4 * b * h * s * s * d  # not causal
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000,
               "pid": 1, "tid": 1}]
    ops = [("aten::mm", mm_dims, ["float", "float"], {"flops": recorded}),
           ("aten::_scaled_dot_product_flash_attention", [[b, h, s, d]] * 3 + [[], [], []],
            ["float"] * 3 + ["Scalar", "Scalar", "Scalar"], {"Concrete Inputs": ["", "", "", "0.0", "False", ""]})]
    for i, (name, dims, types, extra) in enumerate(ops):
        ts = 10 + 400 * i
        events += [
            {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": 100, "pid": 1, "tid": 1,
             "args": {"Input Dims": dims, "Input type": types, **extra}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts + 10, "dur": 5, "pid": 1,
             "tid": 1, "args": {"correlation": i + 1}},
            {"ph": "X", "cat": "kernel", "name": f"kernel_{i}", "ts": ts + 20, "dur": 300, "pid": 0, "tid": 7,
             "args": {"correlation": i + 1, "device": 0, "stream": 7}},
        ]
    run = tmp_path / "run"
    tracesql.ingest([write_trace(tmp_path / "t.json", events)], run)
    rows = {src: tracesql.query("mfu", run, device="H100-SXM", dtype="fp32", flops_source=src).iloc[0]
            for src in ("auto", "profiler", "formula")}
    assert rows["profiler"].hardware_flops == recorded
    assert rows["formula"].hardware_flops == mm_flops + attention
    assert rows["auto"].hardware_flops == recorded + attention
    assert rows["auto"].profiler_flops == recorded and rows["auto"].formula_flops == mm_flops + attention


def test_mfu_takes_integer_parameters(ingested):
    """6 · params · tokens overflows 32-bit integers: parameters typed on the command line arrive as integers."""
    df = tracesql.query("mfu", ingested(DATASETS / "hta_trace_filter"), device="A100-SXM-40GB", dtype="fp32",
                        params=100_000_000, tokens_per_step=1_000_000)
    assert list(df.model_flops) == [6e14, 6e14]
    float_params = tracesql.query("mfu", ingested(DATASETS / "hta_trace_filter"), device="A100-SXM-40GB",
                                  dtype="fp32", params=1e8, tokens_per_step=1e6)
    assert list(df.mfu) == list(float_params.mfu)


def test_stored_costs_are_what_the_functions_give(reference_run):
    """The run's `op_costs` table, worked out once at ingest, gives each op the numbers that op_flops (both
    attention conventions) and op_bytes give its call ad hoc: one implementation, stored."""
    con = tracesql.connect(reference_run)
    ops, costed, differ, causal = con.execute("""
        SELECT count(*), count(c.flops),
            count(*) FILTER (WHERE c.flops IS DISTINCT FROM op_flops(o.name, o.input_dims, o.input_types,
                                                                    o.concrete_inputs)
                OR c.torch_flops IS DISTINCT FROM op_flops(o.name, o.input_dims, o.input_types, o.concrete_inputs,
                                                           attention_convention := 'torch')
                OR c.bytes IS DISTINCT FROM op_bytes(o.name, o.input_dims, o.input_types, o.concrete_inputs)),
            count(*) FILTER (WHERE c.torch_flops = 2 * c.flops AND c.family = 'attention')
        FROM op_costs c JOIN ops o USING (run_id, rank, op_id)""").fetchone()
    assert (ops, costed, differ, causal) == (266, 232, 0, 5)


def _family_costs(calls: list[dict], dispatch: str | None) -> dict[tuple, tuple]:
    """(name, d, t, c) -> (family, FLOPs flash, FLOPs torch, bytes) of op calls, by typed_op_flops / typed_op_bytes
    over op_calls() as the ingest's op_costs.sql calls them: on a connection whose `ops` are the calls, with the
    dispatch over all families (None), or with `dispatch` (TEMP) and only what it needs, as the ingest makes it."""
    import duckdb

    from tracesql import functions

    con = duckdb.connect()
    con.execute("""CREATE TABLE ops AS SELECT name, d AS input_dims, t AS input_types, c AS concrete_inputs,
                       CAST(NULL AS BIGINT) AS program_id
                   FROM (SELECT unnest($1::STRUCT(name VARCHAR, d BIGINT[][], t VARCHAR[], c VARCHAR[])[],
                                       recursive := true))""", [calls])
    sql = """SELECT name, input_dims, input_types, concrete_inputs, k.family,
                 typed_op_flops(k, input_dims, input_types, concrete_inputs, a, 'flash'),
                 typed_op_flops(k, input_dims, input_types, concrete_inputs, a, 'torch'),
                 typed_op_bytes(k, input_dims, input_types, concrete_inputs, a)
             FROM op_calls()"""
    shared = set(functions.FAMILY_DISPATCH) if dispatch else set()  # the TEMP dispatch stands for them
    functions.install(con, names=functions.words(sql + (dispatch or "")) - shared)
    if dispatch:
        con.execute(dispatch)
    return {(n, str(d), str(t), str(c)): tuple(v) for n, d, t, c, *v in con.execute(sql).fetchall()}


def test_each_family_bound_alone_costs_as_all_of_them(reference_run):
    """typed_op_flops / typed_op_bytes dispatch on the op's family to its pair of formula macros
    (typed_op_flops_FAMILY, typed_op_bytes_FAMILY in 30_flops.sql), and the ingest binds the dispatch to its run's
    families only (functions.family_dispatch; the test above checks the stored numbers). Every family op_base_family
    gives has its pair; the dispatch over one family, on a connection made as the ingest makes it (only what that
    needs), costs each call of that family as the dispatch over all families does (the calls of the hand-checked
    cost model and of the reference run: every family), and a call of another family gets NULL."""
    from test_cost_model import CASES as HAND_CASES
    from tracesql import functions

    known = {name: text for name, text in functions.definitions() if name}
    families = set(re.findall(r"THEN '(\w+)'", known["op_base_family"]))
    assert len(families) == 16 and functions.formula_families() == families
    calls = [dict(zip(("name", "d", "t", "c"), r)) for r in tracesql.connect(reference_run).execute(
        "SELECT DISTINCT name, input_dims, input_types, concrete_inputs FROM ops WHERE program_id IS NULL").fetchall()]
    calls += [{"name": n, "d": d, "t": t, "c": c or [""] * len(d)} for n, d, t, c, *_ in HAND_CASES.values()]
    every = _family_costs(calls, None)
    assert {family for family, *_ in every.values()} == families | {None}
    for family in sorted(families):
        assert _family_costs(calls, functions.family_dispatch({family}, temp=True)) == {
            call: (f, *(costs if f == family else (None, None, None))) for call, (f, *costs) in every.items()}, family
