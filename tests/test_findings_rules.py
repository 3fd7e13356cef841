"""The findings rules one by one on real traces: each rule's evidence against the curated query that measures the
same thing (a second path to its numbers), and its saving against the what_if command its row cites."""

from __future__ import annotations

import re
import shlex

import pandas as pd
import pytest

import tracesql
from conftest import DATASETS, corpus_path, raw_events
from tracesql import findings, queries

B200 = DATASETS / "tracelens_b200_eager"  # vLLM on a B200, one execute_model range, host-bound: shapes recorded


def rule_rows(run, name: str, **params):
    """One rule's rows, every step whatever its saving (min_saving_pct 0, for the rules that price a saving), as
    the findings command runs it."""
    (rule,) = [r for r in findings.catalogue() if r.name == name]
    everything = {"min_saving_pct": 0} if "min_saving_pct" in rule.params else {}
    return queries.run(tracesql.connect(run), rule, {"run": "RUN"} | everything | params).df()


def cited(run, command: str):
    """The rows of the `tracesql query what_if RUN -p k=v ...` command a finding cites, run on `run`."""
    argv = shlex.split(command)
    assert argv[:4] == ["tracesql", "query", "what_if", "RUN"]
    return tracesql.query("what_if", run, **dict(p.split("=", 1) for p in argv[5::2]))


def test_gemm_under_roofline_on_b200(ingested):
    """The three aten::addmm shapes and the MoE's grouped GEMMs (vllm::moe_forward, family gemm) of vLLM's B200
    trace run at 11.6 to 24.6 % of their roofline (the roofline query's rows); the what-if at 70 % of it saves
    0.1 ms: the step waits for the host, not its GEMMs (only its 161 cudaMemcpyAsync calls, which wait for the
    device, return sooner)."""
    run = ingested(B200)
    (row,) = rule_rows(run, "gemm_under_roofline").itertuples()
    roof = tracesql.query("roofline", run, top=100)
    gemm_ops = ["aten::addmm", "vllm::moe_forward"]
    gemms = roof[roof.name.isin(gemm_ops) & (roof.roofline_pct < 35)]
    assert len(gemms) == 4 and gemms.calls.sum() == 144
    assert sorted(gemms.roofline_pct.round(1)) == [11.6, 18.2, 18.4, 24.6]
    device_ms, roofline_ms = gemms.device_ns.sum() / 1e6, gemms.roofline_ns.sum() / 1e6
    faster = round(100 - 100 * gemms.roofline_ns.sum() / 0.7 / gemms.device_ns.sum(), 2)
    assert row.evidence.startswith(
        f"144 GEMM calls of 4 shapes take {device_ms:.2f} ms at {100 * roofline_ms / device_ms:.0f} % of their "
        f"roofline ({roofline_ms:.2f} ms at the roof); at 70 % of it (kernels {faster:.2f} % faster) the step takes "
        "0.10 ms less of 87.22 ms (compute is 0 % of its critical path); worst shape aten::addmm [[128], ")
    assert faster == 66.21 and row.saving_ns == 103_662 and row.saving_pct == 0.12
    # the kernels the what-if makes faster are the ones those calls launched
    kernels = tracesql.connect(run).sql(
        "SELECT DISTINCT k.name FROM slices k JOIN ops o ON o.rank = k.rank AND o.op_id = k.op_id "
        f"WHERE k.kind = 'kernel' AND o.name IN {tuple(gemm_ops)}").df().name
    assert re.search(r"faster=\^\((.*)\)\$", row.query)[1].replace("\\", "").split("|") == sorted(kernels)
    (replayed,) = cited(run, row.query).itertuples()
    assert (replayed.saving_ns, replayed.predicted_ns) == (103_662, 87_216_931 - 103_662)


def test_idle_bubbles_on_b200(ingested):
    """vLLM's B200 step: the device sits idle in 250 gaps of 100 µs or more, all waiting for the host (the bubbles
    query's macro gaps of scope device); the what-if without the host work on the path in them saves 24.6 %."""
    run = ingested(B200)
    (row,) = rule_rows(run, "idle_bubbles").itertuples()
    bubbles = tracesql.query("bubbles", run, scope="device").set_index("category")
    host = bubbles.loc["host_wait"]
    assert (host.macro_gaps, host.macro_idle_ns) == (250, 46_640_206) and bubbles.macro_gaps.sum() == 250
    assert row.evidence.startswith(
        "the device sits idle 46.64 ms of 87.22 ms in 250 gaps of 100 us or more, 250 of them (46.64 ms) waiting "
        "for the host; on the critical path in the run's host gaps the host was in aten::addmm (9.10 ms), ")
    (replayed,) = cited(run, row.query).itertuples()
    assert replayed.saving_ns == row.saving_ns == 21_347_769 and replayed.saving_pct == row.saving_pct == 24.48


def test_tiny_kernels_on_b200(ingested):
    """vLLM's B200 step: 532 of its 768 kernels are shorter than the median launch call (7.161 µs, the launch
    query's runtime_p50_ns), counted again from the raw JSON; with launches costing nothing it saves 6.69 %."""
    run = ingested(B200)
    (row,) = rule_rows(run, "tiny_kernels").itertuples()
    (launch,) = tracesql.query("launch", run).query("step == 0").itertuples()
    assert (launch.calls, launch.runtime_p50_ns) == (929, 7161)
    kernels = [e for e in raw_events(B200 / "eager_trace.json.gz") if e.get("cat") == "kernel"]
    tiny = [e for e in kernels if round(e["dur"] * 1000) < launch.runtime_p50_ns]
    assert (len(tiny), len(kernels)) == (532, 768)
    assert row.evidence.startswith(
        f"532 of 768 kernels (69 %) are shorter than the launch overhead (7.2 us, the median launch call), "
        f"{sum(round(e['dur'] * 1000) for e in tiny) / 1e6:.2f} ms in all; 929 launch calls take ")
    (replayed,) = cited(run, row.query).itertuples()
    assert replayed.saving_ns == row.saving_ns == 5_966_250 and row.saving_pct == 6.84
    # the device side alone (the launch_overhead rule's change) saves 0.5 %: the host is what the step waits for
    # (its cudaMemcpyAsync calls, which wait for the device, return sooner)
    assert tracesql.query("what_if", run, no_launch_overhead=1).saving_ns.tolist() == [471_634]


def test_kernel_sequences_on_b200(ingested):
    """vLLM's B200 step runs vllm::moe_forward's 7 kernels 36 times (the kernel_sequences query's pattern, which
    the row cites); fused, the host-bound step loses what the 6 × 36 launch calls fusing removes took on the host
    (the replay's path runs through them), not the 12.40 ms of device gaps inside them (the device waits anyway)."""
    run = ingested(B200)
    (row,) = rule_rows(run, "kernel_sequences").itertuples()
    argv = shlex.split(row.query)
    assert argv[:4] == ["tracesql", "query", "kernel_sequences", "RUN"]
    (pattern,) = tracesql.query("kernel_sequences", run, **dict(p.split("=", 1) for p in argv[5::2])).query(
        "pattern_rank == 1").itertuples()
    assert (pattern.root, pattern.occurrences, pattern.kernels, pattern.kernel_ns) == (
        "vllm::moe_forward", 36, 7, 6_078_426)
    con = tracesql.connect(run)
    freed = con.sql("""
        WITH roots AS (SELECT * FROM ops WHERE name = 'vllm::moe_forward' AND op_depth = 0),
        kernels AS (
            SELECT r.op_id, l.dur, row_number() OVER (PARTITION BY r.op_id ORDER BY d.ts) AS nth
            FROM roots r
            JOIN slices l ON l.rank = r.rank AND l.tid = r.tid AND l.ts BETWEEN r.ts AND r.ts + r.dur
             AND l.kind IN ('runtime', 'driver')
            JOIN slices d ON d.rank = l.rank AND d.launch_id = l.slice_id AND d.kind = 'kernel')
        SELECT count(*), sum(dur) FROM kernels WHERE nth > 1""").fetchall()
    assert freed == [(216, 1_397_329)]
    assert row.evidence == (
        "vllm::moe_forward launches the same 7 kernels 36 times in the step (6.08 ms of kernels; 36 times over the "
        "rank's steps); fusing the 36 that run back to back on one stream removes 12.40 ms of gaps between their "
        "kernels and 216 launch calls (1.40 ms): the step takes 1.50 ms less of 87.22 ms")
    # plus 0.10 ms of the cudaMemcpyAsync calls that wait for the device (they return sooner: the same 103,662 ns
    # as the GEMMs' what-if above)
    assert row.saving_ns == freed[0][1] + 103_662 and row.saving_pct == 1.72


def test_xla_rules_on_the_tpu_inference(ingested):
    """XProf's TPU v6e inference profile (no steps: its profiled range, 98.15 s): the devices wait 194 ms at each
    copy-done of a 5 GiB copy; without those waits the replay saves the least-saving device's copy-done time
    (tests/test_critical_path.py sums it). Its all-reduces take 10.2x what 5 GiB over a 448 GB/s ICI link needs,
    but 0.34 % of the range: a finding only without the threshold. No copy or transpose, no capacity recorded."""
    run = ingested(DATASETS / "xprof_tpu_inference")
    (wait,) = rule_rows(run, "xla_async_wait").itertuples()
    assert (wait.saving_ns, wait.saving_pct) == (75_993_796_650, 77.42) and pd.isna(wait.step)
    assert wait.evidence.startswith("2400 async done ops on 4 devices wait 304033.21 ms in all")
    assert "longest copy-done.4 (194.46 ms, started by copy-start.4)" in wait.evidence
    (theory,) = rule_rows(run, "xla_over_theory").itertuples()
    (measured_ms,), = tracesql.connect(run).sql("SELECT sum(dur) / 1e6 FROM device_activity() WHERE name = 'all-reduce'").fetchall()
    theory_ms = 12 * 1_342_177_280 * 4 * 2 * (2 - 1) / 2 / 448e9 * 1e3  # f32 elements, all-reduce of 2 over ICI
    assert theory.evidence.startswith(f"12 executions of 1 ops (12 collectives) take {measured_ms:.2f} ms where "
                                      f"their HLO shapes need {theory_ms:.2f} ms (10.2x)")
    assert theory.saving_ns == 329_102_575 and theory.saving_pct == 0.34  # under the default 5 %: no finding
    assert rule_rows(run, "xla_data_formatting").empty and rule_rows(run, "memory_peak").empty


def test_exposed_collectives_of_xla_on_cpu(ingested):
    """JAX's FFN sharded over 8 CPU devices: XLA on the CPU runs its all-gathers and reduce-scatters between the
    matmuls, never overlapped; hidden, the steady steps take 27 % less (the what_if query's number)."""
    run = ingested(DATASETS / "jax_cpu_8dev_ffn")
    found = rule_rows(run, "exposed_communication", min_saving_pct=5)
    hidden = tracesql.query("what_if", run, hide_communication=1).set_index("step")
    assert sorted(found.step) == [1, 2]
    assert all(row.saving_ns == hidden.saving_ns[row.step] for row in found.itertuples())
    assert sorted(found.saving_pct) == [26.79, 26.99]


def test_memory_peak_against_the_device_capacity(ingested):
    """TensorFlow's GPU profile: the BFC allocators' peaks (the memory query's) against the 15.78 GiB the devices
    record: 36.6 %, a finding at min_peak_pct=30 (saving 0), none at the default 90 %."""
    run = ingested(DATASETS / "xprof_gpu_multi_worker")
    assert rule_rows(run, "memory_peak").empty
    found = rule_rows(run, "memory_peak", min_peak_pct=30)
    peaks = tracesql.query("memory", run).groupby("device_id").peak_allocated_bytes.max()
    assert [int(e.split()[1]) for e in found.evidence] == [4, 6] and (found.saving_ns == 0).all()
    assert all(f"peak {peaks[d] / 2**30:.2f} GiB of 15.78 GiB (36.6 %)" in e for d, e in zip([4, 6], found.evidence))


def test_xla_data_formatting_around_convolutions(ingested):
    """JAX convolutions on an MI300X (TraceLens' jax_conv_minimal_08): the NCHW/NHWC transposes around the
    cuDNN-style convolution calls take 55 % of the XLA ops' time; the profiled range is bound by the host, so
    removing them saves 0, which the evidence says."""
    run = ingested(corpus_path("tracelens", "tests", "traces", "mi300", "jax_conv_minimal_08", "tw003.xplane.pb"))
    (row,) = rule_rows(run, "xla_data_formatting").itertuples()
    assert row.evidence.startswith("119 copy / transpose ops take 15.02 ms, 55 % of the step's 27.55 ms of XLA ops")
    assert row.saving_ns == 0
    # its 8 devices' gaps add up to more than the range: the evidence counts them per device
    (bubbles,) = rule_rows(run, "idle_bubbles").itertuples()
    assert bubbles.evidence.startswith("its 8 devices sit idle 800.34 ms in all (the most idle 133.49 ms of 164.91 ms)")
