"""Serving engines' MoE and paged-attention ops, costed from what the trace records around them (30_flops.sql,
serving_op_kind): hand counts on the bundled traces, cross-checked against the kernels the raw trace launched and
against the formulas of the equivalent aten ops (op_flops of _grouped_mm; SDPA's is checked against torch's
FlopCounterMode in test_flops.py)."""

import json

import pytest

import tracesql
from conftest import DATASETS, corpus_path, empty_session, raw_events

B200 = DATASETS / "tracelens_b200_eager"
SGLANG = DATASETS / "tracelens_sglang_decode"
INFERENCE = ("tracelens", "tests", "traces", "inference")


def test_vllm_moe_forward_from_its_buffers_and_kernels(ingested):
    """vLLM's MoE with MXFP4 weights on the B200 (GPT-OSS, tensor-parallel): the op records the hidden states
    [888, 3072] and router logits [888, 128] (128 experts); top-k 4 comes from its routing buffers [888, 4], the
    experts' per-rank intermediate size 512 from the activation buffer [5472, 512] between the two GEMMs."""
    con = tracesql.connect(ingested(B200))
    rows = con.sql("SELECT DISTINCT family, dtype, flops, bytes, counted FROM op_costs() "
                   "WHERE name = 'vllm::moe_forward'").fetchall()
    t, h, e, k, i = 888, 3072, 128, 4, 512
    # gate+up [T·k, H]·[H, 2I] and down [T·k, I]·[I, H]; every expert's weights read once (T·k = 3552 >= 128) at
    # 4 bits plus one scale byte per 32; hidden states and router logits read, the bf16 output written
    weights = e * 3 * h * i * (0.5 + 1 / 32)
    assert rows == [("gemm", "mxfp8", 6 * t * k * h * i, 2 * t * h * 2 + t * e * 2 + weights, True)]
    assert rows[0][2] == 33_520_877_568
    # the kernels agree: TRT-LLM's gate+up GEMM (MxE4m3 activations, MxE2m1 weights, SwiGLU fused) tiles its
    # 2·I output rows by 128 (grid.x 8), the down GEMM its H rows (grid.x 24)
    grids = {ev["name"].split("_")[1]: ev["args"]["grid"][0] * 128
             for ev in raw_events(B200 / "eager_trace.json.gz") if ev.get("cat") == "kernel"
             and ev["name"].startswith("bmm_")}
    assert grids == {"MxE4m3": 2 * i, "Bfloat16": h}
    # the same two grouped GEMMs as aten::_grouped_mm (tokens routed to 128 experts) cost the same
    grouped = con.sql(
        "SELECT op_flops('aten::_grouped_mm', [[3552, 3072], [128, 3072, 1024], [128]], "
        "                ['c10::BFloat16', 'c10::BFloat16', 'int'], ['', '', '']) "
        "     + op_flops('aten::_grouped_mm', [[3552, 512], [128, 512, 3072], [128]], "
        "                ['c10::BFloat16', 'c10::BFloat16', 'int'], ['', '', ''])").fetchall()[0][0]
    assert grouped == rows[0][2]
    # ad hoc, without the buffers the ingest reads around the call, the op has no cost
    assert con.sql("SELECT op_flops('vllm::moe_forward', [[888, 3072], [888, 128], []], "
                   "['c10::BFloat16', 'c10::BFloat16', ''], ['', '', ''])").fetchall() == [(None,)]


def moe_capture(capture_trace, tokens: int) -> tuple[list, list]:
    """The raw capture trace walked by hand: the aten::empty calls (their size and dtype code, Kineto's first two
    Concrete Inputs) that start inside the first vllm::moe_forward of `tokens` tokens on its thread, nested ops'
    included, in order; and the Input Dims of its views of the expert weights (uint8: two FP4 values a byte),
    which the expert GEMM kernels read."""
    events = sorted((e for e in raw_events(capture_trace) if e.get("ph") == "X"), key=lambda e: e["ts"])
    moe = next(e for e in events if e["name"] == "vllm::moe_forward" and e["args"]["Input Dims"][0][0] == tokens)
    inside = [e for e in events if e["tid"] == moe["tid"] and moe["ts"] <= e["ts"] <= moe["ts"] + moe["dur"]]
    return ([e["args"]["Concrete Inputs"][:2] for e in inside if e["name"] == "aten::empty"],
            [e["args"]["Input Dims"][0] for e in inside
             if e["name"] == "aten::view" and e["args"]["Input type"][0] == "unsigned char"])


@pytest.mark.parametrize("trace, t", [("vllm_decode_full", 32), ("vllm_prefilldecode_piecewise", 8192)])
def test_vllm_matmul_ogs_moe_of_graph_replays(ingested, trace, t):
    """vLLM's MoE on MI300X (GPT-OSS-20B: 32 experts, top-4; Triton matmul_ogs, MXFP4 weights), replayed from HIP
    graphs and costed through their capture trace: only the capture's ops that launched kernels are copied onto the
    replay, so each copy of the op carries the buffers it allocated at capture (graph_capture_allocations): its
    TopK's [T, 4] (top-k 4) and the activation after the fused SwiGLU [1, T·4, 2944] (I = 2,944: GPT-OSS's 2,880
    padded for the kernels, as H's 3,072)."""
    folder = corpus_path(*INFERENCE, trace)
    allocations, weights = moe_capture(next((folder / "capture_traces").iterdir()), t)
    h, e, k, i = 3072, 32, 4, 2944
    assert [f"[{t}, {k}]", "15"] in allocations and [f"[1, {t * k}, {i}]", "15"] in allocations  # bf16
    # the expert weights the kernels read agree: gate+up [E, H/2, 2I] and down [E, I/2, H] bytes
    assert weights == [[e, h // 2, 2 * i], [e, i // 2, h]]
    con = tracesql.connect(ingested(folder))
    copies = con.sql("SELECT DISTINCT json_extract_string(args, '$.graph_capture_allocations') FROM slices "
                     "WHERE name = 'vllm::moe_forward'").fetchall()
    assert [json.loads(c) for (c,) in copies] == [allocations]
    rows = con.sql("SELECT family, dtype, flops, bytes, counted, count(*) FROM op_costs() "
                   "WHERE name = 'vllm::moe_forward' GROUP BY ALL").fetchall()
    # gate+up [T·k, H]·[H, 2I] and down [T·k, I]·[I, H] in each of the 24 layers; every expert's weights read once
    # (T·k >= 32) at 4 bits plus one scale byte per 32; hidden states and router logits read, the output written
    assert rows == [("gemm", "bf16", 6 * t * k * h * i, 2 * t * h * 2 + t * e * 2 + e * 3 * h * i * (0.5 + 1 / 32),
                     True, 24)]
    # the same two GEMMs as aten::_grouped_mm (the T·k routed tokens over 32 experts) cost the same
    grouped = con.sql(
        f"SELECT op_flops('aten::_grouped_mm', [[{t * k}, {h}], [{e}, {h}, {2 * i}], [{e}]], "
        f"                ['c10::BFloat16', 'c10::BFloat16', 'int'], ['', '', '']) "
        f"     + op_flops('aten::_grouped_mm', [[{t * k}, {i}], [{e}, {i}, {h}], [{e}]], "
        f"                ['c10::BFloat16', 'c10::BFloat16', 'int'], ['', '', ''])").fetchall()[0][0]
    assert grouped == rows[0][2]
    # its routing (TopK, SortTokens) has a cost of its own, but runs inside the costed MoE: its work, not counted
    assert con.sql("SELECT DISTINCT name, flops IS NOT NULL, counted FROM op_costs() "
                   "WHERE name IN ('TopK', 'SortTokens') ORDER BY name").fetchall() == [
        ("SortTokens", True, False), ("TopK", True, False)]


def test_sglang_paged_decode_attention_from_the_steps_batch(ingested):
    """SGLang's decode (HIP-graph replay, costed through its capture trace): aiter's paged_attention_ragged records
    the KV cache's pages, not the sequences' lengths. The step's annotation does: 32 decode requests holding
    32,785 keys in all (execute_32_context_0(...)_generation_32(sq32sk32785sqsq32sqsk32785))."""
    run = ingested(SGLANG)
    annotations = [ev["name"] for ev in raw_events(SGLANG / "sglang_Qwen3-8B_decode.json.gz")
                   if ev.get("name", "").startswith("execute_")]
    assert annotations == ["execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk32785sqsq32sqsk32785)"]
    con = tracesql.connect(run)
    rows = con.sql("SELECT family, dtype, flops, bytes, counted, count(*) FROM op_costs() "
                   "WHERE name = 'sglang_profiler::attention_paged_attention_ragged_100' GROUP BY ALL").fetchall()
    hq, hkv, d, keys = 32, 8, 128, 32_785
    # one query per request: 2·Hq·(d_qk + d_v) per key; the query read, the output written (bf16 [32, 32, 128]),
    # every cached key and value read once (bf16, 8 KV heads)
    assert rows == [("attention", "bf16", 2 * hq * 2 * d * keys, 2 * 32 * hq * d * 2 + keys * hkv * 2 * d * 2,
                     True, 36)]
    assert rows[0][2] == 537_149_440
    # decode attention is linear in the keys: SDPA (its formula checked against FlopCounterMode) of one query
    # over all 32,785 keys costs the same; not causal (the query is the last position), so both conventions agree
    sdpa = con.sql("SELECT op_flops('aten::_scaled_dot_product_flash_attention', "
                   "[[1, 32, 1, 128], [1, 32, 32785, 128], [1, 32, 32785, 128], [], []], "
                   "['c10::BFloat16', 'c10::BFloat16', 'c10::BFloat16', 'Scalar', 'Scalar'], "
                   "['', '', '', '0.0', 'False'])").fetchall()[0][0]
    torch_flops = con.sql("SELECT DISTINCT flops FROM op_costs(attention_convention := 'torch') "
                          "WHERE name = 'sglang_profiler::attention_paged_attention_ragged_100'").fetchall()
    assert sdpa == rows[0][2] and torch_flops == [(sdpa,)]


def test_vllm_prefill_attention_from_the_steps_batch(ingested):
    """The B200's prefill: one request of 888 tokens (execute_context_1(888_788544)_generation_0(0)), FP8 attention
    (query quantized to the FP8 KV cache), 8 query heads and 1 KV head of 64 per rank."""
    con = tracesql.connect(ingested(B200))
    rows = con.sql("SELECT DISTINCT family, dtype, flops, bytes, counted FROM op_costs() "
                   "WHERE name = 'vllm::unified_attention_with_output'").fetchall()
    t, hq, d = 888, 8, 64
    # SDPA's causal prefill over the same tokens, checked against FlopCounterMode ('torch') and halved ('flash')
    sdpa = {c: con.sql(f"SELECT op_flops('aten::_scaled_dot_product_flash_attention', "
                       f"[[1, 8, 888, 64], [1, 8, 888, 64], [1, 8, 888, 64], [], []], "
                       f"['c10::BFloat16', 'c10::BFloat16', 'c10::BFloat16', 'Scalar', 'Scalar'], "
                       f"['', '', '', '0.0', 'True'], attention_convention := '{c}')").fetchall()[0][0]
            for c in ("flash", "torch")}
    assert sdpa == {"flash": 4 * hq * t * t * d / 2, "torch": 4 * hq * t * t * d}
    torch_flops = con.sql("SELECT DISTINCT flops FROM op_costs(attention_convention := 'torch') "
                          "WHERE name = 'vllm::unified_attention_with_output'").fetchall()
    assert torch_flops == [(sdpa["torch"],)]
    # bytes: the fp8 query read, the new bf16 key and value read (to go into the cache), the bf16 output written,
    # the 888 cached keys and values read in the cache's fp8 (1 KV head)
    assert rows == [("attention", "fp8", sdpa["flash"], t * hq * d + 2 * t * d * 2 + t * hq * d * 2 + t * 2 * d,
                     True)]


def test_aiter_paged_prefill_hand_count():
    """SGLang's prefill of TraceLens' corpus (sglang_prefilldecode): aiter::mha_batch_prefill over 15 fresh requests
    of 1,024 tokens (execute_15360_context_15(sq15360sk15360sqsq15728640sqsk15728640)_generation_0(...)), its
    arguments and annotation as recorded, costed by the formulas the ingest runs."""
    con = empty_session()
    dims = [[15360, 32, 128], [835874, 8, 128], [835874, 8, 128], [16], [16], [15616]] + [[]] * 12
    types = ["c10::BFloat16"] * 3 + ["int"] * 3 + ["Scalar"] * 12
    values = [""] * 6 + ["1024", "1024", "0.", "0.088388347648318447", "0.", "False", "True", "-1", "-1", "0",
                         "False", "False"]
    batch = "execute_15360_context_15(sq15360sk15360sqsq15728640sqsk15728640)_generation_0(sq0sk0sqsq0sqsk0)"
    # what the ingest hands the formula (op_costs.sql serving_context): the step's annotation
    flash, torch, bytes_ = con.execute(
        "SELECT c.flash, c.torch, c.bytes FROM (SELECT serving_op_cost('aiter::mha_batch_prefill', d, "
        "op_args(d, t, v), x) AS c FROM (SELECT ?::BIGINT[][] AS d, ?::VARCHAR[] AS t, ?::VARCHAR[] AS v, "
        "{'allocs': NULL::STRUCT(shape BIGINT[], dtype INTEGER)[], 'kernels': NULL::VARCHAR, 'batch': ?::VARCHAR} AS x))",
        [dims, types, values, batch]).fetchall()[0]
    # per request the causal mask keeps 1024·1025/2 of the 1024² pairs; 2·Hq·(d_qk + d_v) = 16,384 FLOPs each
    assert flash == 16_384 * 15 * 1024 * 1025 / 2 == 128_974_848_000
    # the query read, the output [15360, 32, 128] written, 15,360 cached keys and values of 8 heads read (bf16)
    assert bytes_ == 2 * 15360 * 32 * 128 * 2 + 15360 * 8 * 256 * 2
    # the whole matrices ('torch') are SDPA's over the 15 requests, its formula checked against FlopCounterMode
    sdpa = con.sql("SELECT op_flops('aten::_scaled_dot_product_flash_attention', "
                   "[[15, 32, 1024, 128], [15, 32, 1024, 128], [15, 32, 1024, 128], [], []], "
                   "['c10::BFloat16', 'c10::BFloat16', 'c10::BFloat16', 'Scalar', 'Scalar'], "
                   "['', '', '', '0.0', 'True'], attention_convention := 'torch')").fetchall()[0][0]
    assert torch == sdpa == 257_698_037_760
