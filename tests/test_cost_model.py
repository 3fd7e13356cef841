"""The cost model beyond GEMM/conv/attention: FLOPs and bytes of elementwise ops (`out=` and in-place variants,
type promotion, broadcasting), reductions, norms forward and backward, softmax, copies and casts, upsampling,
gathers and scatters, vLLM's fused kernels and views, each against a value computed by hand from the op's
semantics; and which ops op_costs() counts when ops nest.

The arguments are written as Kineto records them (torch 2.13, record_shapes=True: every schema argument in
order, an `out=` tensor last, a Python number as a 'Scalar' with its value or a 0-dim 'double' tensor); the
layouts were read off real profiles (tests/data/make_flop_reference.py shows how to record one).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import pytest

import tracesql
from conftest import empty_session, write_trace

F, H, B, L = "float", "c10::Half", "c10::BFloat16", "long int"


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    return empty_session()


def costs(con, calls: dict[str, tuple]) -> dict[str, tuple]:
    """key -> (family, FLOPs, bytes) of op calls (name, dims, types, concrete), in one query (the macros are
    large: binding them once for all calls is much faster than once per call)."""
    rows = [{"key": k, "name": n, "d": d, "t": t, "c": c or [""] * len(d)} for k, (n, d, t, c) in calls.items()]
    out = con.execute("""
        SELECT r.key, op_flop_family(r.name), op_flops(r.name, r.d, r.t, r.c), op_bytes(r.name, r.d, r.t, r.c)
        FROM (SELECT unnest($1::STRUCT(key VARCHAR, name VARCHAR, d BIGINT[][], t VARCHAR[], c VARCHAR[])[]) AS r)
    """, [rows]).fetchall()
    return {k: tuple(v) for k, *v in out}


@pytest.fixture(scope="module")
def by_hand(con) -> dict[str, tuple]:
    return costs(con, {case: spec[:4] for case, spec in CASES.items()})


# name, input dims, input types, concrete inputs, (family, FLOPs, bytes), how the bytes come about
CASES = {
    # --- the examples -----------------------------------------------------------------------------
    "mul_out": ("aten::mul", [[64, 32], [64, 32], [64, 32]], [F, F, F], None,
                ("elementwise", 2048, 24_576)),  # a, b read; out written, not read: 3 · 8192
    "mul_out_named": ("aten::mul.out", [[64, 32], [64, 32], [64, 32]], [F, F, F], None,
                      ("elementwise", 2048, 24_576)),
    "add_fp16_fp32": ("aten::add", [[2048], [2048], []], [H, F, "Scalar"], ["", "", "1"],
                      ("elementwise", 2048, 20_480)),  # 4096 + 8192 read, fp32 result: 8192 written
    # --- elementwise --------------------------------------------------------------------------------------
    "add_inplace_keeps_self_dtype": ("aten::add_", [[2048], [2048], []], [H, F, "Scalar"], ["", "", "1"],
                                     ("elementwise", 2048, 4096 + 8192 + 4096)),
    "mul_out_python_scalar": ("aten::mul", [[64, 32], [], [64, 32]], [F, "double", F], None,
                              ("elementwise", 2048, 8192 + 8 + 8192)),  # the 0-dim double is read once
    "broadcast_bf16_fp16": ("aten::add", [[64, 1], [1, 32], []], [B, H, "Scalar"], ["", "", "1"],
                            ("elementwise", 2048, 128 + 64 + 2048 * 4)),  # bf16 with fp16 -> fp32, [64, 32]
    "int_tensor_times_float": ("aten::mul", [[16, 32], []], [L, "Scalar"], ["", "2.5"],
                               ("elementwise", 512, 512 * 8 + 512 * 4)),  # int64 * 2.5 -> float32
    "comparison_writes_bool": ("aten::gt", [[64, 32], []], [F, "Scalar"], ["", "0"],
                               ("elementwise", 2048, 8192 + 2048)),
    "where": ("aten::where", [[64, 32], [64, 32], [64, 32]], ["bool", F, F], None,
              ("elementwise", 2048, 2048 + 2 * 8192 + 8192)),
    "addcmul_2_flops": ("aten::addcmul_", [[100], [100], [100], []], [F, F, F, "Scalar"], ["", "", "", "1"],
                        ("elementwise", 200, 3 * 400 + 400)),
    # by name a reduction; with a second tensor the elementwise maximum (op_costs' family says 'elementwise')
    "max_of_two_tensors": ("aten::max", [[64, 32], [64, 32]], [F, F], None, ("reduction", 2048, 3 * 8192)),
    # --- reductions -----------------------------------------------------------------------------------------
    "sum_dim": ("aten::sum", [[64, 32], [], [], []], [F, "ScalarList", "Scalar", ""], ["", "[1]", "False", ""],
                ("reduction", 2048, 8192 + 64 * 4)),
    "sum_all": ("aten::sum", [[64, 32], []], [F, ""], None, ("reduction", 2048, 8192 + 4)),
    "sum_of_bool_is_int64": ("aten::sum", [[100], []], ["bool", ""], None, ("reduction", 100, 100 + 8)),
    "sum_out_keepdim": ("aten::sum", [[64, 32], [], [], [], [64, 1]], [F, "ScalarList", "Scalar", "Scalar", F],
                        ["", "[-1]", "True", "6", ""], ("reduction", 2048, 8192 + 256)),
    "max_dim_writes_indices": ("aten::max", [[64, 32], [], []], [F, "Scalar", "Scalar"], ["", "1", "False"],
                               ("reduction", 2048, 8192 + 64 * 4 + 64 * 8)),
    "amax_dim0": ("aten::amax", [[64, 32], [], []], [F, "ScalarList", "Scalar"], ["", "[0]", "False"],
                  ("reduction", 2048, 8192 + 32 * 4)),
    "argmax": ("aten::argmax", [[64, 32], [], []], [F, "Scalar", "Scalar"], ["", "1", "False"],
               ("reduction", 2048, 8192 + 64 * 8)),
    "var_3_flops": ("aten::var", [[64, 32], [], [], []], [F, "ScalarList", "Scalar", "Scalar"],
                    ["", "[1]", "True", "False"], ("reduction", 3 * 2048, 8192 + 256)),
    "vector_norm_all": ("aten::linalg_vector_norm", [[64, 32], [], [], [], []], [F, "Scalar", "", "Scalar", ""],
                        ["", "2", "", "False", ""], ("reduction", 2 * 2048, 8192 + 4)),
    "cumsum_is_a_scan": ("aten::cumsum", [[64, 32], [], []], [F, "Scalar", ""], ["", "1", ""],
                         ("reduction", 2048, 2 * 8192)),
    # --- norms ----------------------------------------------------------------------------------------------
    "layer_norm": ("aten::layer_norm", [[16, 32], [], [32], [32], [], []],
                   [F, "ScalarList", F, F, "Scalar", "Scalar"], ["", "[32]", "", "", "1e-05", "True"],
                   ("norm", 5 * 512, 2048 + 128 + 128 + 2048 + 16 * 2 * 4)),  # + mean and rstd per row
    "layer_norm_backward": ("aten::native_layer_norm_backward",
                            [[16, 32], [16, 32], [], [16, 1], [16, 1], [32], [32], []],
                            [F, F, "ScalarList", F, F, F, F, "ScalarList"],
                            ["", "", "[32]", "", "", "", "", "[True, True, True]"],
                            ("norm", 512 * (8 + 2 + 1), 2048 + 2048 + 64 + 64 + 128 + 2048 + 128 + 128)),
    "layer_norm_backward_input_only": ("aten::native_layer_norm_backward",
                                       [[16, 32], [16, 32], [], [16, 1], [16, 1], [32], [32], []],
                                       [F, F, "ScalarList", F, F, F, F, "ScalarList"],
                                       ["", "", "[32]", "", "", "", "", "[True, False, False]"],
                                       ("norm", 512 * 8, 2048 + 2048 + 64 + 64 + 128 + 2048)),
    "group_norm": ("aten::group_norm", [[4, 8, 6, 6], [], [8], [8], [], []],
                   [F, "Scalar", F, F, "Scalar", "Scalar"], ["", "2", "", "", "1e-05", "True"],
                   ("norm", 5 * 1152, 4608 + 32 + 32 + 4608 + 4 * 2 * 2 * 4)),  # stats: N · groups
    "batch_norm_training": ("aten::native_batch_norm", [[4, 8, 6, 6], [8], [8], [8], [8], [], [], []],
                            [F, F, F, F, F, "Scalar", "Scalar", "Scalar"], ["", "", "", "", "", "True", "0.1", "1e-05"],
                            # running stats read and written, batch stats saved
                            ("norm", 5 * 1152, 4608 + 32 + 32 + 2 * 64 + 4608 + 2 * 8 * 4)),
    "batch_norm_eval": ("aten::native_batch_norm", [[4, 8, 6, 6], [8], [8], [8], [8], [], [], []],
                        [F, F, F, F, F, "Scalar", "Scalar", "Scalar"], ["", "", "", "", "", "False", "0.1", "1e-05"],
                        ("norm", 2 * 1152, 4608 + 32 + 32 + 64 + 4608)),
    "rms_norm": ("aten::_fused_rms_norm", [[16, 32], [], [32], []], [F, "ScalarList", F, ""], ["", "[32]", "", ""],
                 ("norm", 4 * 512, 2048 + 128 + 2048 + 16 * 4)),
    # --- softmax --------------------------------------------------------------------------------------------
    "softmax": ("aten::softmax", [[64, 32], [], []], [F, "Scalar", ""], ["", "-1", ""],
                ("softmax", 5 * 2048, 2 * 8192)),
    "softmax_half_to_float": ("aten::_softmax", [[64, 32], [], []], [H, "Scalar", "Scalar"], ["", "-1", "True"],
                              ("softmax", 5 * 2048, 4096 + 8192)),
    "softmax_backward": ("aten::_softmax_backward_data", [[16, 32], [16, 32], [], []], [H, H, "Scalar", "Scalar"],
                         ["", "", "-1", "6"], ("softmax", 5 * 512, 2 * 1024 + 2048)),  # grad_input in float32
    # --- copies and casts -----------------------------------------------------------------------------------
    "copy_casts": ("aten::copy_", [[64, 32], [64, 32], []], [H, F, "Scalar"], ["", "", "False"],
                   ("copy", 0, 8192 + 4096)),
    "to_copy_half": ("aten::_to_copy", [[64, 32], [], [], [], [], [], []], [F, "Scalar", "", "", "", "Scalar", ""],
                     ["", "5", "", "", "", "False", ""], ("copy", 0, 8192 + 4096)),
    "clone": ("aten::clone", [[32, 64], []], [F, "Scalar"], ["", "0"], ("copy", 0, 2 * 8192)),
    "permute_pooled_embs": ("fbgemm::permute_pooled_embs_auto_grad", [[1024, 70904], [981], [980], [981], [980]],
                            [F, "long", "long", "long", "long"], ["", "", "", "", ""],
                            ("copy", 0, 2 * 1024 * 70904 * 4)),  # HTA's trace_diff: 26 tables' pooled columns
    "permute_pooled_embs_backward": ("torch::autograd::CppNode<fbgemm_gpu::PermutePooledEmbsFunction"
                                     "<&fbgemm_gpu::permute_pooled_embs_gpu> >", [[1024, 70904]], [F], [""],
                                     ("copy", 0, 2 * 1024 * 70904 * 4)),
    # its gradient recat into one block per rank (HTA's trace_diff, 8 ranks): read, written once more
    "recat_embedding_grad_output": ("fbgemm::recat_embedding_grad_output_mixed_D_batch", [[1024, 70904], [8], [8]],
                                    [F, "long", "long"], None, ("copy", 0, 2 * 1024 * 70904 * 4)),
    "fill_writes_only": ("aten::fill_", [[64, 32], []], [F, "Scalar"], ["", "1"], ("copy", 0, 8192)),
    # arange writes ceil((end − start) / step) elements, nothing read (hand counts; layouts of the corpus' MI300
    # Qwen and xDiT flux traces): arange(0, 559) with integer bounds -> 559 int64; the arange.start_out it runs
    # (its empty out= tensor, int64, sets the dtype); arange(512, dtype=4 (int64)); start_step(0, 1, 0.3): 0, 0.3,
    # 0.6, 0.9 in the default float32; bounds not recorded (HTA's traces: no Concrete Inputs): no cost
    "arange_integer_bounds": ("aten::arange", [[]] * 6, ["Scalar", "Scalar", "", "", "", "Scalar"],
                              ["0", "559", "", "", "", "False"], ("copy", 0, 559 * 8)),
    "arange_start_out": ("aten::arange", [[], [], [], [0]], ["Scalar", "Scalar", "Scalar", L], ["0", "559", "1", ""],
                         ("copy", 0, 559 * 8)),
    "arange_dtype_given": ("aten::arange", [[]] * 5, ["Scalar", "Scalar", "", "", "Scalar"],
                           ["512", "4", "", "", "False"], ("copy", 0, 512 * 8)),
    "arange_fractional_step": ("aten::arange", [[]] * 7, ["Scalar"] * 3 + ["", "", "", ""],
                               ["0", "1", "0.3", "", "", "", ""], ("copy", 0, 4 * 4)),
    "arange_bounds_not_recorded": ("aten::arange", [[]] * 5, ["Scalar", "Scalar", "", "", ""], None,
                                   ("copy", None, None)),
    "constant_pad": ("aten::constant_pad_nd", [[888, 2880], [], []], [B, "ScalarList", "Scalar"],
                     ["", "[0, 64]", "0"], ("copy", 0, 888 * 2880 * 2 + 888 * 2944 * 2)),
    # --- upsampling -----------------------------------------------------------------------------------------
    "bilinear_scale": ("aten::upsample_bilinear2d", [[4, 8, 6, 6], [], [], []], [F, "", "Scalar", "ScalarList"],
                       ["", "", "False", "[2., 2.]"], ("upsample", 7 * 4608, 1152 * 4 + 4608 * 4)),
    "nearest_size": ("aten::upsample_nearest2d", [[4, 8, 16, 16], [], [], []], [F, "ScalarList", "Scalar", "Scalar"],
                     ["", "[32, 32]", "2.", "2."], ("upsample", 0, 8192 * 4 + 32768 * 4)),
    "bilinear_backward": ("aten::upsample_bilinear2d_backward", [[4, 8, 12, 12], [], [], [], [], []],
                          [F, "ScalarList", "ScalarList", "Scalar", "Scalar", "Scalar"],
                          ["", "[12, 12]", "[4, 8, 6, 6]", "False", "2.", "2."],
                          ("upsample", 8 * 4608, 4608 * 4 + 1152 * 4)),
    # --- gathers and scatters -------------------------------------------------------------------------------
    "embedding": ("aten::embedding", [[100, 32], [4, 10], [], [], []], [F, L, "Scalar", "Scalar", "Scalar"],
                  ["", "", "-1", "False", "False"], ("index", 0, 40 * 8 + 2 * 40 * 32 * 4)),
    "index_select": ("aten::index_select", [[100, 32], [], [40]], [F, "Scalar", L], ["", "0", ""],
                     ("index", 0, 40 * 8 + 2 * 40 * 32 * 4)),
    "gather": ("aten::gather", [[64, 32], [], [64, 4], []], [F, "Scalar", L, "Scalar"], ["", "1", "", "False"],
               ("index", 0, 256 * 8 + 2 * 256 * 4)),
    "scatter_add_inplace": ("aten::scatter_add_", [[16, 4], [], [16, 4], [16, 4]], [F, "Scalar", L, F],
                            ["", "1", "", ""], ("index", 64, 64 * 8 + 64 * 4 + 2 * 64 * 4)),
    "index_put_inplace": ("aten::index_put_", [[64, 32], [], [2, 32], []], [F, "", F, "Scalar"],
                          ["", "", "", "False"], ("index", 0, 256 + 256)),  # indices: a TensorList, not recorded
    "embedding_backward": ("aten::embedding_dense_backward", [[3, 5, 8], [3, 5], [], [], []],
                           [F, L, "Scalar", "Scalar", "Scalar"], ["", "", "50", "-1", "False"],
                           ("index", 120, 480 + 120 + 50 * 8 * 4)),
    # --- convolutions whose output size comes from padding text or a transposed layout -----------------------
    # padding='same' keeps 9×9: 2·N·C_out·C_in·k²·out = 2·2·6·4·9·81; reads x and w, writes [2, 6, 9, 9]
    "conv2d_padding_same": ("aten::conv2d", [[2, 4, 9, 9], [6, 4, 3, 3], [], [], [], [], []],
                            [F, F, "", "ScalarList", "", "ScalarList", "Scalar"],
                            ["", "", "", "[1, 1]", "'same'", "[1, 1]", "1"],
                            ("conv", 69_984, 2592 + 864 + 2 * 6 * 81 * 4)),
    # padding='valid', stride 2: (20 - 2 - 1) // 2 + 1 = 9 outputs
    "conv1d_padding_valid": ("aten::conv1d", [[3, 4, 20], [5, 4, 3], [], [], [], [], []],
                             [F, F, "", "ScalarList", "", "ScalarList", "Scalar"],
                             ["", "", "", "[2]", "'valid'", "[1]", "1"],
                             ("conv", 2 * 3 * 5 * 4 * 3 * 9, 960 + 240 + 3 * 5 * 9 * 4)),
    # transposed, groups 2: weight [C_in, C_out/groups, 3, 3] -> C_out 6; out (7-1)·2 - 2·1 + 2 + 1 + 1 = 14;
    # FLOPs over the input's 7×7 positions
    "conv_transpose2d_groups": ("aten::conv_transpose2d", [[2, 4, 7, 7], [4, 3, 3, 3], [6], [], [], [], [], []],
                                [F, F, F, "ScalarList", "ScalarList", "ScalarList", "Scalar", "ScalarList"],
                                ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "2", "[1, 1]"],
                                ("conv", 2 * 2 * 4 * 3 * 9 * 49, 1568 + 432 + 24 + 2 * 6 * 196 * 4)),
    # --- fused kernels and views ----------------------------------------------------------------------------
    "vllm_fused_add_rms_norm": ("_C::fused_add_rms_norm", [[888, 2880], [888, 2880], [2880], []],
                                [B, B, B, "Scalar"], ["", "", "", "1e-05"],
                                ("fused", 5 * 888 * 2880, 2 * 888 * 2880 * 2 + 2880 * 2 + 2 * 888 * 2880 * 2)),
    "view": ("aten::view", [[64, 32], []], [F, "ScalarList"], ["", "[2048]"], ("view", 0, 0)),
    # --- grouped GEMMs (MoE): layouts as torch 2.13 records them; the work of one GEMM over the uncut dims, the
    # output per layout (torch ran each: [256, 48], [4, 64, 48], [4, 64, 48], [64, 192]). FlopCounterMode has no
    # formula for them (it counts 0), so these are hand counts.
    "grouped_mm_tokens_by_expert": ("aten::_grouped_mm", [[256, 32], [4, 32, 48], [4], [], []],
                                    [B, B, "int", "", ""], None,
                                    ("gemm", 2 * 256 * 32 * 48, 256 * 32 * 2 + 4 * 32 * 48 * 2 + 256 * 48 * 2)),
    "grouped_mm_k_cut": ("aten::_grouped_mm", [[64, 128], [128, 48], [4], [], []], [B, B, "int", "", ""], None,
                         ("gemm", 2 * 64 * 128 * 48, 64 * 128 * 2 + 128 * 48 * 2 + 4 * 64 * 48 * 2)),
    "grouped_mm_batched": ("aten::_grouped_mm", [[4, 64, 32], [4, 32, 48], [], [], []], [B, B, "", "", ""], None,
                           ("gemm", 2 * 4 * 64 * 32 * 48, 4 * 64 * 32 * 2 + 4 * 32 * 48 * 2 + 4 * 64 * 48 * 2)),
    "grouped_mm_n_cut": ("aten::_grouped_mm", [[4, 64, 32], [32, 192], [4], [], []], [B, B, "int", "", ""], None,
                         ("gemm", 2 * 64 * 32 * 192, 4 * 64 * 32 * 2 + 32 * 192 * 2 + 64 * 192 * 2)),
    # FP8 operands (1 byte), their row scales (float32) read, the bf16 output (no out_dtype)
    "scaled_grouped_mm_fp8": ("aten::_scaled_grouped_mm", [[256, 32], [4, 32, 48], [256], [4, 48], [4], [], [], [], []],
                              ["c10::Float8_e4m3fn", "c10::Float8_e4m3fn", F, F, "int", "", "", "", "Scalar"],
                              ["", "", "", "", "", "", "", "", "False"],
                              ("gemm", 2 * 256 * 32 * 48, 256 * 32 + 4 * 32 * 48 + 256 * 4 + 4 * 48 * 4 + 256 * 48 * 2)),
    # --- other engines' fused kernels, with the argument layouts of the corpus' SGLang/vLLM/xDiT traces ------
    "aiter_rmsnorm": ("aiter::rmsnorm", [[15360, 4096], [15360, 4096], [4096], []], [B, B, B, "Scalar"],
                      ["", "", "", "1e-06"],  # out, input, weight, eps: input and weight read, out written
                      ("fused", 4 * 15360 * 4096, 15360 * 4096 * 2 + 4096 * 2 + 15360 * 4096 * 2)),
    "aiter_add_rmsnorm": ("aiter::add_rmsnorm", [[15360, 4096]] * 4 + [[4096], []], [B] * 5 + ["Scalar"],
                          ["", "", "", "", "", "1e-06"],  # input, residual_in, weight read; out, residual_out written
                          ("fused", 5 * 15360 * 4096, 4 * 15360 * 4096 * 2 + 4096 * 2)),
    "sgl_silu_and_mul": ("sgl_kernel::silu_and_mul", [[15360, 12288], [15360, 24576]], [B, B], None,
                         ("fused", 2 * 15360 * 12288, 15360 * 24576 * 2 + 15360 * 12288 * 2)),
    "sgl_rotary_embedding": ("sgl_kernel::rotary_embedding",
                             [[15360], [15360, 4096], [15360, 1024], [], [41216, 128], []],
                             [L, B, B, "Scalar", B, "Scalar"], ["", "", "", "128", "", "True"],
                             # positions read; query and key read and written; one cache row per position read
                             ("fused", 3 * 15360 * (4096 + 1024),
                              15360 * 8 + 2 * 15360 * (4096 + 1024) * 2 + 15360 * 128 * 2)),
    "sglang_store_cache": ("sglang::store_cache", [[15360, 1024], [15360, 1024], [835874, 1024], [835874, 1024],
                                                   [15360], [], []],
                           [B, B, B, B, L, "Scalar", "Scalar"], ["", "", "", "", "", "2048", "0"],
                           ("fused", 0, 2 * 15360 * 1024 * 2 + 15360 * 8 + 2 * 15360 * 1024 * 2)),
    # an fp8 KV cache (uint8): key and value read in bf16, written as one byte per element
    "vllm_reshape_and_cache_flash": ("_C_cache_ops::reshape_and_cache_flash",
                                     [[888, 1, 64], [888, 1, 64], [4213816, 16, 1, 64], [4213816, 16, 1, 64],
                                      [888], [], [], []],
                                     [B, B, "unsigned char", "unsigned char", L, "", F, F], None,
                                     ("fused", 0, 2 * 888 * 64 * 2 + 888 * 8 + 2 * 888 * 64)),
    # aiter's CK kernels, as vLLM's MI300X GPT-OSS traces record them (vllm_decode_full): rms_norm(input, weight,
    # eps, use_model_sensitive_rmsnorm) returns out; rmsnorm2d_fwd_with_add_ck has add_rmsnorm's layout
    "aiter_rms_norm": ("aiter::rms_norm", [[32, 2880], [2880], [], []], [B, B, "Scalar", "Scalar"],
                       ["", "", "1.0000000000000001e-05", "0"],  # input and weight read, out written
                       ("fused", 4 * 32 * 2880, 32 * 2880 * 2 + 2880 * 2 + 32 * 2880 * 2)),
    "aiter_rmsnorm2d_fwd_with_add_ck": ("aiter::rmsnorm2d_fwd_with_add_ck", [[32, 2880]] * 4 + [[2880], [], []],
                                        [B] * 5 + ["Scalar", "Scalar"], ["", "", "", "", "", "1e-05", "0"],
                                        ("fused", 5 * 32 * 2880, 4 * 32 * 2880 * 2 + 2880 * 2)),
    # Triton's MoE routing (triton_kernels, vLLM's matmul_ogs backend) as the same traces record it: TopK over 32
    # tokens' scores for 32 experts, k = 4, softmax applied; hand counts (FlopCounterMode counts none): 32·32
    # comparisons + 5 per kept score; the bf16 scores read, 4 bf16 values and 4 int16 ids per token written and
    # the bitmatrix, one 32-bit word per token (32 experts). These outputs are the buffers TopK allocates in the
    # capture trace ([32, 4] bf16, [32, 4] int16, [1, 32] uint32; test_serving_costs.py)
    "triton_kernels_topk": ("TopK", [[32, 32], [], [], [], [], [], []], [B] + ["Scalar"] * 4 + ["", ""],
                            ["", "4", "True", "1", "True", "", ""],
                            ("fused", 32 * 32 + 5 * 32 * 4, 32 * 32 * 2 + 32 * 4 * (2 + 2) + 32 * 4)),
    # with the choices given (y_indx [32, 4]) it only gathers them: the 4 chosen scores per token read
    "triton_kernels_topk_given": ("TopK", [[32, 32], [], [], [], [], [32, 4], []],
                                  [B] + ["Scalar"] * 4 + ["short int", ""], ["", "4", "False", "1", "True", "", ""],
                                  ("fused", 0, 32 * 4 * 2 + 32 * 4 * (2 + 2) + 32 * 4)),
    # n_rows as a device tensor: how many rows it selects from is not in the trace
    "triton_kernels_topk_rows_unknown": ("TopK", [[32, 32], [], [], [], [], [], [1]],
                                         [B] + ["Scalar"] * 4 + ["", "int"], ["", "4", "True", "1", "True", "", ""],
                                         ("fused", None, None)),
    # SortTokens of TopK's 32 × 4 choices over 32 experts: 128 routed pairs counted and the 32 offsets summed;
    # scores and ids read with the 32 bitmatrix words; combine and dispatch indices (int32) and the bf16 gate
    # scales written for the 128 pairs, the histogram and offsets (32 int32 each)
    "triton_kernels_sort_tokens": ("SortTokens", [[32, 4], [32, 4], []], [B, "short int", "Scalar"],
                                   ["", "", "32"],
                                   ("fused", 128 + 32, 128 * 2 + 128 * 2 + 32 * 4 + 128 * (4 + 4 + 2) + 2 * 32 * 4)),
    # FBGEMM's sparse-feature helpers as HTA's trace_filter records them (no Concrete Inputs): the 65,537 offsets
    # of 65,536 int32 lengths (one add per length); the bounds check of 15,405,380 int64 indices in 993,280 bags
    # of 485 tables: two comparisons per index and per offset, the three tensors read, nothing written
    "fbgemm_asynchronous_complete_cumsum": ("fbgemm::asynchronous_complete_cumsum", [[65536]], ["int"], None,
                                            ("fused", 65536, 65536 * 4 + 65537 * 4)),
    "fbgemm_bounds_check_indices": ("fbgemm::bounds_check_indices", [[485], [15405380], [993281], [], [1], []],
                                    ["long", "long", "long", "Scalar", "long", ""], None,
                                    ("fused", 2 * (15405380 + 993281), (485 + 15405380 + 993281) * 8)),
    "aiter_groupnorm": ("aiter::_groupnorm_run", [[1, 512, 64, 64], [], [512], [512], []],
                        [B, "Scalar", B, B, "Scalar"], ["", "32", "", "", "1e-06"],
                        ("fused", 5 * 512 * 4096, 512 * 4096 * 2 + 2 * 512 * 2 + 512 * 4096 * 2)),
    # Inductor's Triton kernels: each tensor argument once (in_out_ptr0 [2, 2432] and the bias), no FLOPs
    "triton_pointwise": ("triton_poi_fused_addmm_silu_2", [[2, 2432], [2432], []], [B, B, "Scalar"],
                         ["", "", "4864"], ("triton", 0, 2 * 2432 * 2 + 2432 * 2)),
    "triton_mixed_dtypes": ("triton_poi_fused_add_bitwise_and_bitwise_not_bitwise_or_ge_lt_mul_sub_0",
                            [[888], [888], [888], [], []], ["int", L, "bool", "Scalar", "Scalar"], None,
                            ("triton", 0, 888 * 4 + 888 * 8 + 888)),
    "triton_template_has_no_formula": ("triton_tem_fused_mm_0", [[64, 32], [32, 16], [64, 16], []],
                                       [B, B, B, "Scalar"], None, (None, None, None)),
    # --- max pooling, as the corpus' resnet_act_checkpoint trace records it: bf16 [10, 64, 112, 112], 3×3 windows,
    # stride 2, padding 1: (112 + 2 − 2 − 1) // 2 + 1 = 56 rows and columns out (its backward's grad_output is
    # [10, 64, 56, 56]); hand counts (FlopCounterMode has no formula): 9 comparisons per output element; the input
    # read, the output (bf16) and its indices (int64) written. Backward: one add per grad_output element;
    # grad_output and indices read, grad_input written
    "max_pool2d_with_indices": ("aten::max_pool2d_with_indices", [[10, 64, 112, 112], [], [], [], [], []],
                                [B] + ["ScalarList"] * 4 + ["Scalar"],
                                ["", "[3, 3]", "[2, 2]", "[1, 1]", "[1, 1]", "False"],
                                ("pool", 9 * 10 * 64 * 56 * 56,
                                 10 * 64 * 112 * 112 * 2 + 10 * 64 * 56 * 56 * (2 + 8))),
    "max_pool2d_with_indices_backward": ("aten::max_pool2d_with_indices_backward",
                                         [[10, 64, 56, 56], [10, 64, 112, 112], [], [], [], [], [], [10, 64, 56, 56]],
                                         [B, B] + ["ScalarList"] * 4 + ["Scalar", L],
                                         ["", "", "[3, 3]", "[2, 2]", "[1, 1]", "[1, 1]", "False", ""],
                                         ("pool", 10 * 64 * 56 * 56,
                                          10 * 64 * 56 * 56 * (2 + 8) + 10 * 64 * 112 * 112 * 2)),
    # ceil_mode: 5 columns in 2-wide windows of stride 2 give 3 (the last window half outside); 1-D, kernel 3,
    # stride 3, padding 1 over 5: (5 + 2 − 2 − 1 + 2) // 3 + 1 = 3, less one as the third window would start in
    # the right padding (3 − 1)·3 ≥ 5 + 1: 2; an empty stride is the kernel's
    "max_pool2d_ceil_mode": ("aten::max_pool2d_with_indices", [[1, 5, 5], [], [], [], [], []],
                             [F] + ["ScalarList"] * 4 + ["Scalar"], ["", "[2, 2]", "[]", "[0, 0]", "[1, 1]", "True"],
                             ("pool", 4 * 3 * 3, 25 * 4 + 3 * 3 * (4 + 8))),
    "max_pool1d_ceil_mode_window_in_padding": ("aten::max_pool1d_with_indices", [[2, 4, 5], [], [], [], [], []],
                                               [F] + ["ScalarList"] * 4 + ["Scalar"],
                                               ["", "[3]", "[3]", "[1]", "[1]", "True"],
                                               ("pool", 3 * 2 * 4 * 2, 2 * 4 * 5 * 4 + 2 * 4 * 2 * (4 + 8))),
    "max_pool2d_unrecorded_window": ("aten::max_pool2d_with_indices", [[10, 64, 112, 112], [], [], [], [], []],
                                     [B] + ["ScalarList"] * 4 + ["Scalar"], None, ("pool", None, None)),
    # --- losses and random fills, as the corpus' normalization_layer_test trace records them (fp32 [8, 16, 32, 32])
    "mse_loss_mean": ("aten::mse_loss", [[8, 16, 32, 32], [8, 16, 32, 32], []], [F, F, "Scalar"], ["", "", "1"],
                      ("loss", 3 * 131_072, 2 * 131_072 * 4 + 4)),  # self, target read; the mean written
    "mse_loss_none": ("aten::mse_loss", [[8, 16, 32, 32], [8, 16, 32, 32], []], [F, F, "Scalar"], ["", "", "0"],
                      ("loss", 2 * 131_072, 3 * 131_072 * 4)),
    "mse_loss_reduction_unrecorded": ("aten::mse_loss", [[8, 16, 32, 32], [8, 16, 32, 32], []], [F, F, "Scalar"],
                                      None, ("loss", None, None)),
    # grad_output (0-dim), self, target read; grad_input (the out= tensor) written
    "mse_loss_backward": ("aten::mse_loss_backward", [[], [8, 16, 32, 32], [8, 16, 32, 32], [], [8, 16, 32, 32]],
                          [F, F, F, "Scalar", F], ["", "", "", "1", ""], ("loss", 3 * 131_072, 4 + 3 * 131_072 * 4)),
    "normal_": ("aten::normal_", [[8, 16, 32, 32], [], [], []], [F, "Scalar", "Scalar", ""], ["", "0.", "1.", ""],
                ("random", 0, 131_072 * 4)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cost_by_hand(case, by_hand):
    assert by_hand[case] == CASES[case][4]


def test_unknown_or_unrecorded_ops_have_no_cost(con):
    got = costs(con, {"cat": ("aten::cat", [[], []], ["TensorList", "Scalar"], ["", "0"]),
                      "unrecorded": ("aten::mul", [[], []], ["", ""], None),
                      "unknown": ("my::op", [[4]], [F], None)})
    assert got == {"cat": (None, None, None), "unrecorded": ("elementwise", None, None),
                   "unknown": (None, None, None)}


# --- which ops op_costs() counts ------------------------------------------------------------------------------

def _op(name, ts, dur, dims, types, concrete=None):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1,
            "args": {"Input Dims": dims, "Input type": types, "Concrete Inputs": concrete or [""] * len(dims)}}


NESTED = [
    # add_ of a Python float: torch first converts the 0-dim double (to -> _to_copy -> copy_); add_ is counted
    _op("aten::add_", 0, 100, [[64, 1], [], []], [F, "double", "Scalar"], ["", "", "1"]),
    _op("aten::to", 10, 30, [[], [], [], [], []], ["double", "Scalar", "Scalar", "Scalar", ""]),
    _op("aten::_to_copy", 12, 25, [[], [], [], [], [], [], []], ["double", "Scalar", "", "", "", "Scalar", ""],
        ["", "6", "", "", "", "False", ""]),
    _op("aten::copy_", 15, 10, [[], [], []], [F, "double", "Scalar"]),
    # mean on CPU runs sum(out=) and div_: the mean is counted, not its pieces
    _op("aten::mean", 200, 100, [[64, 32], [], [], []], [F, "ScalarList", "Scalar", ""], ["", "[-1]", "True", ""]),
    _op("aten::sum", 210, 40, [[64, 32], [], [], [], [64, 1]], [F, "ScalarList", "Scalar", "Scalar", F],
        ["", "[-1]", "True", "6", ""]),
    _op("aten::div_", 260, 20, [[64, 1], []], [F, "Scalar"], ["", "32"]),
    # an unfused attention: its matmuls and its softmax are counted, the attention op is not
    _op("aten::scaled_dot_product_attention", 400, 300, [[2, 4, 16, 8], [2, 4, 16, 8], [2, 4, 16, 8]] + [[]] * 4,
        [F, F, F, "", "Scalar", "Scalar", ""]),
    _op("aten::bmm", 410, 50, [[8, 16, 8], [8, 8, 16]], [F, F]),
    _op("aten::_softmax", 470, 50, [[2, 4, 16, 16], [], []], [F, "Scalar", "Scalar"], ["", "-1", "False"]),
    _op("aten::bmm", 530, 50, [[8, 16, 16], [8, 16, 8]], [F, F]),
    # the bias copy inside addmm is part of the GEMM
    _op("aten::linear", 800, 100, [[64, 32], [48, 32], [48]], [F, F, F]),
    _op("aten::addmm", 810, 80, [[48], [64, 32], [32, 48], [], []], [F, F, F, "Scalar", "Scalar"]),
    _op("aten::copy_", 820, 10, [[64, 48], [48], []], [F, F, "Scalar"]),
    # a view moves nothing and is never counted
    _op("aten::view", 1000, 5, [[64, 32], []], [F, "ScalarList"], ["", "[2048]"]),
]


def test_counted_ops_when_ops_nest(tmp_path):
    run = tmp_path / "run"
    tracesql.ingest([write_trace(tmp_path / "t.json", NESTED)], run)
    rows = tracesql.connect(run).execute(
        "SELECT o.ts, c.name, c.counted FROM op_costs() c JOIN ops o USING (run_id, rank, op_id) ORDER BY o.ts"
    ).fetchall()
    counted = [(ts // 1000, name) for ts, name, c in rows if c]  # µs in the trace, ns in the run
    assert counted == [(0, "aten::add_"), (200, "aten::mean"), (410, "aten::bmm"), (470, "aten::_softmax"),
                       (530, "aten::bmm"), (810, "aten::addmm")]


def test_counted_ops_across_a_long_op_and_threads(tmp_path):
    """op_costs compares an op only with the ops spanning its start's time bucket (about one op apart): a long
    linear holding 40 addmm in its second half (each with its bias copy, the last one zero-length at the linear's
    very end) still holds every one of them, and copies on another thread at the same times are nobody's."""
    gemm = ([[48], [64, 32], [32, 48], [], []], [F, F, F, "Scalar", "Scalar"])
    copy = ([[64, 48], [48], []], [F, F, "Scalar"])
    events = [_op("aten::linear", 0, 40_000, [[64, 32], [48, 32], [48]], [F, F, F])]
    for i in range(40):
        ts, dur = (40_000, 0) if i == 39 else (20_000 + 500 * i, 20)  # none in the linear's first half
        events += [_op("aten::addmm", ts, dur, *gemm), _op("aten::copy_", ts, dur, *copy),
                   {**_op("aten::copy_", ts, 5, *copy), "tid": 2}]
    run = tmp_path / "run"
    tracesql.ingest([write_trace(tmp_path / "t.json", events)], run)
    rows = tracesql.connect(run).execute(
        "SELECT c.name, o.tid, count(*) FILTER (WHERE c.counted), count(*) FROM op_costs() c "
        "JOIN ops o USING (run_id, rank, op_id) GROUP BY ALL ORDER BY ALL").fetchall()
    assert rows == [("aten::addmm", 1, 40, 40), ("aten::copy_", 1, 0, 40), ("aten::copy_", 2, 40, 40),
                    ("aten::linear", 1, 0, 1)]


# --- against TraceLens' golden per-op numbers -----------------------------------------------------------------

GOLDEN = json.loads((Path(__file__).parent / "data" / "tracelens_golden.json").read_text())["rows"]


def _args(row):
    dims = [d if isinstance(d, list) and all(isinstance(v, int) for v in d) else [] for d in row["input_dims"]]
    types = [t if t is not None else "" for t in row["input_types"]]
    concrete = [str(c) if c is not None else "" for c in row["concrete_inputs"]] if row["concrete_inputs"] else None
    return row["name"], dims, types, concrete


@pytest.fixture(scope="module")
def golden(con) -> list[tuple[dict, tuple]]:
    got = costs(con, {str(i): _args(r) for i, r in enumerate(GOLDEN)})
    return [(r, got[str(i)]) for i, r in enumerate(GOLDEN)]


def _numel(dims) -> int:
    return math.prod(dims) if dims else 1


BPE = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4, "double": 8}


def _close(a, b, rel=1e-9) -> bool:
    return a is not None and abs(a - b) <= rel * max(abs(b), 1) + 0.5


def test_tracelens_golden_covers_every_category():
    cats = {r["category"] for r in GOLDEN}
    assert {"GEMM", "CONV_fwd", "CONV_bwd", "SDPA_fwd", "BinaryElementwise", "UnaryElementwise", "Reduce_fwd",
            "Normalization"} <= cats and len(GOLDEN) >= 100


def test_against_tracelens_golden(golden):
    """Each of TraceLens' per-op numbers is ours, or differs by a convention docs/concepts/cost-model.md states,
    checked here exactly (or, for the norms' per-element constants, to within the stated tolerance)."""
    same = 0
    for row, (_, flops, bytes_) in golden:
        name, cat = row["name"], row["category"]
        tf, tb = row["tracelens_flops"], row["tracelens_bytes"]
        d, t = row["input_dims"], row["input_types"]
        where = f"{cat} {name} {d}"
        if _close(flops, tf) and _close(bytes_, tb):
            same += 1
        elif cat == "GEMM" and name in ("aten::addmm", "aten::baddbmm"):
            # TraceLens counts the bias add (M·N); tracesql, as FlopCounterMode, counts only the matmul
            assert _close(flops + d[1][0] * d[2][1], tf) and _close(bytes_, tb), where
        elif cat == "CONV_fwd":
            # tracesql reads the bias (C_out elements); TraceLens does not
            assert _close(flops, tf) and _close(bytes_ - _numel(d[2]) * BPE[t[2]], tb), where
        elif cat == "CONV_bwd":
            # TraceLens reads grad_output twice (for grad_input and for grad_weight); tracesql once
            assert _close(flops, tf) and _close(bytes_ + _numel(d[0]) * BPE[t[0]], tb), where
        elif name in ("aten::copy_", "aten::upsample_nearest1d"):
            # a copy / nearest upsampling computes nothing: 0 FLOPs; TraceLens counts 1 per output element
            assert flops == 0 and tf > 0 and _close(bytes_, tb), where
            assert name != "aten::copy_" or tf == _numel(d[0]), where
        elif cat == "BinaryElementwise" and t[1] == "Scalar":
            # TraceLens reads a Python number as a 4-byte tensor element; tracesql: a kernel argument, not read
            assert _close(flops, tf) and _close(bytes_ + 4, tb), where
        elif cat == "Reduce_fwd" and name in ("aten::max", "aten::min") and d[1]:
            # max(a, b) is the elementwise maximum (reads a and b); TraceLens models it as a reduction of a
            assert _close(flops, tf) and _close(tb, _numel(d[0]) * BPE[t[0]] * (1 + 1 / _numel(d[0]))), where
            assert _close(bytes_, 3 * _numel(d[0]) * BPE[t[0]]), where
        elif cat == "Reduce_fwd":
            # TraceLens reads Kineto's Concrete Inputs as text and misses `dim` ('[-1]'): it writes one element;
            # tracesql writes the reduced shape (max over a dim: values and indices). linalg_norm: 2 FLOPs/element
            assert _close(tb, _numel(d[0]) * BPE[t[0]] + BPE[t[0]]), where
            assert bytes_ >= tb and _close(flops, tf * (2 if name == "aten::linalg_norm" else 1)), where
        elif cat == "Normalization" and name == "aten::instance_norm":
            assert flops is None and bytes_ is None  # its inner batch_norm (on the reshaped input) is counted
        elif cat == "Normalization" and "backward" not in name:
            # same 5 FLOPs per element, TraceLens adds a few per channel; statistics: per row (torch's mean/rstd)
            # in float32, where TraceLens counts them per channel in the input's dtype
            assert _close(flops, tf, rel=0.01) and _close(bytes_, tb, rel=0.01), where
        elif cat == "Normalization":
            # backward: tracesql 8 FLOPs per element for grad_input, 2 for grad_weight, 1 for grad_bias; TraceLens'
            # model differs per norm. Bytes agree within 5 %, except miopen's backward, which TraceLens models as
            # eval mode (not reading the input)
            assert 0.5 * tf <= flops <= 3 * tf, where
            assert _close(bytes_, tb, rel=0.05) or (name == "aten::miopen_batch_norm_backward" and bytes_ > tb), where
        else:
            raise AssertionError(f"{where}: {flops} FLOPs / {bytes_} bytes, TraceLens {tf} / {tb}")
    assert same >= 60  # elementwise, GEMM, attention: the same numbers


# --- the calculations engineers do on paper -------------------------------------------------------------------

def test_collective_time_from_size_kind_group_and_link(con):
    rows = con.execute("""SELECT collective_time_ns(1e9, 'all_reduce', 8, 450e9),
        collective_time_ns(1e9, 'all_gather', 8, 450e9), collective_time_ns(1e9, 'send', NULL, 450e9),
        collective_time_ns(1e9, 'all_reduce', 1, 450e9), collective_time_ns(1e9, 'barrier', 8, 450e9)""").fetchall()[0]
    assert rows[0] == pytest.approx(1e9 * 2 * 7 / 8 / 450e9 * 1e9)  # 3.89 ms: each link carries 2(n-1)/n of it
    assert rows[1] == pytest.approx(1e9 * 7 / 8 / 450e9 * 1e9)
    assert rows[2] == pytest.approx(1e9 / 450e9 * 1e9)
    assert rows[3] == 0 and rows[4] is None


def test_pipeline_bubble_fraction(con):
    got = con.execute("""SELECT pipeline_bubble_fraction(4, 8), pipeline_bubble_fraction(4, 8, v := 2),
        pipeline_bubble_fraction(1, 8), pipeline_bubble_fraction(0, 8)""").fetchall()[0]
    assert got[0] == pytest.approx(3 / 11) and got[1] == pytest.approx(3 / 19) and got[2] == 0 and got[3] is None


def test_roofline_time_of_an_op_given_a_peak(con):
    # mm [4096, 4096] x [4096, 4096] bf16 on 989.4 TFLOP/s and 3.35 TB/s: compute-bound, 2·4096³ / peak
    ns = con.execute("""SELECT roofline_time_ns(op_flops('aten::mm', [[4096, 4096], [4096, 4096]], ['c10::BFloat16',
        'c10::BFloat16'], ['', '']), op_bytes('aten::mm', [[4096, 4096], [4096, 4096]], ['c10::BFloat16',
        'c10::BFloat16'], ['', '']), 989.4e12, 3.35e12)""").fetchall()[0][0]
    assert ns == pytest.approx(2 * 4096**3 / 989.4e12 * 1e9)


def test_collectives_against_the_link(ingested):
    from conftest import DATASETS

    run = ingested(DATASETS / "hta_nccl_parser_config")  # A100-PG509-200: device_peaks A100-SXM-40GB, 300 GB/s
    df = tracesql.query("collectives", run)
    df = df[df.size_bytes.notna() & (df.duration_ns > 0)]
    assert len(df) > 0 and (df.link_bytes_per_s == 300e9).all()
    for _, r in df.iterrows():
        factor = {"all_reduce": 2 * (r.group_size - 1) / r.group_size, "broadcast": 1.0}.get(r.collective)
        if factor is None:
            continue
        assert r.predicted_ns == pytest.approx(r.size_bytes * factor / 300e9 * 1e9)
        assert r.link_pct == pytest.approx(100 * r.predicted_ns / r.duration_ns)
    given = tracesql.query("collectives", run, link_bytes_per_s=100e9)
    assert (given.link_bytes_per_s == 100e9).all()
