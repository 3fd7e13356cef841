"""XLA ops with their meaning: the HLO of real XPlane profiles (a TPU v6e inference from XProf's test data, a
sharded FFN made here on 8 CPU devices, MI300 JAX runs of the corpus) against formulas, XLA's own cost
analysis and XProf's own op statistics (tests/data/xprof_reference.json, made with the xprof package)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import tracesql
from conftest import CORPUS, DATASETS, corpus_path
from tracesql import queries

FFN = DATASETS / "jax_cpu_8dev_ffn"
TPU = DATASETS / "xprof_tpu_inference"
XPROF = json.loads((Path(__file__).parent / "data" / "xprof_reference.json").read_text())
EXPECTED = json.loads((Path(__file__).parent / "data" / "jax_cpu_8dev_ffn_expected.json").read_text())


@pytest.fixture(scope="module")
def ffn(tmp_path_factory):
    run = tmp_path_factory.mktemp("ffn") / "run"
    tracesql.ingest([FFN / "ffn.xplane.pb"], run)
    return tracesql.connect(run)


@pytest.fixture(scope="module")
def tpu(tmp_path_factory):
    run = tmp_path_factory.mktemp("tpu") / "run"
    tracesql.ingest([TPU], run)
    return tracesql.connect(run)


def rows(con, sql):
    return con.execute(sql).fetchall()


def test_ffn_up_projection_flops_are_2bdf_per_shard(ffn):
    b, d, f, n = (EXPECTED[k] for k in ("tokens", "model", "hidden", "devices"))
    up = rows(ffn, "SELECT DISTINCT program_id, name, flops, operand_dims FROM xla_ops "
                   "WHERE module = 'jit_train_step' AND op_name LIKE '%ffn/up/dot_general'")
    assert up and all(r[2] == 2 * b * d * f / n for r in up)
    assert all(r[3] == [[b, d], [d, f // n]] for r in up)  # the gathered tokens times this device's columns
    # every execution of it in `ops` carries those FLOPs: 8 devices x 3 steps
    calls = rows(ffn, "SELECT count(*), min(o.flops), max(o.flops) FROM ops o JOIN xla_ops x USING (rank, program_id, name) "
                      "WHERE x.op_name LIKE '%ffn/up/dot_general'")
    assert calls == [(n * 3, 2 * b * d * f / n, 2 * b * d * f / n)]


def test_ffn_flops_match_xla_cost_analysis(ffn):
    """The step's FLOPs counted from the HLO equal XLA's own cost analysis of the compiled step, but for the
    transcendentals (gelu's tanh), which XLA counts apart and tracesql as one FLOP each (as its other formulas)."""
    program = rows(ffn, "SELECT min(program_id) FROM ops WHERE name = 'ynn_fusion.2'")[0][0]
    (flops,) = rows(ffn, f"SELECT sum(flops) FROM xla_ops WHERE program_id = '{program}'")[0]
    xla = EXPECTED["xla_cost_analysis"]
    assert xla["flops"] <= flops <= xla["flops"] + xla["transcendentals"] + 16384
    assert math.isclose(flops, xla["flops"], rel_tol=1e-3)


def test_ffn_collectives_have_the_sharded_tensor_sizes_and_groups(ffn):
    b, d, n = EXPECTED["tokens"], EXPECTED["model"], EXPECTED["devices"]
    got = rows(ffn, "SELECT collective, dtype, in_nelems, out_nelems, size_bytes, group_size, group_ranks, "
                    "count(*), count(DISTINCT device_id) FROM collectives GROUP BY ALL ORDER BY 1")
    full, shard = b * d, b * d // n
    group = list(range(n))
    # forward all-gather + its recomputation (remat); the forward reduce-scatter; 3 steps on 8 devices
    assert got == [("all_gather", "f32", shard, full, full * 4, n, group, 2 * 3 * n, n),
                   ("reduce_scatter", "f32", full, shard, full * 4, n, group, 3 * n, n)]
    classes = rows(ffn, "SELECT DISTINCT class FROM device_activity() WHERE name LIKE 'all_gather%' "
                        "OR name LIKE 'reduce_scatter%'")
    assert classes == [("communication",)]


def test_ffn_roofline_and_breakdown(ffn):
    roofline = queries.find("roofline")
    roof = queries.run(ffn, roofline, {"device": "H100-SXM", "top": 100}).df()
    dots = roof[roof["name"].isin(["ynn_fusion", "ynn_fusion.1", "ynn_fusion.2", "dot", "dot.1"])]
    assert len(dots) and (dots["flops"] == 2 * 256 * 512 * 256).all() and (dots["roofline_ns"] > 0).all()
    # H100 fp32 peak 67e12 FLOP/s: one 67 MFLOP dot takes at least 1.0 µs; its bytes at 3.35 TB/s less
    assert all(math.isclose(ns / calls, 2 * 256 * 512 * 256 / 67e12 * 1e9)
               for ns, calls in zip(dots["roofline_ns"], dots["calls"]))
    per_step = queries.run(ffn, queries.find("xla_breakdown"),
                           {"per": "step", "dimensions": "category,pass,scope"}).fetchall()
    device = dict(rows(ffn, "SELECT step, sum(dur) FROM device_activity() WHERE step IS NOT NULL GROUP BY step"))
    for step, ns in device.items():
        for dimension in ("category", "pass", "scope"):
            mine = [r for r in per_step if r[1] == step and r[2] == dimension]
            # device_ns, its split by class, share
            assert sum(r[5] for r in mine) == ns and math.isclose(sum(r[9] for r in mine), 1.0)
            assert all(r[6] + r[7] + r[8] == r[5] for r in mine)
    passes = {r[3] for r in per_step if r[2] == "pass"}
    assert passes == {"forward", "backward", "remat"}


def test_tpu_ops_equal_xprof_op_statistics(tpu):
    """Every XLA op of the real TPU profile, executions per op as XProf's hlo_stats counts them (zero-length
    events included, as XProf does), with XProf's categories."""
    reference = XPROF["xprof_tpu_inference"]["hlo_stats"]
    ours = {(p, n): (c, cat) for p, n, c, cat in rows(
        tpu, "SELECT o.program_id, o.name, count(*), any_value(x.category) FROM ops o "
             "JOIN xla_ops x USING (rank, program_id, name) GROUP BY ALL")}
    assert {(r["program_id"], r["hlo_op_name"]): (int(r["occurrences"]), r["category"]) for r in reference} == ours
    assert rows(tpu, "SELECT count(*) FROM slices WHERE kind = 'kernel' AND starts_with(name, '%')") == [(0,)]
    # op time by the device's clock, as XProf counts it, in `ops` and in the slices themselves: every op within
    # the rounding of each event to 1 ns
    total = {r["hlo_op_name"]: r["total_time"] * 1000 for r in reference}
    got = rows(tpu, "SELECT o.name, sum(o.device_self_ns), sum(s.dur), count(*) FROM ops o "
                    "JOIN slices s ON s.slice_id = o.op_id GROUP BY o.name")
    assert len(got) == len(total) and all(abs(ops - total[name]) < n and slices == ops for name, ops, slices, n in got)
    # the timeline's durations differ where the device-to-host clock alignment was re-anchored during an op:
    # copy-done.2 spans 298.8 ms of the timeline the first time it runs on TPU 0, but took 194.1 ms (kept in args)
    first, = rows(tpu, "SELECT s.dur, o.dur, o.device_self_ns, s.args ->> '$.span_ns', s.args ->> '$.device_duration_ps' "
                       "FROM ops o JOIN slices s ON s.slice_id = o.op_id "
                       "WHERE o.name = 'copy-done.2' AND s.device_id = 0 ORDER BY o.ts LIMIT 1")
    assert first[:4] == (194118896, 194118896, 194118896, "298807392") and first[4] == "194118896250"


def test_tpu_hotspots_count_every_execution(tpu):
    """An op that ran under a nanosecond by the device's clock (8 of copy-start.1's 400 executions: 0 ns once
    rounded) is an execution all the same: hotspots' op level counts each op's executions as XProf's hlo_stats
    does (before: 392 of copy-start.1's 400)."""
    assert rows(tpu, "SELECT count(*) FROM slices WHERE name = 'copy-start.1' AND dur = 0") == [(8,)]
    found = queries.run(tpu, queries.find("hotspots"), {"levels": "op", "top": 100})
    cols = [c[0] for c in found.description]
    counts = {r[cols.index("name")]: r[cols.index("count")] for r in found.fetchall()}
    assert counts == {r["hlo_op_name"]: r["occurrences"] for r in XPROF["xprof_tpu_inference"]["hlo_stats"]}


def _xprof_traces():
    """(reference key, trace) of every XPlane in XProf's reference: the bundled ones, the corpus's (skipped when
    absent)."""
    out = []
    for key in XPROF:
        if key.startswith("corpus/"):
            out.append(pytest.param(key, CORPUS / key.removeprefix("corpus/"), marks=pytest.mark.corpus, id=key[-40:]))
        else:
            out.append(pytest.param(key, DATASETS / key, id=key))
    return out


@pytest.mark.parametrize("key, trace", _xprof_traces())
def test_xplane_device_time_equals_xprof(key, trace, ingested):
    """Per converter of XProf (2.24), on every XPlane it was run on: hlo_stats (per program and op: device time,
    and on a GPU its kernels), op_profile (per category: xla_breakdown's device time) and kernel_stats (per GPU
    kernel: executions and time), each within the rounding of every event to 1 ns."""
    if not trace.exists():
        pytest.skip(f"corpus not available: {trace}")
    reference = XPROF[key]
    con = tracesql.connect(ingested(trace))
    if key == "jax_cpu_8dev_ffn":
        return  # XProf's op and kernel statistics leave out XLA's CPU backend (its overview: test_xplane_steps...)
    tpu = any(r["category"] == "copy-done" for r in reference["hlo_stats"])
    want = {(r["program_id"], r["hlo_op_name"]): (r["occurrences"], r["total_time"] * 1000)
            for r in reference["hlo_stats"]}
    # XProf counts an op's executions on a TPU and its kernels on a GPU
    got = {(p, n): (c if tpu else k, ns) for p, n, c, k, ns in rows(
        con, "SELECT program_id, name, count(*), sum(kernel_count), sum(device_self_ns) FROM ops "
             "WHERE program_id IS NOT NULL GROUP BY ALL")}
    assert got.keys() == want.keys()
    assert all(got[k][0] == n and abs(got[k][1] - ns) < n for k, (n, ns) in want.items())
    categories = {}
    for name, m in reference["op_profile"]["categories"].items():
        n, ns = categories.get(name.split("/", 1)[1], (0, 0))
        categories[name.split("/", 1)[1]] = (n + m["occurrences"], ns + m["raw_time_ps"] / 1000)
    breakdown = {r[3]: r[5] for r in queries.run(con, queries.find("xla_breakdown"), {}).fetchall() if r[2] == "category"}
    assert all(abs(breakdown[c] - ns) < n for c, (n, ns) in categories.items())
    kernels = {}
    for r in reference["kernel_stats"]:
        n, ns = kernels.get(r["kernel_name"], (0, 0))
        kernels[r["kernel_name"]] = (n + r["occurrences"], ns + r["total_duration_us"] * 1000)
    got = {name: (n, ns) for name, n, ns in rows(
        con, "SELECT name, count(*), sum(dur) FROM slices WHERE kind = 'kernel' AND device_id IS NOT NULL "
             "AND track LIKE '%stream%' GROUP BY name")}
    assert got.keys() == kernels.keys()
    assert all(got[k][0] == n and abs(got[k][1] - ns) < 1 for k, (n, ns) in kernels.items())


@pytest.mark.parametrize("key", ["jax_cpu_8dev_ffn", "xprof_gpu_multi_worker", "xprof_tpu_inference"])
def test_xplane_steps_equal_xprof_overview(key, ingested):
    """Step times are XProf's overview page's: the host's step annotations (the FFN's StepTraceAnnotation), else
    the device 'Steps' line (TensorFlow's GPU demo: one marker per GPU; XProf's step is the longest, 21.31 ms on
    GPU 6), else none (the TPU profile). A device-marked step is its device window, and the per-step breakdown
    of the longest marker's device spans it: 69.8 % compute, as XProf says (14.8755 ms of 21.3104 ms)."""
    con = tracesql.connect(ingested(DATASETS / key))
    overview = XPROF[key]["overview_page"]
    want = [r["stepTimeMs"] * 1e6 for r in overview["steps"]]
    got = rows(con, "SELECT dur, device_dur, rule FROM steps ORDER BY step")
    assert [round(ns) for ns, _, _ in got] == [round(ns) for ns in want]
    if key != "xprof_gpu_multi_worker":
        return
    assert got == [(21310352, 21310352, "xplane_steps")]
    found = queries.run(con, queries.find("temporal_breakdown"), {"per": "step"})
    cols = [c[0] for c in found.description]
    breakdown = {r[cols.index("device_id")]: dict(zip(cols, r)) for r in found.fetchall()}
    assert {d: r["window_ns"] for d, r in breakdown.items()} == {4: 19865491, 6: 21310352}  # each GPU's marker
    # XProf counts the step's events that carry its group_id, TensorFlow's 'MemcpyH2D'/'MemcpyD2H' among them as
    # compute (its rules look for 'MemcpyHtoD'): 10.2 µs more compute than the kernels' 14.8654 ms
    xprof = overview["steps"][0]["deviceComputeTimeMs"] * 1e6
    assert xprof - breakdown[6]["compute_ns"] == 10176 and breakdown[6]["compute_pct"] == 69.76


def test_tensorflow_ops_equal_xprof_framework_op_stats(ingested):
    """TensorFlow's host op events ('<node>:<type>', tf.data's 'Iterator::...', XProf's rules) are `ops` rows
    (before: annotations, and no ops at all), with the device time they caused. On TensorFlow's GPU demo: each of
    XProf's framework_op_stats host ops (the 499 with the most self time) has XProf's total time; XProf counts 448
    of them twice that ran once (one host event) and launched one kernel. Every kernel is linked, through its
    launch inside the op, to the op that the device's own 'TensorFlow Ops' line names for it, and the kernels'
    time is kernel_stats' 29.690748 ms."""
    con = tracesql.connect(ingested(DATASETS / "xprof_gpu_multi_worker"))
    reference = XPROF["xprof_gpu_multi_worker"]
    assert rows(con, "SELECT count(*), count(DISTINCT name), count(parent_op_id) FROM ops") == [(4783, 4699, 0)]
    # XProf names a TensorFlow op by its node (the part before ':type')
    got = {name: (n, ns, kernels) for name, n, ns, kernels in rows(
        con, "SELECT CASE WHEN starts_with(name, 'Iterator::') THEN name ELSE split_part(name, ':', 1) END, "
             "count(*), sum(dur), sum(kernel_count) FROM ops GROUP BY 1")}
    xprof = {r["operation"]: (r["occurrences"], r["total_time"] * 1000) for r in reference["framework_op_stats"]}
    assert len(xprof) == 499 and xprof.keys() <= got.keys()
    assert all(abs(got[op][1] - ns) < 1 for op, (_, ns) in xprof.items())
    twice = [op for op, (n, _) in xprof.items() if n != got[op][0]]
    assert len(twice) == 448 and all(xprof[op][0] == 2 and got[op][0] == 1 and got[op][2] == 1 for op in twice)
    linked = rows(con, "SELECT count(*), count(*) FILTER (WHERE o.name = t.name), sum(k.dur) FROM slices k "
                       "JOIN slices t ON t.device_id = k.device_id AND t.track LIKE '%/ TensorFlow Ops' "
                       "AND t.ts = k.ts AND t.dur = k.dur LEFT JOIN ops o ON o.op_id = k.op_id WHERE k.kind = 'kernel'")
    kernel_ns = sum(r["total_duration_us"] for r in reference["kernel_stats"]) * 1000
    assert linked[0][:2] == (1330, 1330) and abs(linked[0][2] - kernel_ns) < 1
    assert rows(con, "SELECT sum(kernel_count), sum(device_self_ns) FROM ops") == [(1366, 29816284)]  # + 36 copies


def test_xplane_bfc_allocators_have_no_reserved_figure(ingested):
    """TSL's BFC allocators write bytes_reserved = memory set aside beyond what is in use, 0 on every event of
    TensorFlow's GPU demo while 6.2 GB are in use: no reserved figure, so NULL (before: peak_reserved_bytes 0).
    The allocated peak is the allocator's own peak_bytes_in_use."""
    con = tracesql.connect(ingested(DATASETS / "xprof_gpu_multi_worker"))
    assert rows(con, "SELECT count(*), count(total_reserved_bytes), count(*) FILTER (WHERE (args ->> '$.bytes_reserved') "
                     "= '0') FROM memory JOIN slices ON slice_id = memory_id") == [(2493, 0, 2493)]
    got = queries.run(con, queries.find("memory"), {}).df().set_index("allocator")
    assert got.loc["GPU_6_bfc", "peak_allocated_bytes"] == 6210111488
    assert got.peak_reserved_bytes.isna().all() and got.peak_reserved_ts.isna().all() \
        and got.final_reserved_bytes.isna().all() and len(got) == 4


def test_tpu_timeline_per_core_equals_xprof(tpu):
    """Each TPU core's compute, communication and memory time in temporal_breakdown (a union of intervals) is
    XProf's per-core op time of those categories (hlo_stats of that core's plane alone), and the idle time of all
    cores XProf's op_profile IDLE: one core's ops never overlap, and its window is XProf's (first op to last)."""
    reference = XPROF["xprof_tpu_inference"]
    classes = dict(rows(tpu, "SELECT DISTINCT category, class FROM device_activity()"))
    ops = dict(rows(tpu, "SELECT device_id, count(*) FROM slices WHERE kind = 'kernel' GROUP BY 1"))
    found = queries.run(tpu, queries.find("temporal_breakdown"), {})
    cols = [c[0] for c in found.description]
    breakdown = [dict(zip(cols, r)) for r in found.fetchall()]
    assert sorted(r["device_id"] for r in breakdown) == [0, 1, 2, 3]
    for r in breakdown:
        xprof = {"compute": 0, "communication": 0, "memory": 0}
        for category, us in reference["hlo_stats_per_core"][str(r["device_id"])].items():
            xprof[classes[category]] += us * 1000
        n = ops[r["device_id"]]
        assert abs(r["compute_ns"] - xprof["compute"]) < n and abs(r["exposed_comm_ns"] - xprof["communication"]) < n
        assert abs(r["exposed_memory_ns"] - xprof["memory"]) < n
    assert abs(sum(r["idle_ns"] for r in breakdown) - reference["op_profile"]["idle_ps"] / 1000) < sum(ops.values())


def test_tpu_collectives_and_classes(tpu):
    got = rows(tpu, "SELECT collective, dtype, size_bytes, group_size, count(*), count(DISTINCT device_id) "
                    "FROM collectives GROUP BY ALL")
    assert got == [("all_reduce", "f32", 5 * 1024 * 1024 * 256 * 4, 2, 12, 4)]
    classes = dict(rows(tpu, "SELECT category, min(class) FROM device_activity() GROUP BY 1 HAVING min(class) = max(class)"))
    assert classes["all-reduce"] == "communication" and classes["copy-done"] == "memory" \
        and classes["loop fusion"] == "compute"
    devices = rows(tpu, "SELECT device_id, name FROM devices ORDER BY 1")
    assert devices == [(d, "TPU v6 Lite") for d in range(4)]


def test_tpu_memory_peak_is_the_allocators(tpu):
    got = rows(tpu, "SELECT device_type, device_id, max(total_allocated_bytes), max(peak_allocated_bytes) "
                    "FROM memory GROUP BY ALL ORDER BY 2")
    assert [r[:2] for r in got] == [("tpu", d) for d in range(4)] and all(r[2] == r[3] for r in got)
    assert got[0][2] == 16106341504


@pytest.mark.corpus
def test_gpu_xplane_memory_and_ops(ingested):
    run = ingested(corpus_path("tracelens", "tests", "traces", "mi300", "jax_conv_minimal_08", "tw003.xplane.pb"))
    con = tracesql.connect(run)
    peaks = rows(con, "SELECT device_id, max(total_allocated_bytes), max(peak_allocated_bytes), count(*) "
                      "FROM memory GROUP BY 1 ORDER BY 1")
    assert len(peaks) == 8 and all(r[1] == r[2] for r in peaks) and peaks[0][1] == 1730171904
    assert sum(r[3] for r in peaks) == 230
    # the convolution: a cuDNN/MIOpen custom call, FLOPs from its window and kernel
    conv = rows(con, "SELECT operand_dims, flops FROM xla_ops WHERE name = 'cudnn-conv.1'")
    (x, w), flops = conv[0]
    out = rows(con, "SELECT output_shape FROM xla_ops WHERE name = 'cudnn-conv.1'")[0][0]
    assert out.startswith("(bf16[1,5120,34,31,53]")
    assert flops == 2 * 5120 * 34 * 31 * 53 * math.prod(w[2:]) * w[1]


@pytest.mark.corpus
@pytest.mark.parametrize("parts, model, capability", [
    (("traces", "mi300", "jax_conv_minimal_08", "tw003.xplane.pb"), "AMD Instinct MI300X", "9.4"),
    (("test_data_jax_te_fused_attn_categorization", "934987a2fc2f.xplane.pb"), "AMD Instinct MI355X", "9.5"),
])
def test_gpu_xplane_device_model_from_plane_stats(ingested, parts, model, capability):
    """A GPU plane is '/device:GPU:N' and its stats give vendor, compute capability, cores, memory and clock, not
    the model: the model they describe names the device, so the device peaks (MFU, roofline) match."""
    con = tracesql.connect(ingested(corpus_path("tracelens", "tests", *parts)))
    got = rows(con, "SELECT name, compute_capability, sm_count FROM devices WHERE device_id = 0")
    assert got[0][:2] == (model, capability)
    key = model.split()[-1]
    assert rows(con, "SELECT DISTINCT device FROM rank_device_peaks()") == [(key,)]
    roofline = queries.run(con, queries.find("roofline"), {}).df()
    assert len(roofline) and set(roofline["device"]) == {key} and roofline["peak_flops_per_s"].notna().any()


def test_gpu_model_from_stats():
    from tracesql.readers.xplane import gpu_model
    h100 = {"device_vendor": "Nvidia", "compute_cap_major": 9, "compute_cap_minor": 0, "core_count": 132,
            "memory_size": 85_520_809_984, "clock_rate": 1_980_000, "memory_bandwidth": 3_352_320_000_000}
    assert gpu_model(h100) == "NVIDIA H100 80GB HBM3"
    assert gpu_model({**h100, "memory_size": 150_754_820_096}) == "NVIDIA H200"
    a100 = {**h100, "compute_cap_major": 8, "core_count": 108, "memory_size": 85_100_000_000}
    assert gpu_model({**a100, "memory_bandwidth": 2_039_000_000_000}) == "NVIDIA A100-SXM4-80GB"
    assert gpu_model({**a100, "memory_bandwidth": 1_935_000_000_000}) == "NVIDIA A100 80GB PCIe"
    assert gpu_model({**a100, "memory_size": 42_000_000_000}) is None  # 40 GB: SXM and PCIe alike
    assert gpu_model({"device_vendor": "AMD"}) is None


@pytest.mark.corpus
def test_te_fused_attention_and_cublas_custom_calls_costed_from_their_dims(ingested):
    """Transformer Engine's JAX fused attention (BS3HD, causal) and XLA's cuBLAS/hipBLASLt GEMM are custom calls:
    no HLO to count inside, so their FLOPs come from the dims their backend configs record (hand counts below);
    before, they had none and 60 % of this run's compute time was unrated."""
    con = tracesql.connect(ingested(corpus_path("tracelens", "tests", "test_data_jax_te_fused_attn_categorization",
                                                "934987a2fc2f.xplane.pb")))
    got = dict(((n, (f, s)) for n, f, s in rows(
        con, "SELECT name, flops, cost_source FROM xla_ops WHERE opcode = 'custom-call'")))
    b, h, s, d = 2, 16, 2048, 128  # input_batch, attn_heads, q/kv_max_seqlen, qk/v_head_dim; mask_type 2: causal
    assert got["te_fused_attn_forward_ffi.10"] == (2 * b * h * s * s * (d + d) / 2, "shapes")
    assert got["te_fused_attn_backward_ffi.12"] == (2 * b * h * s * s * (3 * d + 2 * d) / 2, "shapes")
    # bf16[4096,6144] · bf16[2048,6144]ᵀ (contracting dim 1 of both) -> bf16[4096,2048], and its workspace
    assert got["custom-call.1"] == (2 * 4096 * 2048 * 6144, "shapes")
    coverage = queries.run(con, queries.find("cost_coverage"), {}).df().iloc[0]
    assert (coverage.compute_ns, coverage.costed_pct) == (12_133_585, 100.0)  # before: 39.62 %


def test_pallas_cost_estimate_is_the_custom_calls_cost():
    """A Pallas/Mosaic kernel's declared cost (pallas_call(cost_estimate=...)), which XLA keeps in the custom
    call's backend config, is its FLOPs and bytes (source 'cost_estimate'); a custom call that declares none and
    whose target tracesql does not know has no FLOPs. The module is made here: no public profile with a Pallas
    kernel was found (a 256×512 · 512×128 f32 matmul kernel, its estimate counted by hand)."""
    from tracesql.readers import hlo
    from tracesql.readers.proto import messages

    module = messages()["HloModuleProto"](name="pallas", entry_computation_id=1)
    computation = module.computations.add(name="main", id=1, root_id=3)
    f32 = 11  # xla.PrimitiveType F32
    for i, dims in ((1, [256, 512]), (2, [512, 128])):
        p = computation.instructions.add(name=f"p{i}", opcode="parameter", id=i, parameter_number=i - 1)
        p.shape.element_type, p.shape.dimensions[:] = f32, dims
    # 2·M·N·K; a, b read and the output written once, 4 bytes each
    estimate = {"flops": 2 * 256 * 128 * 512, "transcendentals": 0,
                "bytes_accessed": (256 * 512 + 512 * 128 + 256 * 128) * 4}
    for i, target, config in ((3, "tpu_custom_call", {"custom_call_config": {"body": "", "cost_estimate": estimate}}),
                              (4, "tpu_custom_call", {"custom_call_config": {"body": ""}}), (5, "my_kernel", {})):
        call = computation.instructions.add(name=f"custom-call.{i}", opcode="custom-call", id=i,
                                            custom_call_target=target, backend_config=json.dumps(config).encode())
        call.operand_ids[:] = [1, 2]
        call.shape.element_type, call.shape.dimensions[:] = f32, [256, 128]
    got = {r["name"]: (r["flops"], r["bytes_accessed"], r["cost_source"]) for r in hlo.op_rows(module, "1")}
    assert got["custom-call.3"] == (33_554_432, 917_504, "cost_estimate")
    # no estimate: operands read once, the output written once (XLA's cost analysis has no FLOPs for it either)
    assert got["custom-call.4"] == got["custom-call.5"] == (None, 917_504, "shapes")
