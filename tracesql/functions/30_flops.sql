-- FLOPs and bytes per op, arithmetic intensity, roofline, MFU, and the peaks of the device a run ran on.
--
-- Sources of the formulas: docs metrics.md ("FLOPs, bytes, arithmetic intensity, roofline") and
-- torch.utils.flop_counter (FlopCounterMode), which tests/test_flops.py checks them against on real ops.
-- Conventions, all as FlopCounterMode counts them unless said otherwise:
-- - a multiply-add is 2 FLOPs; GEMM = 2·M·N·K (·batch); the bias add of addmm/baddbmm/linear is not counted;
-- - convolution = 2 · N · C_out · prod(output spatial) · C_in/groups · prod(kernel); a transposed convolution
--   counts over its input's spatial positions; convolution_backward = one forward per gradient it computes
--   (output_mask). FlopCounterMode ignores groups for the weight gradient (counts it groups× too high): here it
--   is groups-aware, so grouped convolution_backward differs from torch by design;
-- - attention = 2·B·Hq·Sq·Skv·(d_qk + d_v) forward (4·B·H·Sq·Skv·d when d_qk = d_v) and 2·B·Hq·Sq·Skv·(3·d_qk +
--   2·d_v) backward (torch's five matmuls). Causal attention: `attention_convention` 'flash' (the default, as
--   metrics.md and flash-attn's benchmarks) halves it, 'torch' does not (FlopCounterMode never halves);
-- - elementwise, norms, softmax: a small multiple of the output elements (1 for unary/binary arithmetic and
--   activations, transcendental functions counted as one; 2 for addcmul/addcdiv/lerp; 5 for norms and softmax).
--   FlopCounterMode counts them as 0; they are here so that their memory-bound time shows on the roofline.
-- Bytes are each tensor input read once plus the output written once (metrics.md), in the recorded dtypes:
-- the minimum traffic, which is what the memory roof assumes.
-- Shapes come from Kineto's record_shapes: `ops.input_dims` (one list per argument, [] for non-tensors),
-- `ops.input_types`, and `ops.concrete_inputs` (values of scalar arguments: stride, padding, is_causal, ...).
-- When what a formula needs is not recorded the result is NULL, never a guess.

-- Elements of one recorded shape; NULL for a non-tensor argument ([] in Input Dims) or a missing one.
CREATE OR REPLACE MACRO shape_numel(dims) AS (
    CASE WHEN len(dims) > 0 THEN list_product(dims) END
);

-- Bytes of every tensor argument of an op, read once.
CREATE OR REPLACE MACRO input_bytes(input_dims, input_types) AS (
    list_sum(list_transform(range(1, len(input_dims) + 1), lambda i:
        coalesce(shape_numel(input_dims[i]) * dtype_bytes(input_types[i]), 0)))
);

-- Bytes per element of the op's first tensor argument.
CREATE OR REPLACE MACRO op_dtype_bytes(input_types) AS (
    list_filter(list_transform(input_types, lambda t: dtype_bytes(t)), lambda b: b IS NOT NULL)[1]
);

-- The dtype of the op's first tensor argument, as a device_peaks column name: fp64, fp32, bf16, fp16, fp8,
-- int8 (NULL when the op records no tensor dtype). TF32 is not a storage type: pass dtype := 'tf32' to the
-- queries to rate fp32 math against TF32 peaks.
CREATE OR REPLACE MACRO op_dtype(input_types) AS (
    list_filter(list_transform(input_types, lambda t:
        CASE
            WHEN t IS NULL OR dtype_bytes(t) IS NULL THEN NULL
            WHEN regexp_matches(lower(t), 'float8|fp8|e4m3|e5m2') THEN 'fp8'
            WHEN regexp_matches(lower(t), 'bfloat16|bf16') THEN 'bf16'
            WHEN regexp_matches(lower(t), 'half|float16|fp16') THEN 'fp16'
            WHEN regexp_matches(lower(t), 'double|float64|fp64') THEN 'fp64'
            WHEN regexp_matches(lower(t), 'int8|uint8') THEN 'int8'
            WHEN regexp_matches(lower(t), 'float|fp32|f32') THEN 'fp32'
        END), lambda k: k IS NOT NULL)[1]
);

-- Bytes per element of a c10::ScalarType code, as Kineto records `out_dtype` arguments (e.g. '15' = BFloat16).
CREATE OR REPLACE MACRO scalar_type_bytes(code) AS (
    CASE TRY_CAST(code AS INTEGER)
        WHEN 0 THEN 1 WHEN 1 THEN 1 WHEN 2 THEN 2 WHEN 3 THEN 4 WHEN 4 THEN 8 WHEN 5 THEN 2 WHEN 6 THEN 4
        WHEN 7 THEN 8 WHEN 11 THEN 1 WHEN 15 THEN 2 WHEN 23 THEN 1 WHEN 24 THEN 1 WHEN 25 THEN 1 WHEN 26 THEN 1
    END
);

-- ---------------------------------------------------------------------------------------------------------
-- GEMM. Input Dims layouts (record_shapes): mm(a, b), addmm(bias, a, b, beta, alpha), bmm(a, b),
-- baddbmm(c, a, b, beta, alpha), linear(x, weight[N, K], bias), matmul(a, b) with broadcasting batch dims and
-- 1-D operands, _scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum).

-- Elements in the broadcast batch of torch.matmul(a, b): the dims before the last two, aligned from the right.
CREATE OR REPLACE MACRO matmul_batch(a, b) AS (
    coalesce(list_product(list_transform(
        range(1, greatest(len(a) - 2, len(b) - 2, 0) + 1),
        lambda i: greatest(coalesce(list_reverse(CASE WHEN len(a) > 2 THEN a[1:len(a) - 2] ELSE [] END)[i], 1),
                           coalesce(list_reverse(CASE WHEN len(b) > 2 THEN b[1:len(b) - 2] ELSE [] END)[i], 1)))),
        1)
);

-- How many leading arguments of a GEMM op are its operands (bias included); _scaled_mm's bias (5th) is
-- left out, it is tiny next to the matrices.
CREATE OR REPLACE MACRO gemm_operands(name) AS (
    CASE WHEN name IN ('aten::addmm', 'aten::baddbmm', 'aten::linear') THEN 3 ELSE 2 END
);

-- (batch, M, K, N) of a GEMM op; NULL when its shapes are not recorded.
CREATE OR REPLACE MACRO gemm_mkn(name, d) AS (
    CAST(CASE
            WHEN name IN ('aten::mm', 'aten::_scaled_mm') AND len(d[1]) = 2 AND len(d[2]) = 2
                THEN {'batch': 1, 'm': d[1][1], 'k': d[1][2], 'n': d[2][2]}
            WHEN name = 'aten::addmm' AND len(d[2]) = 2 AND len(d[3]) = 2
                THEN {'batch': 1, 'm': d[2][1], 'k': d[2][2], 'n': d[3][2]}
            WHEN name = 'aten::bmm' AND len(d[1]) = 3 AND len(d[2]) = 3
                THEN {'batch': d[1][1], 'm': d[1][2], 'k': d[1][3], 'n': d[2][3]}
            WHEN name = 'aten::baddbmm' AND len(d[2]) = 3 AND len(d[3]) = 3
                THEN {'batch': d[2][1], 'm': d[2][2], 'k': d[2][3], 'n': d[3][3]}
            -- linear: every leading dim of x is a row of the GEMM
            WHEN name = 'aten::linear' AND len(d[1]) >= 1 AND len(d[2]) BETWEEN 1 AND 2
                THEN {'batch': 1, 'm': coalesce(list_product(d[1][1:len(d[1]) - 1]), 1), 'k': d[1][-1],
                      'n': CASE WHEN len(d[2]) = 2 THEN d[2][1] ELSE 1 END}
            WHEN name = 'aten::matmul' AND len(d[1]) >= 1 AND len(d[2]) >= 1
                THEN {'batch': matmul_batch(d[1], d[2]),
                      'm': CASE WHEN len(d[1]) >= 2 THEN d[1][-2] ELSE 1 END, 'k': d[1][-1],
                      'n': CASE WHEN len(d[2]) >= 2 THEN d[2][-1] ELSE 1 END}
        END
    AS STRUCT(batch DOUBLE, m DOUBLE, k DOUBLE, n DOUBLE))
);

-- ---------------------------------------------------------------------------------------------------------
-- Convolution. Where each op records stride, padding, dilation, transposed, output_padding and groups
-- (1-based positions in Concrete Inputs; NULL = the op has no such argument).
CREATE OR REPLACE MACRO conv_layout(name) AS (
    CAST(CASE
            WHEN name IN ('aten::conv1d', 'aten::conv2d', 'aten::conv3d')
                THEN {'stride': 4, 'padding': 5, 'dilation': 6, 'transposed': NULL, 'output_padding': NULL,
                      'groups': 7, 'is_transposed': false}
            WHEN name IN ('aten::convolution', 'aten::_convolution')
                THEN {'stride': 4, 'padding': 5, 'dilation': 6, 'transposed': 7, 'output_padding': 8, 'groups': 9,
                      'is_transposed': NULL}
            WHEN name IN ('aten::conv_transpose1d', 'aten::conv_transpose2d', 'aten::conv_transpose3d')
                THEN {'stride': 4, 'padding': 5, 'dilation': 8, 'transposed': NULL, 'output_padding': 6, 'groups': 7,
                      'is_transposed': true}
            WHEN name = 'aten::cudnn_convolution'
                THEN {'stride': 4, 'padding': 3, 'dilation': 5, 'transposed': NULL, 'output_padding': NULL,
                      'groups': 6, 'is_transposed': false}
            WHEN name = 'aten::cudnn_convolution_transpose'
                THEN {'stride': 5, 'padding': 3, 'dilation': 6, 'transposed': NULL, 'output_padding': 4, 'groups': 7,
                      'is_transposed': true}
            WHEN name IN ('aten::mkldnn_convolution', 'aten::miopen_convolution')
                THEN {'stride': 5, 'padding': 4, 'dilation': 6, 'transposed': NULL, 'output_padding': NULL,
                      'groups': 7, 'is_transposed': false}
            WHEN name = 'aten::miopen_convolution_transpose'
                THEN {'stride': 6, 'padding': 4, 'dilation': 7, 'transposed': NULL, 'output_padding': 5, 'groups': 8,
                      'is_transposed': true}
        END
    AS STRUCT(stride INTEGER, padding INTEGER, dilation INTEGER, transposed INTEGER, output_padding INTEGER,
              groups INTEGER, is_transposed BOOLEAN))
);

-- The i-th value of an int-list argument such as '[2, 2]'; a one-element list applies to every spatial dim.
CREATE OR REPLACE MACRO concrete_int(concrete_inputs, pos, i) AS (
    CASE WHEN len(TRY_CAST(concrete_inputs[pos] AS BIGINT[])) = 1 THEN TRY_CAST(concrete_inputs[pos] AS BIGINT[])[1]
         ELSE TRY_CAST(concrete_inputs[pos] AS BIGINT[])[i] END
);

-- Is the convolution transposed: by its name, else by its `transposed` argument (NULL if not recorded).
CREATE OR REPLACE MACRO conv_is_transposed(name, concrete_inputs) AS (
    coalesce(conv_layout(name).is_transposed,
             TRY_CAST(concrete_inputs[conv_layout(name).transposed] AS BOOLEAN))
);

-- Output spatial sizes of a convolution (x = input shape, w = weight shape), from stride/padding/dilation:
-- out = floor((in + 2·pad − dil·(k − 1) − 1) / stride) + 1, or for a transposed one
-- out = (in − 1)·stride − 2·pad + dil·(k − 1) + output_padding + 1. padding 'valid' is 0; 'same' keeps the size.
-- NULL when those arguments were not recorded.
CREATE OR REPLACE MACRO conv_out_spatial(name, x, w, concrete_inputs) AS (
    CASE WHEN len(x) >= 3 AND len(w) = len(x) THEN
    list_transform(range(1, len(x) - 1), lambda j:
        CASE
            WHEN lower(trim(concrete_inputs[conv_layout(name).padding], '''" ')) = 'same' THEN x[j + 2]
            WHEN conv_is_transposed(name, concrete_inputs) THEN
                (x[j + 2] - 1) * concrete_int(concrete_inputs, conv_layout(name).stride, j)
                - 2 * concrete_int(concrete_inputs, conv_layout(name).padding, j)
                + concrete_int(concrete_inputs, conv_layout(name).dilation, j) * (w[j + 2] - 1)
                + coalesce(concrete_int(concrete_inputs, conv_layout(name).output_padding, j), 0) + 1
            ELSE
                (x[j + 2]
                 + 2 * CASE WHEN lower(trim(concrete_inputs[conv_layout(name).padding], '''" ')) = 'valid' THEN 0
                            ELSE concrete_int(concrete_inputs, conv_layout(name).padding, j) END
                 - concrete_int(concrete_inputs, conv_layout(name).dilation, j) * (w[j + 2] - 1) - 1)
                // concrete_int(concrete_inputs, conv_layout(name).stride, j) + 1
        END)
    END
);

-- FLOPs of one forward convolution. w is [C_out, C_in/groups, k...] ([C_in, C_out/groups, k...] transposed),
-- so groups never needs to be known. `spatial` = the output's (transposed: the input's) spatial sizes.
CREATE OR REPLACE MACRO conv_forward_flops(n, w, spatial) AS (
    2 * n * w[1] * w[2] * list_product(w[3:]) * list_product(spatial)
);

CREATE OR REPLACE MACRO conv_flops(name, d, concrete_inputs) AS (
    CASE
        -- convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
        -- output_padding, groups, output_mask): one forward's FLOPs per gradient asked for (input, weight);
        -- the forward is counted over grad_output's spatial positions (transposed: the input's).
        WHEN name = 'aten::convolution_backward' AND len(d[1]) >= 3 AND len(d[3]) = len(d[1]) THEN
            conv_forward_flops(d[2][1], d[3],
                CASE WHEN coalesce(TRY_CAST(concrete_inputs[8] AS BOOLEAN), false) THEN d[2][3:] ELSE d[1][3:] END)
            * coalesce(list_sum(list_transform(TRY_CAST(concrete_inputs[11] AS BOOLEAN[])[1:2],
                                               lambda m: CASE WHEN m THEN 1 ELSE 0 END)), 2)
        WHEN conv_layout(name) IS NULL OR len(d[1]) < 3 OR len(d[2]) <> len(d[1]) THEN NULL
        WHEN conv_is_transposed(name, concrete_inputs) THEN conv_forward_flops(d[1][1], d[2], d[1][3:])
        WHEN NOT conv_is_transposed(name, concrete_inputs) THEN
            conv_forward_flops(d[1][1], d[2], conv_out_spatial(name, d[1], d[2], concrete_inputs))
    END
);

CREATE OR REPLACE MACRO conv_bytes(name, d, t, concrete_inputs) AS (
    CASE
        -- reads grad_output, input, weight; writes grad_input and grad_weight when asked for
        WHEN name = 'aten::convolution_backward' AND len(d[1]) >= 3 AND len(d[3]) = len(d[1]) THEN
            input_bytes(d[1:3], t[1:3])
            + (CASE WHEN coalesce(TRY_CAST(concrete_inputs[11] AS BOOLEAN[])[1], true) THEN shape_numel(d[2])
                    ELSE 0 END
               + CASE WHEN coalesce(TRY_CAST(concrete_inputs[11] AS BOOLEAN[])[2], true) THEN shape_numel(d[3])
                      ELSE 0 END)
              * dtype_bytes(t[1])
        WHEN conv_layout(name) IS NULL OR len(d[1]) < 3 OR len(d[2]) <> len(d[1]) THEN NULL
        ELSE input_bytes(d, t)
             + d[1][1]
               * CASE WHEN conv_is_transposed(name, concrete_inputs)
                      THEN d[2][2] * coalesce(TRY_CAST(concrete_inputs[conv_layout(name).groups] AS BIGINT), 1)
                      ELSE d[2][1] END
               * list_product(conv_out_spatial(name, d[1], d[2], concrete_inputs)) * dtype_bytes(t[1])
    END
);

-- ---------------------------------------------------------------------------------------------------------
-- Attention. Positions (1-based) of the first query/key/value shapes and of is_causal in each op's arguments;
-- backward ops start with grad_out. Shapes are [batch, heads, seq, head_dim]; key/value may have fewer heads
-- (grouped-query attention): the work follows the query heads.
CREATE OR REPLACE MACRO attention_layout(name) AS (
    CAST(CASE name
            WHEN 'aten::scaled_dot_product_attention' THEN {'q': 1, 'is_causal': 6, 'backward': false}
            WHEN 'aten::_scaled_dot_product_flash_attention' THEN {'q': 1, 'is_causal': 5, 'backward': false}
            WHEN 'aten::_scaled_dot_product_flash_attention_for_cpu' THEN {'q': 1, 'is_causal': 5, 'backward': false}
            WHEN 'aten::_scaled_dot_product_efficient_attention' THEN {'q': 1, 'is_causal': 7, 'backward': false}
            WHEN 'aten::_scaled_dot_product_cudnn_attention' THEN {'q': 1, 'is_causal': 7, 'backward': false}
            WHEN 'aten::_scaled_dot_product_flash_attention_backward' THEN {'q': 2, 'is_causal': 12, 'backward': true}
            WHEN 'aten::_scaled_dot_product_flash_attention_for_cpu_backward'
                THEN {'q': 2, 'is_causal': 8, 'backward': true}
            WHEN 'aten::_scaled_dot_product_efficient_attention_backward'
                THEN {'q': 2, 'is_causal': 12, 'backward': true}
            WHEN 'aten::_scaled_dot_product_cudnn_attention_backward' THEN {'q': 2, 'is_causal': 15, 'backward': true}
        END
    AS STRUCT(q INTEGER, is_causal INTEGER, backward BOOLEAN))
);

CREATE OR REPLACE MACRO attention_flops(name, d, concrete_inputs, attention_convention) AS (
    CASE WHEN attention_layout(name) IS NOT NULL
              AND len(d[attention_layout(name).q]) = 4 AND len(d[attention_layout(name).q + 2]) = 4 THEN
        -- 2·B·Hq·Sq·Skv per unit of head_dim, times the head dims the matmuls contract over
        2 * d[attention_layout(name).q][1] * d[attention_layout(name).q][2] * d[attention_layout(name).q][3]
          * d[attention_layout(name).q + 1][3]
          * CASE WHEN attention_layout(name).backward
                 THEN 3 * d[attention_layout(name).q][4] + 2 * d[attention_layout(name).q + 2][4]
                 ELSE d[attention_layout(name).q][4] + d[attention_layout(name).q + 2][4] END
          * CASE WHEN attention_convention = 'flash'
                      AND lower(concrete_inputs[attention_layout(name).is_causal]) = 'true' THEN 0.5 ELSE 1 END
    END
);

-- Forward: reads q, k, v (and mask), writes the output [B, Hq, Sq, d_v]. Backward: reads its tensor arguments,
-- writes dq, dk, dv.
CREATE OR REPLACE MACRO attention_bytes(name, d, t) AS (
    CASE WHEN attention_layout(name) IS NOT NULL
              AND len(d[attention_layout(name).q]) = 4 AND len(d[attention_layout(name).q + 2]) = 4 THEN
        input_bytes(d, t)
        + CASE WHEN attention_layout(name).backward
               THEN input_bytes(d[2:4], t[2:4])
               ELSE list_product(d[1][1:3]) * d[3][4] * dtype_bytes(t[1]) END
    END
);

-- ---------------------------------------------------------------------------------------------------------
-- Elementwise, norms, softmax: FLOPs per output element (in-place variants with a trailing '_' included).
CREATE OR REPLACE MACRO elementwise_cost(name) AS (
    CASE
        WHEN regexp_matches(name, '^aten::(add|sub|rsub|mul|div|neg|abs|reciprocal|maximum|minimum|clamp|clamp_min|'
                                  || 'clamp_max|pow|sqrt|rsqrt|exp|log|sin|cos|relu|gelu|silu|sigmoid|tanh|'
                                  || 'threshold_backward|gelu_backward|silu_backward|sigmoid_backward|'
                                  || 'tanh_backward)_?$') THEN 1
        WHEN regexp_matches(name, '^aten::(addcmul|addcdiv|lerp)_?$') THEN 2
        WHEN regexp_matches(name, '^aten::(layer_norm|native_layer_norm|native_layer_norm_backward|rms_norm|'
                                  || '_fused_rms_norm|_fused_rms_norm_backward|group_norm|native_group_norm|'
                                  || 'native_group_norm_backward|batch_norm|native_batch_norm|'
                                  || 'native_batch_norm_backward|softmax|_softmax|log_softmax|_log_softmax|'
                                  || '_softmax_backward_data|_log_softmax_backward_data)$') THEN 5
    END
);

-- Output elements of an elementwise op: its largest tensor argument (broadcasting); a norm or softmax keeps the
-- shape of its first argument, which is the largest one too.
CREATE OR REPLACE MACRO elementwise_numel(d) AS (
    list_max(list_transform(d, lambda s: shape_numel(s)))
);

-- Which formula an op name takes: 'gemm', 'conv', 'attention' (the math that FLOPs are usually about) or
-- 'elementwise' (elementwise, norms, softmax); NULL when tracesql has no formula for it.
CREATE OR REPLACE MACRO op_flop_family(name) AS (
    CASE
        WHEN name IN ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::baddbmm', 'aten::linear', 'aten::matmul',
                      'aten::_scaled_mm') THEN 'gemm'
        WHEN name IN ('aten::conv1d', 'aten::conv2d', 'aten::conv3d', 'aten::convolution', 'aten::_convolution',
                      'aten::conv_transpose1d', 'aten::conv_transpose2d', 'aten::conv_transpose3d',
                      'aten::cudnn_convolution', 'aten::cudnn_convolution_transpose', 'aten::mkldnn_convolution',
                      'aten::miopen_convolution', 'aten::miopen_convolution_transpose',
                      'aten::convolution_backward') THEN 'conv'
        WHEN attention_layout(name) IS NOT NULL THEN 'attention'
        WHEN elementwise_cost(name) IS NOT NULL THEN 'elementwise'
    END
);

-- The formula of the op's family, for arguments typed as the `ops` columns (op_flops/op_bytes cast literal
-- arguments such as [[64, 32], [32, 48]] to those types first, which DuckDB needs to bind the formulas).
CREATE OR REPLACE MACRO typed_op_flops(name, input_dims, concrete_inputs, attention_convention) AS (
    CAST(CASE op_flop_family(name)
        WHEN 'gemm' THEN 2 * gemm_mkn(name, input_dims).batch * gemm_mkn(name, input_dims).m
                           * gemm_mkn(name, input_dims).k * gemm_mkn(name, input_dims).n
        WHEN 'conv' THEN conv_flops(name, input_dims, concrete_inputs)
        WHEN 'attention' THEN attention_flops(name, input_dims, concrete_inputs, attention_convention)
        WHEN 'elementwise' THEN elementwise_cost(name) * elementwise_numel(input_dims)
    END AS DOUBLE)
);

CREATE OR REPLACE MACRO typed_op_bytes(name, input_dims, input_types, concrete_inputs) AS (
    CAST(CASE op_flop_family(name)
        WHEN 'gemm' THEN
            -- only the operands (and bias): an `out=` tensor recorded after them is the output, counted below
            CASE WHEN gemm_mkn(name, input_dims) IS NOT NULL THEN
                input_bytes(input_dims[1:gemm_operands(name)], input_types[1:gemm_operands(name)])
                + gemm_mkn(name, input_dims).batch * gemm_mkn(name, input_dims).m * gemm_mkn(name, input_dims).n
                  * CASE WHEN name = 'aten::_scaled_mm'
                         THEN coalesce(scalar_type_bytes(concrete_inputs[7]), 2)  -- out_dtype, else bf16
                         -- the output has the dtype of the first matrix
                         ELSE dtype_bytes(input_types[CASE WHEN name IN ('aten::addmm', 'aten::baddbmm') THEN 2
                                                           ELSE 1 END])
                    END
            END
        WHEN 'conv' THEN conv_bytes(name, input_dims, input_types, concrete_inputs)
        WHEN 'attention' THEN attention_bytes(name, input_dims, input_types)
        WHEN 'elementwise' THEN input_bytes(input_dims, input_types)
                                + elementwise_numel(input_dims) * op_dtype_bytes(input_types)
    END AS DOUBLE)
);

-- ---------------------------------------------------------------------------------------------------------
-- The public functions.

-- FLOPs of one op call from its recorded shapes (the `ops` columns name, input_dims, input_types,
-- concrete_inputs). NULL for ops without a formula or without recorded shapes. attention_convention: 'flash'
-- (causal attention counts half, as metrics.md) or 'torch' (never halved, as FlopCounterMode).
-- input_types is not needed for FLOPs; it is taken so that op_flops and op_bytes are called alike.
CREATE OR REPLACE MACRO op_flops(name, input_dims, input_types, concrete_inputs, attention_convention := 'flash') AS (
    typed_op_flops(CAST(name AS VARCHAR), CAST(input_dims AS BIGINT[][]), CAST(concrete_inputs AS VARCHAR[]),
                   attention_convention)
);

-- Bytes one op call moves at least: its tensor arguments read once and its output written once.
CREATE OR REPLACE MACRO op_bytes(name, input_dims, input_types, concrete_inputs) AS (
    typed_op_bytes(CAST(name AS VARCHAR), CAST(input_dims AS BIGINT[][]), CAST(input_types AS VARCHAR[]),
                   CAST(concrete_inputs AS VARCHAR[]))
);

-- FLOPs per byte.
CREATE OR REPLACE MACRO arithmetic_intensity(flops, bytes) AS (
    CASE WHEN bytes > 0 THEN flops / bytes END
);

-- The roofline's lower bound on an op's time: max(compute time at peak, memory time at peak bandwidth), ns.
CREATE OR REPLACE MACRO roofline_time_ns(flops, bytes, peak_flops_per_s, peak_bytes_per_s) AS (
    greatest(flops / peak_flops_per_s, bytes / peak_bytes_per_s) * 1e9
);

-- FLOP/s the roofline allows at this intensity: min(peak, AI · peak bandwidth).
CREATE OR REPLACE MACRO attainable_flops(flops, bytes, peak_flops_per_s, peak_bytes_per_s) AS (
    least(peak_flops_per_s, arithmetic_intensity(flops, bytes) * peak_bytes_per_s)
);

-- Model FLOPs utilization: model FLOPs / (time × devices × peak FLOP/s per device). Given the FLOPs the
-- hardware executed instead of the model's, it is HFU.
CREATE OR REPLACE MACRO mfu(model_flops, time_ns, devices, peak_flops_per_s) AS (
    model_flops / (time_ns / 1e9 * devices * peak_flops_per_s)
);

-- ---------------------------------------------------------------------------------------------------------
-- Table functions over a run.

-- Every op with its FLOPs and bytes, and whether it is *counted*: the ops whose FLOPs add up without double
-- counting. Wrappers record their inner ops too (aten::linear → aten::addmm, conv2d → convolution →
-- _convolution → cudnn_convolution, scaled_dot_product_attention → _scaled_dot_product_flash_attention), so:
-- - a GEMM/conv/attention op is counted when no op nested in it has a GEMM/conv/attention formula (the
--   innermost one: its shapes are the ones the kernel ran with);
-- - an elementwise/norm/softmax op is counted when no op nested in it has any formula and it is not inside a
--   GEMM/conv/attention op (the bias copy inside addmm, the softmax inside an unfused attention are part of
--   that op's work).
-- Nesting is interval containment on the op's thread (with a smaller op_depth), so it needs no parent links.
-- An op whose formula applies but whose shapes were not recorded has NULL flops and counts as having no formula.
-- profiler_flops is `ops.flops` (what torch.profiler(with_flops=True) attached, when the trace carries it).
-- XLA ops (family 'xla') take their FLOPs and bytes from `ops.flops` / `ops.bytes_accessed` (xla_ops) and are
-- always counted: one row per execution of an HLO op, none inside another.
CREATE OR REPLACE MACRO op_costs(attention_convention := 'flash') AS TABLE
WITH costed AS (
    SELECT run_id, rank, op_id, name, step, pid, tid, ts, dur, op_depth, input_dims, input_types,
        device_total_ns, flops AS profiler_flops,
        -- XLA ops (program_id set) carry XLA's own FLOPs and bytes (cost analysis, or counted from the HLO)
        CASE WHEN program_id IS NOT NULL THEN 'xla' ELSE op_flop_family(name) END AS family,
        CASE WHEN program_id IS NOT NULL THEN flops
             ELSE op_flops(name, input_dims, input_types, concrete_inputs, attention_convention := attention_convention)
        END AS op_flops,
        CASE WHEN program_id IS NOT NULL THEN bytes_accessed
             ELSE op_bytes(name, input_dims, input_types, concrete_inputs) END AS op_bytes,
        op_dtype(input_types) AS dtype
    FROM ops
), formula AS (
    SELECT * FROM costed WHERE op_flops IS NOT NULL AND family <> 'xla'  -- XLA ops never nest
), links AS (
    -- (outer, inner) pairs of ops with FLOPs where the outer one encloses the inner one
    SELECT i.run_id, i.rank, i.op_id AS inner_id, i.family AS inner_family,
        o.op_id AS outer_id, o.family AS outer_family
    FROM formula i JOIN formula o
      ON o.run_id = i.run_id AND o.rank = i.rank AND o.pid = i.pid AND o.tid = i.tid
     AND o.ts <= i.ts AND o.ts + o.dur >= i.ts + i.dur AND o.op_depth < i.op_depth
), has_inner AS (
    SELECT run_id, rank, outer_id AS op_id, bool_or(inner_family <> 'elementwise') AS math_inside
    FROM links GROUP BY run_id, rank, outer_id
), has_outer_math AS (
    SELECT DISTINCT run_id, rank, inner_id AS op_id FROM links WHERE outer_family <> 'elementwise'
)
SELECT c.run_id, c.rank, c.op_id, c.name, c.step, c.family, c.dtype, c.input_dims, c.input_types,
    c.op_flops AS flops, c.op_bytes AS bytes, c.device_total_ns, c.profiler_flops,
    c.op_flops IS NOT NULL AND CASE
        WHEN c.family <> 'elementwise' THEN NOT coalesce(i.math_inside, false)
        ELSE i.op_id IS NULL AND m.op_id IS NULL
    END AS counted
FROM costed c
LEFT JOIN has_inner i ON i.run_id = c.run_id AND i.rank = c.rank AND i.op_id = c.op_id
LEFT JOIN has_outer_math m ON m.run_id = c.run_id AND m.rank = c.rank AND m.op_id = c.op_id;

-- The peaks of the device each rank ran on, one row per (run, rank, dtype): the `device_peaks` row whose
-- name_regex matches the rank's device name (the rows' patterns never overlap on a real name: a name two rows
-- match, such as 'AMD Instinct MI250X / MI250', is ambiguous and gets no device), or the row named by device_key
-- (e.g. 'H100-SXM') for every rank. peak_flops / peak_bytes_per_s, when given, replace the table's peaks (for
-- every dtype), also for a device the table lacks. device_note says why a rank has no device.
CREATE OR REPLACE MACRO rank_device_peaks(device_key := NULL, peak_flops := NULL, peak_bytes_per_s := NULL) AS TABLE
WITH named AS (  -- the rank's most common device name (ties: the first by name)
    SELECT run_id, rank, name, row_number() OVER (PARTITION BY run_id, rank ORDER BY count(*) DESC, name) AS nth
    FROM devices WHERE name IS NOT NULL GROUP BY run_id, rank, name
), rank_device AS (
    SELECT r.run_id, r.rank, n.name AS device_name
    FROM ranks r LEFT JOIN named n ON n.run_id = r.run_id AND n.rank = r.rank AND n.nth = 1
), by_name AS (
    SELECT rd.run_id, rd.rank, rd.device_name, count(p.device) AS matches, min(p.device) AS first_match,
        max(p.device) AS last_match
    FROM rank_device rd
    LEFT JOIN device_peaks p ON regexp_matches(rd.device_name, p.name_regex)
    GROUP BY rd.run_id, rd.rank, rd.device_name
), matched AS (
    SELECT run_id, rank, device_name,
        CASE WHEN device_key IS NOT NULL THEN device_key WHEN matches = 1 THEN first_match END AS device,
        CASE WHEN device_key IS NOT NULL THEN NULL
             WHEN device_name IS NULL THEN 'the trace names no device'
             WHEN matches > 1 THEN 'ambiguous device name ''' || device_name || ''': ' || first_match
                                   || CASE WHEN matches > 2 THEN ', ..., ' ELSE ' or ' END || last_match
             WHEN matches = 0 THEN 'unknown device ''' || device_name || ''' (not in device_peaks)'
        END AS device_note
    FROM by_name
), peaks AS (
    UNPIVOT device_peaks ON fp64, fp32, tf32, bf16, fp16, fp8, int8 INTO NAME dtype VALUE peak_flops_per_s
), dtypes AS (
    SELECT unnest(['fp64', 'fp32', 'tf32', 'bf16', 'fp16', 'fp8', 'int8']) AS dtype
)
SELECT m.run_id, m.rank, m.device_name, m.device, m.device_note, t.dtype,
    CAST(coalesce(peak_flops, p.peak_flops_per_s) AS DOUBLE) AS peak_flops_per_s,
    CAST(coalesce(peak_bytes_per_s, d.bytes_per_s) AS DOUBLE) AS peak_bytes_per_s,
    d.link_bytes_per_s
FROM matched m CROSS JOIN dtypes t
LEFT JOIN device_peaks d ON d.device = m.device
LEFT JOIN peaks p ON p.device = m.device AND p.dtype = t.dtype;
