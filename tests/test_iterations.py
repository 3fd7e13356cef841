"""Inference iterations: steps recognised from vLLM / SGLang range names (and --step-pattern), and the
`iterations` query, each number checked against plain Python over the trace's events."""

from __future__ import annotations

import numpy as np
import pytest

import tracesql
from conftest import DATASETS, corpus_path, raw_events, write_trace
from tracesql import step_rules
from tracesql.errors import TraceError

INFERENCE = ("tracelens", "tests", "traces", "inference")
LAUNCH_CATS = ("cuda_runtime", "hip_runtime", "cuda_driver", "hip_driver", "runtime")
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")

# (name, host µs, kernel A µs, kernel B µs, idle µs after): a prefill, decodes, two prefills between decodes,
# a mixed batch (chunked prefill), an idle batch
SGLANG = [
    ("step[EXTEND bs=4 toks=2048]", 900, 500, 200, 40),
    ("step[DECODE bs=4]", 300, 100, 20, 30),
    ("step[DECODE bs=4]", 310, 110, 25, 35),
    ("step[EXTEND bs=2 toks=1024]", 600, 300, 100, 20),
    ("step[EXTEND bs=1 toks=512]", 500, 200, 50, 25),
    ("step[DECODE bs=7]", 320, 130, 22, 31),
    ("step[MIXED bs=8 toks=300]", 700, 330, 90, 45),
    ("step[DECODE bs=8]", 340, 140, 21, 33),
    ("step[IDLE]", 50, 10, 5, 60),
    ("step[DECODE bs=8]", 335, 150, 24, 29),
]


def iteration_trace(path, names=SGLANG, cat="user_annotation"):
    """One host range per iteration, each launching two kernels (a 2 µs gap between them) from inside it."""
    events, ts, corr = [], 1000, 0
    for name, host, ka, kb, idle in names:
        events.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": host, "pid": 1, "tid": 1})
        k = ts + 5
        for i, kdur in enumerate((ka, kb)):
            corr += 1
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts + 1 + i,
                           "dur": 1, "pid": 1, "tid": 1, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": f"k{corr}", "ts": k, "dur": kdur, "pid": 0,
                           "tid": 7, "args": {"correlation": corr, "device": 0, "stream": 7}})
            k += kdur + 2
        ts += host + idle
    return write_trace(path, events)


def expected_iterations(names=SGLANG) -> list[dict]:
    """What `iterations` must say about iteration_trace's ranges, computed here in plain Python (ns)."""
    rows, ts = [], 1000
    for name, host, ka, kb, idle in names:
        m = step_rules.RULES[0].fields(__import__("re").search(step_rules.RULES[0].pattern, name))
        rows.append({**m, "ts": ts * 1000, "host_ns": host * 1000, "device_ts": (ts + 5) * 1000,
                     "device_ns": (ka + 2 + kb) * 1000})
        ts += host + idle
    for i, r in enumerate(rows):
        r["end"] = r["device_ts"] + r["device_ns"]
        # the step window (steps.device_dur): to the next iteration's first device event; the last to its end
        r["window_ns"] = (rows[i + 1]["device_ts"] if i + 1 < len(rows) else r["end"]) - r["device_ts"]
        r["gap_before_ns"] = r["ts"] - (rows[i - 1]["ts"] + rows[i - 1]["host_ns"]) if i else None
        r["device_gap_before_ns"] = (r["device_ts"] - max(p["device_ts"] + p["device_ns"] for p in rows[:i])
                                     if i else None)
    emitting = [r for r in rows if r["phase"] in ("decode", "mixed")]
    for i, r in enumerate(emitting):
        before = rows.index(emitting[i - 1]) + 1 if i else 0
        between = [p for p in rows[before:rows.index(r)] if p["phase"] == "prefill"]
        r["prefills_before"] = len(between)
        r["prefill_ns_before"] = sum(p["device_ns"] for p in between)
        r["token_interval_ns"] = r["end"] - emitting[i - 1]["end"] if i else None
    return rows


def test_sglang_iterations_every_column_by_hand(tmp_path):
    run = tmp_path / "run"
    tracesql.ingest([iteration_trace(tmp_path / "sglang.json")], run)
    got = tracesql.query("iterations", run)
    want = expected_iterations()
    assert len(got) == len(want)
    assert list(got.rule.unique()) == ["sglang"]
    assert list(got.phase) == ["prefill", "decode", "decode", "prefill", "prefill", "decode", "mixed", "decode",
                               "idle", "decode"]
    assert list(got.step) == list(range(len(want)))
    for g, w in zip(got.itertuples(), want):
        for col in ("batch_size", "tokens", "prefill_tokens"):
            assert _same(getattr(g, col), w[col]), col
        assert g.host_ns == w["host_ns"] and g.device_ns == w["device_ns"] == g.iteration_ns
        assert g.window_ns == w["window_ns"]
        assert _same(g.gap_before_ns, w["gap_before_ns"]) and _same(g.device_gap_before_ns, w["device_gap_before_ns"])
        if w["phase"] in ("decode", "mixed"):
            assert g.prefills_before == w["prefills_before"] and g.prefill_ns_before == w["prefill_ns_before"]
            assert _same(g.token_interval_ns, w["token_interval_ns"])
        else:
            assert _null(g.prefills_before)
    # the decode right after the two prefills waited for both of them
    assert got.prefills_before.iloc[5] == 2 and got.prefill_ns_before.iloc[5] == (300 + 2 + 100 + 200 + 2 + 50) * 1000
    # per-phase percentiles: numpy's linear interpolation = quantile_cont
    for phase in ("prefill", "decode"):
        times = [w["device_ns"] for w in want if w["phase"] == phase]
        row = got[got.phase == phase].iloc[0]
        assert row.phase_iterations == len(times)
        for q, col in ((50, "phase_p50_ns"), (90, "phase_p90_ns"), (99, "phase_p99_ns")):
            assert row[col] == pytest.approx(np.percentile(times, q))
    intervals = [w["token_interval_ns"] for w in want if w.get("token_interval_ns") is not None]
    assert got.itl_p50_ns.dropna().iloc[0] == pytest.approx(np.percentile(intervals, 50))
    assert got.itl_p99_ns.dropna().iloc[0] == pytest.approx(np.percentile(intervals, 99))
    prefill = got.iloc[0]
    assert prefill.tokens_per_s == pytest.approx(2048 / (702e-6))


def _same(a, b) -> bool:
    if b is None:
        return _null(a)
    return a == b


def _null(v) -> bool:
    import pandas as pd

    return v is None or bool(pd.isna(v))


@pytest.mark.parametrize("name, rule, fields", [
    ("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)", "vllm",
     ("decode", 32, 32, 0)),
    ("execute_15360_context_15(sq15360sk15360sqsq15728640sqsk15728640)_generation_0(sq0sk0sqsq0sqsk0)", "vllm",
     ("prefill", 15, 15360, 15360)),
    ("execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)_generation_37(sq37sk34489sqsq37sqsk34489)", "vllm",
     ("mixed", 46, 8192, 8155)),
    ("execute_new_2_cached_30", "vllm_new_cached", ("mixed", 32, None, None)),
    ("execute_new_0_cached_30", "vllm_new_cached", ("decode", 30, None, None)),
    ("step[DECODE bs=32]", "sglang", ("decode", 32, 32, 0)),
    ("step[EXTEND bs=15 toks=15360]", "sglang", ("prefill", 15, 15360, 15360)),
    ("step[TARGET_VERIFY bs=4 toks=16]", "sglang", ("decode", 4, 16, 0)),
    ("ProfilerStep#7", "profiler_step", (None, None, None, None)),
])
def test_builtin_rules_read_phase_batch_and_tokens(name, rule, fields, tmp_path):
    run = tmp_path / "run"
    tracesql.ingest([iteration_trace(tmp_path / "t.json", [(name, 100, 10, 10, 10)])], run)
    s = tracesql.query("iterations", run).iloc[0]
    assert s.rule == rule
    assert tuple(None if _null(v) else v for v in (s.phase, s.batch_size, s.tokens, s.prefill_tokens)) == fields
    if rule == "profiler_step":
        assert s.step == 7


def test_iteration_names_win_over_profiler_step_and_execute_model(tmp_path):
    """One rule per rank: SGLang's iterations, not the ProfilerStep around them; vLLM's execute_model function
    only when nothing else names the iterations."""
    names = [("ProfilerStep#3", 2000, 10, 10, 10)]
    events = [{**e, "ts": e["ts"] + 50} for e in raw_events(iteration_trace(tmp_path / "a.json", SGLANG[:3]))]
    events += raw_events(iteration_trace(tmp_path / "b.json", names))
    run = tmp_path / "run"
    tracesql.ingest([write_trace(tmp_path / "both.json", events)], run)
    assert list(tracesql.query("iterations", run).rule) == ["sglang"] * 3
    fn = [("vllm/v1/worker/gpu_model_runner.py(3380): execute_model", 100, 10, 10, 10)] * 2
    run2 = tmp_path / "run2"
    tracesql.ingest([iteration_trace(tmp_path / "fn.json", fn, cat="python_function")], run2)
    got = tracesql.query("iterations", run2)
    assert list(got.rule) == ["vllm_execute_model"] * 2 and list(got.step) == [0, 1]


def test_step_pattern_at_ingest(tmp_path):
    names = [(f"serve it={i} phase=decode n=16", 100, 10, 10, 10) for i in range(5, 8)]
    names.insert(1, ("serve it=6x phase=prefill n=3", 100, 10, 10, 10))
    trace = iteration_trace(tmp_path / "custom.json", names)
    run = tmp_path / "run"
    tracesql.ingest([trace], run)
    assert tracesql.query("iterations", run).empty  # no built-in rule knows these names
    pattern = r"^serve it=(?P<step>\d+) phase=(?P<phase>\w+) n=(?P<batch>\d+)$"
    result = tracesql.ingest([trace], run, step_pattern=pattern)
    assert result.ingested  # a new pattern reads the file again
    got = tracesql.query("iterations", run)
    assert list(got.step) == [5, 6, 7] and set(got.rule) == {"user"}
    assert list(got.batch_size) == [16, 16, 16] and set(got.phase) == {"decode"}
    assert not tracesql.ingest([trace], run, step_pattern=pattern).ingested  # same pattern: unchanged
    # a pattern that matches nothing: the built-in rules still apply, and the ingest says so
    sglang = tmp_path / "sglang"
    result = tracesql.ingest([iteration_trace(tmp_path / "s.json")], sglang, step_pattern="^nothing$")
    assert any("matched no range; steps are sglang ranges" in w for w in result.warnings)
    assert len(tracesql.query("iterations", sglang)) == len(SGLANG)


@pytest.mark.parametrize("pattern, message", [
    ("step[", "--step-pattern: 'step[' is not a regular expression"),
    ("(?P<steps>\\d+)", "unknown named group(s) steps"),
    ("a(?=b)", "RE2"),
])
def test_bad_step_pattern_is_one_line_error(pattern, message, tmp_path):
    with pytest.raises(TraceError) as e:
        tracesql.ingest([iteration_trace(tmp_path / "t.json")], tmp_path / "run", step_pattern=pattern)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_step_pattern_on_the_command_line(tmp_path):
    from click.testing import CliRunner

    from tracesql.cli import main

    trace = iteration_trace(tmp_path / "t.json", [("iter 4", 100, 10, 10, 10), ("iter 5", 100, 10, 10, 10)])
    out = CliRunner().invoke(main, ["ingest", str(trace), "-o", str(tmp_path / "run"), "-q",
                                    "--step-pattern", r"^iter (?P<step>\d+)$"])
    assert out.exit_code == 0, out.output
    assert list(tracesql.query("steps", tmp_path / "run").step) == [4, 5]
    bad = CliRunner().invoke(main, ["ingest", str(trace), "-o", str(tmp_path / "run2"), "--step-pattern", "("])
    assert bad.exit_code == 1 and "--step-pattern" in bad.output


def device_span(events, rng) -> tuple[int, int, int]:
    """Second method: (first device start, last device end, count) of the device work launched by a runtime call
    that started inside the host range `rng` (any thread: a step is a span of time), in ns."""
    t0, t1 = rng["ts"], rng["ts"] + rng["dur"]
    corr = {e["args"]["correlation"] for e in events
            if e.get("ph") == "X" and e.get("cat") in LAUNCH_CATS and t0 <= e["ts"] < t1
            and "correlation" in e.get("args", {})}
    work = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS
            and e.get("args", {}).get("correlation") in corr]
    first = min(e["ts"] for e in work)
    last = max(e["ts"] + e["dur"] for e in work)
    return round(first * 1000), round(last * 1000), len(work)


def check_real(run, trace, rule, fields):
    events = raw_events(trace)
    got = tracesql.query("iterations", run)
    assert len(got) == 1
    row = got.iloc[0]
    assert row.rule == rule
    assert (row.phase, row.batch_size, row.tokens, row.prefill_tokens) == fields
    names = {"sglang": "step[", "vllm": "execute_"}
    rng = next(e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"
               and e["name"].startswith(names[rule]))
    first, last, n = device_span(events, rng)
    assert row.host_ns == round(rng["dur"] * 1000)
    assert abs(row.device_ns - (last - first)) <= 2  # µs with 3 decimals -> ns, rounded at each end
    steps = tracesql.query("steps", run).iloc[0]
    assert steps.kernel_count == n
    return row


def test_vllm_decode_iteration_bundled(ingested):
    trace = DATASETS / "tracelens_vllm_graph_execution" / "graph_execution.json.gz"
    row = check_real(ingested(trace.parent), trace, "vllm", ("decode", 32, 32, 0))
    assert row.host_ns == 2_408_598


@pytest.mark.parametrize("parts, rule, fields, host_ns, device_ns", [
    (("sglang_decode", "sglang_Qwen3-8B_decode.json.gz"), "sglang", ("decode", 32, 32, 0), 465_248_054,
     10_366_887),
    (("sglang_prefilldecode", "sglang_Qwen3-8B_prefilldecode.json.gz"), "sglang", ("prefill", 15, 15360, 15360),
     28_915_862, None),
    (("vllm_prefilldecode_piecewise", "graph_execution.json.gz"), "vllm", ("mixed", 46, 8192, 8155), 26_353_441,
     None),
])
def test_corpus_inference_iterations(parts, rule, fields, host_ns, device_ns, ingested):
    """The issue's example: SGLang's step[DECODE bs=32] takes 465 ms on the host and 10.4 ms on the device."""
    trace = corpus_path(*INFERENCE, *parts)
    row = check_real(ingested(trace), trace, rule, fields)
    assert row.host_ns == host_ns
    if device_ns is not None:
        assert row.device_ns == device_ns


def test_steps_and_mfu_work_on_iterations(ingested):
    """vLLM's decode iteration is a step: `steps` gives its host and device time, `mfu` one row for it."""
    run = ingested(DATASETS / "tracelens_vllm_graph_execution")
    steps = tracesql.query("steps", run)
    assert list(steps.step) == [0] and steps.device_ns.iloc[0] == 10_743_181 and steps.cpu_ns.iloc[0] == 2_408_598
    mfu = tracesql.query("mfu", run, model_flops_per_step=5e11, peak_flops=1e15)
    assert list(mfu.step) == [0] and mfu.step_time_ns.iloc[0] == 10_743_181
    assert mfu.mfu.iloc[0] == pytest.approx(5e11 / (10_743_181e-9 * 1e15))
    assert mfu.hfu.iloc[0] == pytest.approx(mfu.hardware_flops.iloc[0] / (10_743_181e-9 * 1e15))
