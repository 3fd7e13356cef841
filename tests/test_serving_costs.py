"""Serving engines' MoE and paged-attention ops, costed from what the trace records around them (30_flops.sql,
serving_op_kind): hand counts on the bundled traces, cross-checked against the kernels the raw trace launched and
against the formulas of the equivalent aten ops (op_flops of _grouped_mm; SDPA's is checked against torch's
FlopCounterMode in test_flops.py)."""

import pytest

import tracesql
from conftest import DATASETS, raw_events

B200 = DATASETS / "tracelens_b200_eager"


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
