-- FLOPs and bytes per op: the formulas of each op family (35_roofline.sql has the functions over them: op_flops,
-- op_bytes, arithmetic intensity, roofline, MFU, and the peaks of the device a run ran on).
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
-- - memory-bound ops, a small multiple of the elements (FlopCounterMode counts them as 0; they are here so that
--   their time shows on the roofline): elementwise 1 per output element (a transcendental function counts as
--   one; 2 for addcmul/addcdiv/lerp); reductions 1 per input element (var/std 3, norms 2, logsumexp 3);
--   layer/group/batch norm 5 per element (batch norm on running statistics 2, RMS norm 4), backward 8 for
--   grad_input + 2 for grad_weight + 1 for grad_bias as output_mask asks; softmax 5; bilinear and other
--   interpolation one multiply-add per tap; copies, casts, nearest upsampling, gathers and views 0;
-- - Inductor's generated Triton kernels (triton_poi_* pointwise, triton_red_* / triton_per_* reductions: the
--   launch is recorded as an op with the kernel's tensor arguments): 0 FLOPs (the fused arithmetic is not
--   recorded) and each tensor argument moved once (a buffer read and written in place counts once: a lower bound).
-- Bytes are what the op must read and write at least (metrics.md: each tensor input read once, the output
-- written once), the minimum traffic that the memory roof assumes, in the real dtypes: an `out=` tensor is only
-- written (and sets the result dtype); an in-place op reads and writes its first argument once; the result of
-- an elementwise op has the promoted dtype (torch.result_type: add(fp16, fp32) writes fp32) and the broadcast
-- shape; a reduction writes the reduced shape (max/min over a dim: values and int64 indices); a norm also
-- writes its statistics (float32); a copy/cast reads the source and writes the destination in its dtype;
-- a gather reads its index and the elements it moves; views and allocations move nothing.
-- docs/concepts/cost-model.md states every convention and where it differs from FlopCounterMode and TraceLens.
-- Shapes come from Kineto's record_shapes: `ops.input_dims` (one list per argument, [] for non-tensors),
-- `ops.input_types`, and `ops.concrete_inputs` (values of scalar arguments: stride, padding, is_causal, ...).
-- When what a formula needs is not recorded the result is NULL, never a guess.

-- Elements of one recorded shape; NULL for a non-tensor argument ([] in Input Dims) or a missing one.
CREATE OR REPLACE MACRO shape_numel(dims) AS (
    CASE WHEN len(dims) > 0 THEN list_product(dims) END
);

-- Bytes of every tensor argument with dimensions in `args` (op_args(), or a slice of it), read once (a 0-dim tensor,
-- a non-tensor or a missing argument: 0).
CREATE OR REPLACE MACRO args_bytes(args) AS (
    list_sum(list_transform(args, lambda x: CASE WHEN x.ndim > 0 THEN coalesce(x.numel * x.bpe, 0) ELSE 0 END))
);

-- Bytes per element of the op's first tensor argument.
CREATE OR REPLACE MACRO op_dtype_bytes(input_types) AS (
    list_filter(list_transform(input_types, lambda t: dtype_bytes(t)), lambda b: b IS NOT NULL)[1]
);

-- The dtype of the op's first tensor argument, as a device_peaks column name: fp64, fp32, bf16, fp16, fp8, fp4,
-- int8 (NULL when the op records no tensor dtype). TF32 is not a storage type, and a block-scaled (MX) or sparse
-- GEMM is not told by its operands' dtype: pass dtype := 'tf32', 'mxfp4', 'fp8_sparse', ... to the queries to
-- rate against those peaks.
CREATE OR REPLACE MACRO op_dtype(input_types) AS (
    list_filter(list_transform(input_types, lambda t:
        CASE
            WHEN t IS NULL OR dtype_bytes(t) IS NULL THEN NULL
            WHEN regexp_matches(lower(t), 'float8|fp8|e4m3|e5m2') THEN 'fp8'
            WHEN regexp_matches(lower(t), 'float4|fp4|e2m1') THEN 'fp4'
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
-- 1-D operands, _scaled_mm(a, b, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum); the grouped
-- GEMMs of MoE layers _grouped_mm(a, b, offs, bias, out_dtype) and _scaled_grouped_mm(a, b, scale_a, scale_b,
-- offs, bias, scale_result, out_dtype, use_fast_accum), whose `offs` (G group ends) cut one operand into G groups:
-- a [M_total, K] · b [G, K, N] (tokens routed to G experts: row group g times expert g) -> [M_total, N];
-- a [G, M, K] · b [G, K, N] (no offs: a batch) -> [G, M, N]; a [M, K_total] · b [K_total, N] (K cut: the
-- experts' weight gradients) -> [G, M, N]; a [G, M, K] · b [K, N_total] (N cut) -> [M, N_total]. Each row, column
-- or K slice meets one group only, so the work is that of one GEMM over the uncut dims.

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
    CASE WHEN name IN ('aten::addmm', 'aten::baddbmm', 'aten::linear') THEN 3
         -- the scales of a grouped FP8/MX GEMM (per row, or per block of 32: not tiny)
         WHEN name = 'aten::_scaled_grouped_mm' THEN 4
         ELSE 2 END
);

-- How many [M, N] output matrices a GEMM writes per batch element: G for a grouped GEMM cut along K (its offs'
-- length), else 1.
CREATE OR REPLACE MACRO gemm_out_matrices(name, d) AS (
    CASE WHEN name IN ('aten::_grouped_mm', 'aten::_scaled_grouped_mm') AND len(d[1]) = 2 AND len(d[2]) = 2
         THEN d[CASE WHEN name = 'aten::_grouped_mm' THEN 3 ELSE 5 END][1]
         ELSE 1 END
);

-- (batch, M, K, N) of a GEMM op; NULL when its shapes are not recorded.
CREATE OR REPLACE MACRO gemm_mkn(name, d) AS (
    CAST(CASE
            WHEN name IN ('aten::_grouped_mm', 'aten::_scaled_grouped_mm') THEN CASE
                WHEN len(d[1]) = 2 AND len(d[2]) = 3 THEN {'batch': 1, 'm': d[1][1], 'k': d[1][2], 'n': d[2][3]}
                WHEN len(d[1]) = 3 AND len(d[2]) = 3 THEN {'batch': d[1][1], 'm': d[1][2], 'k': d[1][3], 'n': d[2][3]}
                WHEN len(d[1]) = 2 AND len(d[2]) = 2 THEN {'batch': 1, 'm': d[1][1], 'k': d[1][2], 'n': d[2][2]}
                WHEN len(d[1]) = 3 AND len(d[2]) = 2 THEN {'batch': 1, 'm': d[1][2], 'k': d[1][3], 'n': d[2][2]}
            END
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

-- The i-th value of an int-list argument (ints = '[2, 2]' as BIGINT[]); a one-element list applies to every
-- spatial dim.
CREATE OR REPLACE MACRO concrete_int(ints, i) AS (
    CASE WHEN len(ints) = 1 THEN ints[1] ELSE ints[i] END
);

-- What the formulas read of one convolution call: its layout (l = conv_layout(name), NULL when the op is none),
-- whether it is transposed (by its name, else by its `transposed` argument; NULL if not recorded), its stride,
-- padding, dilation and output_padding as int lists and its padding as text ('same', 'valid'). The formulas take
-- it once per call as a lambda's argument: a macro is expanded, bound and optimized at each of its uses.
CREATE OR REPLACE MACRO conv_call(name, concrete_inputs) AS (
    list_transform([conv_layout(name)], lambda l:
        {'l': l, 'transposed': coalesce(l.is_transposed, TRY_CAST(concrete_inputs[l.transposed] AS BOOLEAN)),
         'stride': TRY_CAST(concrete_inputs[l.stride] AS BIGINT[]),
         'padding': TRY_CAST(concrete_inputs[l.padding] AS BIGINT[]),
         'padding_text': lower(trim(concrete_inputs[l.padding], '''" ')),
         'dilation': TRY_CAST(concrete_inputs[l.dilation] AS BIGINT[]),
         'output_padding': TRY_CAST(concrete_inputs[l.output_padding] AS BIGINT[])})[1]
);

-- Output spatial sizes of a convolution (x = input shape, w = weight shape), from stride/padding/dilation:
-- out = floor((in + 2·pad − dil·(k − 1) − 1) / stride) + 1, or for a transposed one
-- out = (in − 1)·stride − 2·pad + dil·(k − 1) + output_padding + 1. padding 'valid' is 0; 'same' keeps the size.
-- NULL when those arguments were not recorded. s = conv_call().
CREATE OR REPLACE MACRO conv_out_spatial(s, x, w) AS (
    CASE WHEN len(x) >= 3 AND len(w) = len(x) THEN
    list_transform(range(1, len(x) - 1), lambda j:
        CASE
            WHEN s.padding_text = 'same' THEN x[j + 2]
            WHEN s.transposed THEN
                (x[j + 2] - 1) * concrete_int(s.stride, j)
                - 2 * concrete_int(s.padding, j)
                + concrete_int(s.dilation, j) * (w[j + 2] - 1)
                + coalesce(concrete_int(s.output_padding, j), 0) + 1
            ELSE
                (x[j + 2]
                 + 2 * CASE WHEN s.padding_text = 'valid' THEN 0 ELSE concrete_int(s.padding, j) END
                 - concrete_int(s.dilation, j) * (w[j + 2] - 1) - 1)
                // concrete_int(s.stride, j) + 1
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
        WHEN len(d[1]) < 3 OR len(d[2]) <> len(d[1]) THEN NULL
        ELSE list_transform([conv_call(name, concrete_inputs)], lambda cv: CASE
            WHEN cv.l IS NULL THEN NULL
            WHEN cv.transposed THEN conv_forward_flops(d[1][1], d[2], d[1][3:])
            WHEN NOT cv.transposed THEN
                conv_forward_flops(d[1][1], d[2], conv_out_spatial(cv, d[1], d[2]))
        END)[1]
    END
);

CREATE OR REPLACE MACRO conv_bytes(name, d, a, concrete_inputs) AS (
    CASE
        -- reads grad_output, input, weight; writes grad_input and grad_weight when asked for
        WHEN name = 'aten::convolution_backward' AND len(d[1]) >= 3 AND len(d[3]) = len(d[1]) THEN
            args_bytes(a[1:3])
            + (CASE WHEN coalesce(TRY_CAST(concrete_inputs[11] AS BOOLEAN[])[1], true) THEN shape_numel(d[2])
                    ELSE 0 END
               + CASE WHEN coalesce(TRY_CAST(concrete_inputs[11] AS BOOLEAN[])[2], true) THEN shape_numel(d[3])
                      ELSE 0 END)
              * a[1].bpe
        WHEN len(d[1]) < 3 OR len(d[2]) <> len(d[1]) THEN NULL
        ELSE list_transform([conv_call(name, concrete_inputs)], lambda cv: CASE WHEN cv.l IS NOT NULL THEN
            args_bytes(a)
            + d[1][1]
              * CASE WHEN cv.transposed
                     THEN d[2][2] * coalesce(TRY_CAST(concrete_inputs[cv.l.groups] AS BIGINT), 1)
                     ELSE d[2][1] END
              * list_product(conv_out_spatial(cv, d[1], d[2])) * a[1].bpe
        END)[1]
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

-- The layout once per call (a lambda's argument), not expanded at each of its uses.
CREATE OR REPLACE MACRO attention_flops(name, d, concrete_inputs, attention_convention) AS (
    list_transform([attention_layout(name)], lambda al:
    CASE WHEN al IS NOT NULL AND len(d[al.q]) = 4 AND len(d[al.q + 2]) = 4 THEN
        -- 2·B·Hq·Sq·Skv per unit of head_dim, times the head dims the matmuls contract over
        2 * d[al.q][1] * d[al.q][2] * d[al.q][3] * d[al.q + 1][3]
          * CASE WHEN al.backward THEN 3 * d[al.q][4] + 2 * d[al.q + 2][4] ELSE d[al.q][4] + d[al.q + 2][4] END
          * CASE WHEN attention_convention = 'flash' AND lower(concrete_inputs[al.is_causal]) = 'true' THEN 0.5
                 ELSE 1 END
    END)[1]
);

-- Forward: reads q, k, v (and mask), writes the output [B, Hq, Sq, d_v]. Backward: reads its tensor arguments,
-- writes dq, dk, dv.
CREATE OR REPLACE MACRO attention_bytes(name, d, a) AS (
    list_transform([attention_layout(name)], lambda al:
    CASE WHEN al IS NOT NULL AND len(d[al.q]) = 4 AND len(d[al.q + 2]) = 4 THEN
        args_bytes(a)
        + CASE WHEN al.backward THEN args_bytes(a[2:4])
               ELSE list_product(d[1][1:3]) * d[3][4] * a[1].bpe END
    END)[1]
);

-- ---------------------------------------------------------------------------------------------------------
-- Arguments, as Kineto records them: one entry per argument of the op's schema, in order, defaults included. A
-- tensor has its shape ([] when 0-dim) and dtype; any other argument an empty shape and a kind ('Scalar',
-- 'ScalarList', 'TensorList' (whose shapes are not kept), '' for None or a string). Names carry no overload:
-- `aten::mul` is both mul and mul.out, which records its `out=` tensor as one more argument. Other recorders
-- write the overload (`aten::mul.out`); both are read alike.

-- The op name without its overload: 'aten::mul.out' -> 'aten::mul'.
CREATE OR REPLACE MACRO op_base_name(name) AS (
    regexp_replace(name, '^(aten::[A-Za-z0-9_]+)[.][A-Za-z0-9_]+$', '\1')
);

-- The overload an op name carries ('aten::mul.out' -> 'out'), else NULL.
CREATE OR REPLACE MACRO op_overload(name) AS (
    nullif(regexp_extract(name, '^aten::[A-Za-z0-9_]+[.]([A-Za-z0-9_]+)$', 1), '')
);

-- PyTorch's dtype categories, as type promotion orders them: 0 bool, 1 integer, 2 floating point, 3 complex;
-- NULL for what is not a tensor dtype.
CREATE OR REPLACE MACRO dtype_category(dtype) AS (
    CASE
        WHEN dtype_bytes(dtype) IS NULL THEN NULL
        WHEN regexp_matches(lower(dtype), 'complex|^c64$|^c128$') THEN 3
        WHEN regexp_matches(lower(dtype), 'float|half|double|bf16|fp8|fp16|fp32|fp64|e4m3|e5m2|^f[0-9]') THEN 2
        WHEN regexp_matches(lower(dtype), 'bool|^pred$') THEN 0
        ELSE 1
    END
);

-- Each argument of an op as the cost formulas read it: numel (elements of a tensor, 1 when 0-dim; NULL when
-- the argument is not a tensor), bpe (bytes per element), ndim, type and value (the recorded dtype or kind, and
-- the Concrete Inputs value of a scalar argument), and what type promotion needs (promoted_bytes): rank =
-- 3 · category + 2 for a tensor with dimensions, + 1 for a 0-dim tensor, + 0 for a Python number (a 'Scalar'
-- argument, by its recorded value: 1.5 floating, 2 integer, True bool; or a 0-dim 'double' / 'long int'
-- tensor, as Kineto records a Python number passed for a tensor); half / bf16: 1 when float16 / bfloat16.
-- tracesql/op_costs.sql makes it once per distinct call.
CREATE OR REPLACE MACRO op_args(d, t, c) AS (
    list_transform(range(1, coalesce(len(d), 0) + 1), lambda i:
    -- the dtype's bytes and category once per argument (a lambda's argument)
    list_transform([{'bpe': dtype_bytes(t[i]), 'cat': dtype_category(t[i])}], lambda ty: {
        'numel': CASE WHEN d[i] IS NOT NULL AND ty.bpe IS NOT NULL THEN coalesce(list_product(d[i]), 1) END,
        'bpe': ty.bpe,
        'cat': ty.cat,
        'ndim': len(d[i]),
        'type': t[i],
        'value': c[i],
        'rank': CASE
            WHEN d[i] IS NULL THEN NULL
            WHEN ty.bpe IS NOT NULL AND len(d[i]) > 0 THEN 3 * ty.cat + 2
            WHEN t[i] = 'double' THEN 6
            WHEN t[i] = 'long int' THEN 3
            WHEN ty.bpe IS NOT NULL THEN 3 * ty.cat + 1
            WHEN t[i] = 'Scalar' AND coalesce(c[i], '') <> '' THEN CASE
                WHEN c[i] IN ('True', 'False') THEN 0
                WHEN regexp_matches(c[i], '^-?[0-9]+$') THEN 3
                ELSE 6 END
            END,
        'half': CASE WHEN regexp_matches(lower(coalesce(t[i], '')), 'half|float16|fp16|^f16$')
                          AND NOT regexp_matches(lower(t[i]), 'bfloat16') THEN 1 ELSE 0 END,
        'bf16': CASE WHEN regexp_matches(lower(coalesce(t[i], '')), 'bfloat16|bf16') THEN 1 ELSE 0 END})[1])
);

-- The positions (1-based) of the tensor arguments among the first n.
CREATE OR REPLACE MACRO tensor_positions(a, n) AS (
    list_filter(range(1, least(coalesce(len(a), 0), n) + 1), lambda i: a[i].numel IS NOT NULL)
);

-- Bytes of reading once each tensor argument at `positions`.
CREATE OR REPLACE MACRO read_bytes(a, positions) AS (
    coalesce(list_sum(list_transform(positions, lambda i: a[i].numel * a[i].bpe)), 0)
);

-- Elements of the broadcast of the tensors at `positions` (shapes aligned from the right, as torch does).
CREATE OR REPLACE MACRO broadcast_numel(d, positions) AS (
    list_transform([positions], lambda ps: coalesce(list_product(list_transform(
        range(1, coalesce(list_max(list_transform(ps, lambda i: len(d[i]))), 0) + 1),
        lambda j: CASE
            WHEN list_min(list_transform(ps, lambda i: coalesce(list_reverse(d[i])[j], 1))) = 0 THEN 0
            ELSE list_max(list_transform(ps, lambda i: coalesce(list_reverse(d[i])[j], 1))) END)), 1))[1]
);

-- Bytes per element of the result of an op over the arguments at `positions`, by PyTorch's type promotion
-- (torch.result_type): the highest category (bool < integer < floating < complex) decides; within it tensors
-- with dimensions come first, then 0-dim tensors, then Python numbers, and the result is the widest dtype of
-- the first present (float16 with bfloat16: float32), or for Python numbers the default dtype (float32, int64,
-- complex64). See op_args' rank.
CREATE OR REPLACE MACRO promoted_bytes(a, positions) AS (
    -- the positions, the top rank and the arguments of that rank each once (lambdas' arguments)
    list_transform([positions], lambda ps:
    list_transform([list_max(list_transform(ps, lambda i: a[i].rank))], lambda top:
    list_transform([list_filter(ps, lambda i: a[i].rank = top)], lambda tops: CASE
        WHEN top IS NULL THEN NULL
        WHEN top % 3 = 0 THEN CASE top // 3 WHEN 0 THEN 1 WHEN 1 THEN 8 WHEN 2 THEN 4 ELSE 8 END
        WHEN list_max(list_transform(tops, lambda i: a[i].bpe)) = 2
             AND list_max(list_transform(tops, lambda i: a[i].half)) = 1
             AND list_max(list_transform(tops, lambda i: a[i].bf16)) = 1
            THEN 4
        ELSE list_max(list_transform(tops, lambda i: a[i].bpe))
    END)[1])[1])[1]
);

-- Does the op write an `out=` tensor given as its last argument: its name says so (overload 'out' or '*_out'),
-- or a tensor is recorded after the `arity` arguments of the op's functional form. That tensor is written, not
-- read, and its dtype is the result's.
CREATE OR REPLACE MACRO has_out_arg(name, a, arity) AS (
    coalesce(a[-1].numel IS NOT NULL AND len(a) > 1
             AND (op_overload(name) = 'out' OR op_overload(name) LIKE '%_out' OR len(a) > arity), false)
);

-- Is the op in-place (aten::add_, aten::relu_): it reads and writes its first argument, in that one's dtype.
CREATE OR REPLACE MACRO op_is_inplace(base) AS (
    regexp_matches(base, '^aten::[A-Za-z0-9_]*[A-Za-z0-9]_$')
);

-- The functional form's name of an in-place op ('aten::add_' -> 'aten::add').
CREATE OR REPLACE MACRO op_core_name(base) AS (
    CASE WHEN op_is_inplace(base) THEN regexp_replace(base, '_$', '') ELSE base END
);

-- ---------------------------------------------------------------------------------------------------------
-- Elementwise ops: FLOPs per output element (a transcendental function counts as one), how many arguments the
-- functional form takes (to tell an `out=` tensor from an input), and the result's dtype when it is not the
-- promoted one ('bool' for comparisons, 'self' for the first argument's).
CREATE OR REPLACE MACRO elementwise_spec(core) AS (
    CAST(CASE
        WHEN core IN ('aten::abs', 'aten::neg', 'aten::reciprocal', 'aten::sqrt', 'aten::rsqrt', 'aten::exp',
                      'aten::exp2', 'aten::expm1', 'aten::log', 'aten::log2', 'aten::log10', 'aten::log1p',
                      'aten::sin', 'aten::cos', 'aten::tan', 'aten::sinh', 'aten::cosh', 'aten::asin', 'aten::acos',
                      'aten::atan', 'aten::tanh', 'aten::sigmoid', 'aten::relu', 'aten::relu6', 'aten::silu',
                      'aten::mish', 'aten::selu', 'aten::hardswish', 'aten::hardsigmoid', 'aten::erf', 'aten::erfc',
                      'aten::erfinv', 'aten::sign', 'aten::sgn', 'aten::floor', 'aten::ceil', 'aten::trunc',
                      'aten::frac', 'aten::round', 'aten::square', 'aten::bitwise_not')
            THEN {'flops': 1, 'arity': 1, 'result': NULL}
        WHEN core IN ('aten::logical_not', 'aten::isnan', 'aten::isinf', 'aten::isfinite', 'aten::signbit')
            THEN {'flops': 1, 'arity': 1, 'result': 'bool'}
        WHEN core IN ('aten::gelu', 'aten::leaky_relu', 'aten::celu', 'aten::logit', 'aten::glu')
            THEN {'flops': 1, 'arity': 2, 'result': NULL}
        WHEN core IN ('aten::mul', 'aten::div', 'aten::true_divide', 'aten::floor_divide', 'aten::maximum',
                      'aten::minimum', 'aten::fmax', 'aten::fmin', 'aten::pow', 'aten::fmod', 'aten::remainder',
                      'aten::atan2', 'aten::copysign', 'aten::hypot', 'aten::xlogy', 'aten::bitwise_and',
                      'aten::bitwise_or', 'aten::bitwise_xor', 'aten::clamp_min', 'aten::clamp_max',
                      'aten::silu_backward', 'aten::sigmoid_backward', 'aten::tanh_backward', 'aten::mish_backward',
                      'aten::hardswish_backward', 'aten::hardsigmoid_backward')
            THEN {'flops': 1, 'arity': 2, 'result': NULL}
        WHEN core IN ('aten::eq', 'aten::ne', 'aten::lt', 'aten::le', 'aten::gt', 'aten::ge', 'aten::logical_and',
                      'aten::logical_or', 'aten::logical_xor')
            THEN {'flops': 1, 'arity': 2, 'result': 'bool'}
        WHEN core IN ('aten::add', 'aten::sub', 'aten::rsub', 'aten::clamp', 'aten::clip', 'aten::where',
                      'aten::hardtanh', 'aten::softplus', 'aten::threshold', 'aten::threshold_backward',
                      'aten::gelu_backward', 'aten::native_dropout_backward', 'aten::logit_backward')
            THEN {'flops': 1, 'arity': 3, 'result': NULL}
        WHEN core IN ('aten::masked_fill') THEN {'flops': 1, 'arity': 3, 'result': 'self'}
        WHEN core IN ('aten::leaky_relu_backward', 'aten::hardtanh_backward', 'aten::softplus_backward',
                      'aten::nan_to_num', 'aten::elu')
            THEN {'flops': 1, 'arity': 4, 'result': NULL}
        WHEN core IN ('aten::elu_backward') THEN {'flops': 1, 'arity': 6, 'result': NULL}
        WHEN core IN ('aten::lerp') THEN {'flops': 2, 'arity': 3, 'result': NULL}
        WHEN core IN ('aten::addcmul', 'aten::addcdiv') THEN {'flops': 2, 'arity': 4, 'result': NULL}
    END AS STRUCT(flops INTEGER, arity INTEGER, result VARCHAR))
);

-- Output elements of an elementwise op: the out tensor's, the first argument's (in place), else the broadcast of
-- its tensor arguments. k = op_kind().
CREATE OR REPLACE MACRO elementwise_out_numel(k, d, a) AS (
    CASE
        WHEN k.out THEN a[-1].numel
        WHEN k.inplace THEN a[1].numel
        ELSE broadcast_numel(d, tensor_positions(a, k.ew.arity))
    END
);

-- Bytes per element of an elementwise op's result: the out tensor's dtype, the first argument's (in place, or
-- when the op keeps it), bool for comparisons, else the promoted dtype of its operands (add/sub/rsub: alpha,
-- the 3rd argument, is no operand).
CREATE OR REPLACE MACRO elementwise_out_bpe(k, a) AS (
    CASE
        WHEN k.out THEN a[-1].bpe
        WHEN k.inplace OR k.ew.result = 'self' THEN a[1].bpe
        WHEN k.ew.result = 'bool' THEN 1
        ELSE promoted_bytes(a, range(1, CASE WHEN k.core IN ('aten::add', 'aten::sub', 'aten::rsub') THEN 2
                                             ELSE k.ew.arity END + 1))
    END
);

-- Reads every tensor argument but the out one, writes the output.
CREATE OR REPLACE MACRO elementwise_bytes(k, d, a) AS (
    CASE WHEN len(tensor_positions(a, 99)) > 0 THEN
        read_bytes(a, tensor_positions(a, CASE WHEN k.out THEN len(a) - 1 ELSE len(a) END))
        + elementwise_out_numel(k, d, a) * elementwise_out_bpe(k, a)
    END
);

-- ---------------------------------------------------------------------------------------------------------
-- Reductions: where the op takes its `dim` argument, FLOPs per input element, how many outputs of the reduced
-- shape it writes, and what they are: 'input' (the input's dtype, or the `dtype` argument at `dtype` when given),
-- 'sum' (as input, but integer and bool inputs sum to int64), 'index' (int64), 'bool', 'scan' (the input's
-- shape: cumsum). max/min with a dim also write int64 indices (`indices`).
CREATE OR REPLACE MACRO reduction_spec(core) AS (
    -- ops with the same spec share a branch: each branch is bound and optimized where the macro is used
    CAST(CASE
        WHEN core IN ('aten::sum', 'aten::nansum', 'aten::prod')
            THEN {'dim': 2, 'dtype': 4, 'flops': 1, 'outputs': 1, 'result': 'sum', 'indices': false}
        WHEN core IN ('aten::mean', 'aten::nanmean')
            THEN {'dim': 2, 'dtype': 4, 'flops': 1, 'outputs': 1, 'result': 'input', 'indices': false}
        WHEN core IN ('aten::amax', 'aten::amin')
            THEN {'dim': 2, 'dtype': NULL, 'flops': 1, 'outputs': 1, 'result': 'input', 'indices': false}
        WHEN core = 'aten::aminmax'
            THEN {'dim': 2, 'dtype': NULL, 'flops': 2, 'outputs': 2, 'result': 'input', 'indices': false}
        WHEN core IN ('aten::max', 'aten::min')
            THEN {'dim': 2, 'dtype': NULL, 'flops': 1, 'outputs': 1, 'result': 'input', 'indices': true}
        WHEN core IN ('aten::argmax', 'aten::argmin', 'aten::count_nonzero')
            THEN {'dim': 2, 'dtype': NULL, 'flops': 1, 'outputs': 1, 'result': 'index', 'indices': false}
        WHEN core IN ('aten::all', 'aten::any')
            THEN {'dim': 2, 'dtype': NULL, 'flops': 1, 'outputs': 1, 'result': 'bool', 'indices': false}
        WHEN core IN ('aten::var', 'aten::std', 'aten::logsumexp')
            THEN {'dim': 2, 'dtype': NULL, 'flops': 3, 'outputs': 1, 'result': 'input', 'indices': false}
        WHEN core IN ('aten::var_mean', 'aten::std_mean')
            THEN {'dim': 2, 'dtype': NULL, 'flops': 3, 'outputs': 2, 'result': 'input', 'indices': false}
        WHEN core IN ('aten::norm', 'aten::linalg_norm', 'aten::linalg_vector_norm')
            THEN {'dim': 3, 'dtype': 5, 'flops': 2, 'outputs': 1, 'result': 'input', 'indices': false}
        WHEN core IN ('aten::cumsum', 'aten::cumprod')
            THEN {'dim': 2, 'dtype': 3, 'flops': 1, 'outputs': 1, 'result': 'scan', 'indices': false}
    END AS STRUCT(dim INTEGER, dtype INTEGER, flops INTEGER, outputs INTEGER, result VARCHAR, indices BOOLEAN))
);


-- The dims a reduction's `dim` argument names ('[1]', '1', '[-1, -2]'), 0-based and non-negative for an input of
-- `ndim` dims; [] when it names none (a full reduction: '', '[]', None).
CREATE OR REPLACE MACRO reduced_dims(dim_value, ndim) AS (
    list_transform(
        list_filter(CASE WHEN regexp_matches(coalesce(dim_value, ''), '^\[[-0-9, ]*\]$')
                         THEN TRY_CAST(dim_value AS BIGINT[])
                         WHEN regexp_matches(coalesce(dim_value, ''), '^-?[0-9]+$')
                         THEN [TRY_CAST(dim_value AS BIGINT)]
                         ELSE [] END, lambda x: x IS NOT NULL),
        lambda x: CASE WHEN x < 0 THEN x + ndim ELSE x END)
);

-- Elements a reduction writes per output: the input's with the reduced dims removed (keepdim keeps them as 1:
-- the same count); 1 for a full reduction; the input's for a scan. The reduced dims once (a lambda's argument).
CREATE OR REPLACE MACRO reduction_out_numel(r, d, c) AS (
    list_transform([reduced_dims(c[r.dim], len(d[1]))], lambda dims: CASE
        WHEN r.result = 'scan' THEN coalesce(list_product(d[1]), 1)
        -- the dim argument exists but Concrete Inputs were not recorded (older traces): unknown
        WHEN c IS NULL AND len(d) >= r.dim AND len(d[1]) > 1 THEN NULL
        WHEN len(dims) = 0 THEN 1
        ELSE coalesce(list_product(list_transform(
                 list_filter(range(1, len(d[1]) + 1), lambda j: NOT list_contains(dims, j - 1)),
                 lambda j: d[1][j])), 1)
    END)[1]
);

-- Bytes per element of a reduction's result.
CREATE OR REPLACE MACRO reduction_out_bpe(r, a, c) AS (
    CASE r.result
        WHEN 'index' THEN 8
        WHEN 'bool' THEN 1
        ELSE coalesce(scalar_type_bytes(c[r.dtype]),
                      CASE WHEN r.result IN ('sum', 'scan') AND a[1].cat <= 1 THEN 8 END,
                      a[1].bpe)
    END
);

-- A reduction reads its input once and writes its outputs (an `out=` tensor: in that one's dtype); max/min
-- with a second tensor are the elementwise maximum/minimum.
CREATE OR REPLACE MACRO reduction_bytes(k, d, a, c) AS (
    CASE WHEN a[1].numel IS NOT NULL THEN
        list_transform([reduction_out_numel(k.red, d, c)], lambda outputs:
        a[1].numel * a[1].bpe
        + outputs * k.red.outputs * CASE WHEN k.out THEN a[-1].bpe ELSE reduction_out_bpe(k.red, a, c) END
        -- max/min over a dim also write their indices
        + CASE WHEN k.red.indices AND len(reduced_dims(c[2], len(d[1]))) > 0 THEN outputs * 8 ELSE 0 END)[1]
    END
);

-- ---------------------------------------------------------------------------------------------------------
-- Normalization, forward and backward. Where each op takes its input, weight, bias, the running statistics
-- (batch norm), the normalized shape (layer/RMS norm, a Concrete Inputs list), the group count (group norm), the
-- training flag (batch norm) and, backward, grad_output, the saved statistics and output_mask (which of
-- grad_input, grad_weight, grad_bias it computes).
CREATE OR REPLACE MACRO norm_layout(core) AS (
    CAST(CASE
        WHEN core IN ('aten::layer_norm', 'aten::native_layer_norm')
            THEN {'kind': 'layer', 'backward': false, 'grad': NULL, 'x': 1, 'weight': 3, 'bias': 4, 'running': NULL, 'stats': NULL, 'shape': 2, 'groups': NULL, 'training': NULL, 'mask': NULL}
        WHEN core IN ('aten::rms_norm', 'aten::_fused_rms_norm')
            THEN {'kind': 'rms', 'backward': false, 'grad': NULL, 'x': 1, 'weight': 3, 'bias': NULL, 'running': NULL, 'stats': NULL, 'shape': 2, 'groups': NULL, 'training': NULL, 'mask': NULL}
        WHEN core = 'aten::group_norm'
            THEN {'kind': 'group', 'backward': false, 'grad': NULL, 'x': 1, 'weight': 3, 'bias': 4, 'running': NULL, 'stats': NULL, 'shape': NULL, 'groups': 2, 'training': NULL, 'mask': NULL}
        WHEN core = 'aten::native_group_norm'
            THEN {'kind': 'group', 'backward': false, 'grad': NULL, 'x': 1, 'weight': 2, 'bias': 3, 'running': NULL, 'stats': NULL, 'shape': NULL, 'groups': 7, 'training': NULL, 'mask': NULL}
        WHEN core IN ('aten::batch_norm', 'aten::_batch_norm_impl_index', 'aten::native_batch_norm',
                      'aten::cudnn_batch_norm', 'aten::miopen_batch_norm', 'aten::_native_batch_norm_legit',
                      'aten::_native_batch_norm_legit_functional')
            THEN {'kind': 'batch', 'backward': false, 'grad': NULL, 'x': 1, 'weight': 2, 'bias': 3, 'running': 4, 'stats': NULL, 'shape': NULL, 'groups': NULL, 'training': 6, 'mask': NULL}
        WHEN core = 'aten::_native_batch_norm_legit_no_training'
            THEN {'kind': 'batch', 'backward': false, 'grad': NULL, 'x': 1, 'weight': 2, 'bias': 3, 'running': 4, 'stats': NULL, 'shape': NULL, 'groups': NULL, 'training': NULL, 'mask': NULL}
        WHEN core = 'aten::native_layer_norm_backward'
            THEN {'kind': 'layer', 'backward': true, 'grad': 1, 'x': 2, 'weight': 6, 'bias': NULL, 'running': NULL, 'stats': 4, 'shape': 3, 'groups': NULL, 'training': NULL, 'mask': 8}
        WHEN core = 'aten::_fused_rms_norm_backward'
            THEN {'kind': 'rms', 'backward': true, 'grad': 1, 'x': 2, 'weight': 5, 'bias': NULL, 'running': NULL, 'stats': 4, 'shape': 3, 'groups': NULL, 'training': NULL, 'mask': 6}
        WHEN core = 'aten::native_group_norm_backward'
            THEN {'kind': 'group', 'backward': true, 'grad': 1, 'x': 2, 'weight': 5, 'bias': NULL, 'running': NULL, 'stats': 3, 'shape': NULL, 'groups': 9, 'training': NULL, 'mask': 10}
        WHEN core = 'aten::native_batch_norm_backward'
            THEN {'kind': 'batch', 'backward': true, 'grad': 1, 'x': 2, 'weight': 3, 'bias': NULL, 'running': 4, 'stats': 6, 'shape': NULL, 'groups': NULL, 'training': 8, 'mask': 10}
        WHEN core IN ('aten::cudnn_batch_norm_backward', 'aten::miopen_batch_norm_backward')
            THEN {'kind': 'batch', 'backward': true, 'grad': 2, 'x': 1, 'weight': 3, 'bias': NULL, 'running': NULL, 'stats': 6, 'shape': NULL, 'groups': NULL, 'training': NULL, 'mask': NULL}
    END AS STRUCT(kind VARCHAR, backward BOOLEAN, grad INTEGER, x INTEGER, weight INTEGER, bias INTEGER,
                  running INTEGER, stats INTEGER, shape INTEGER, groups INTEGER, training INTEGER, mask INTEGER))
);

-- Statistics a norm keeps per group of elements (mean and rstd; RMS norm: rstd), how many groups: layer/RMS
-- norm one per row (elements / normalized shape), group norm N · groups, batch norm one per channel.
CREATE OR REPLACE MACRO norm_stat_groups(nl, d, c) AS (
    CASE nl.kind
        -- the normalized shape: recorded, else the weight's
        WHEN 'layer' THEN list_product(d[nl.x])
                          / coalesce(list_product(TRY_CAST(c[nl.shape] AS BIGINT[])), list_product(d[nl.weight]))
        WHEN 'rms' THEN list_product(d[nl.x])
                        / coalesce(list_product(TRY_CAST(c[nl.shape] AS BIGINT[])), list_product(d[nl.weight]))
        WHEN 'group' THEN d[nl.x][1] * TRY_CAST(c[nl.groups] AS BIGINT)
        WHEN 'batch' THEN d[nl.x][2]
    END
);

-- Is a batch norm computing batch statistics (training) rather than using the running ones.
CREATE OR REPLACE MACRO norm_training(nl, c) AS (
    CASE WHEN nl.kind <> 'batch' THEN true
         WHEN nl.training IS NULL THEN nl.backward  -- cudnn/miopen backward: training; _no_training: not
         ELSE lower(c[nl.training]) = 'true' END  -- NULL when not recorded
);

-- Backward: is the k-th gradient (input, weight, bias) computed, by output_mask (mask = norm_call().mask; all
-- when not recorded).
CREATE OR REPLACE MACRO norm_mask(mask, k) AS (
    coalesce(mask[k], true)
);

-- What the norm formulas read of one call, worked out once (a lambda's argument: a macro is expanded, bound and
-- optimized at each of its uses): norm_training, the statistics' groups (forward) and output_mask.
CREATE OR REPLACE MACRO norm_call(nl, d, c) AS (
    {'training': norm_training(nl, c), 'groups': CASE WHEN NOT nl.backward THEN norm_stat_groups(nl, d, c) END,
     'mask': TRY_CAST(c[nl.mask] AS BOOLEAN[])}
);

-- FLOPs per element of the input: forward 5 (mean, variance, normalize, scale, shift; RMS norm 4: square,
-- accumulate, normalize, scale; batch norm with running statistics 2: scale and shift); backward 8 for
-- grad_input, 2 for grad_weight, 1 for grad_bias, as output_mask asks.
CREATE OR REPLACE MACRO norm_flops(nl, d, c) AS (
    list_transform([norm_call(nl, d, c)], lambda nc:
    list_product(d[nl.x])
    * CASE
        WHEN nc.training IS NULL THEN NULL
        WHEN NOT nl.backward THEN
            CASE WHEN nl.kind = 'rms' THEN 4 WHEN NOT nc.training THEN 2 ELSE 5 END
        ELSE 8 * CASE WHEN norm_mask(nc.mask, 1) THEN 1 ELSE 0 END
             + 2 * CASE WHEN norm_mask(nc.mask, 2) AND nl.weight IS NOT NULL THEN 1 ELSE 0 END
             + CASE WHEN norm_mask(nc.mask, 3) AND nl.kind <> 'rms' THEN 1 ELSE 0 END
      END)[1]
);

-- Forward: reads the input, weight and bias (batch norm: the running statistics too, which training also
-- writes), writes the output (the input's dtype) and the statistics (float32). Backward: reads grad_output, the
-- input, the saved statistics and the weight; writes the gradients output_mask asks for.
CREATE OR REPLACE MACRO norm_bytes(nl, d, a, c) AS (
    list_transform([norm_call(nl, d, c)], lambda nc:
    CASE WHEN a[nl.x].numel IS NOT NULL AND nc.training IS NOT NULL THEN
    CASE WHEN NOT nl.backward THEN
        read_bytes(a, [nl.x, nl.weight, nl.bias])
        + a[nl.x].numel * a[nl.x].bpe
        + CASE WHEN nl.kind = 'batch' THEN
                   coalesce(read_bytes(a, [nl.running, nl.running + 1]), 0)
                   * CASE WHEN nc.training THEN 2 ELSE 1 END
                   + CASE WHEN nc.training THEN 2 * 4 * nc.groups ELSE 0 END
               ELSE CASE WHEN nl.kind = 'rms' THEN 1 ELSE 2 END * 4 * nc.groups
          END
    ELSE
        read_bytes(a, [nl.grad, nl.x, nl.weight])
        + read_bytes(a, CASE WHEN nl.kind = 'rms' THEN [nl.stats]
                             WHEN nl.kind = 'batch' AND NOT nc.training
                                 THEN [nl.running, nl.running + 1]
                             ELSE [nl.stats, nl.stats + 1] END)
        + CASE WHEN norm_mask(nc.mask, 1) THEN a[nl.x].numel * a[nl.x].bpe ELSE 0 END
        -- grad_weight and grad_bias have the weight's shape (batch/group norm: one per channel)
        + (CASE WHEN norm_mask(nc.mask, 2) THEN 1 ELSE 0 END
           + CASE WHEN norm_mask(nc.mask, 3) AND nl.kind <> 'rms' THEN 1 ELSE 0 END)
          * coalesce(a[nl.weight].numel * a[nl.weight].bpe, 0)
    END END)[1]
);

-- ---------------------------------------------------------------------------------------------------------
-- Softmax and log-softmax, forward (self, dim, dtype | half_to_float) and backward (grad_output, output, dim,
-- input_dtype): 5 FLOPs per element (max, subtract, exp, sum, divide); reads its tensors, writes one of the
-- input's shape in the result dtype (`dtype` / input_dtype as a ScalarType code; half_to_float: float32).
CREATE OR REPLACE MACRO softmax_out_bpe(core, a, c) AS (
    CASE
        WHEN core IN ('aten::_softmax_backward_data', 'aten::_log_softmax_backward_data')
            THEN coalesce(scalar_type_bytes(c[4]), a[1].bpe)
        WHEN core IN ('aten::_softmax', 'aten::_log_softmax') AND lower(c[3]) = 'true' THEN 4
        WHEN core IN ('aten::_softmax', 'aten::_log_softmax') THEN a[1].bpe
        ELSE coalesce(scalar_type_bytes(c[3]), a[1].bpe)
    END
);

CREATE OR REPLACE MACRO softmax_bytes(k, a, c) AS (
    CASE WHEN a[1].numel IS NOT NULL THEN
        read_bytes(a, tensor_positions(a, CASE WHEN k.core LIKE '%backward%' THEN 2 ELSE 1 END))
        + a[1].numel * CASE WHEN k.out THEN a[-1].bpe ELSE softmax_out_bpe(k.core, a, c) END
    END
);

-- ---------------------------------------------------------------------------------------------------------
-- Copies and casts: no FLOPs; bytes = what is read + what is written. copy_(self, src): reads src, writes self
-- (in self's dtype: a cast); _to_copy(self, dtype, ...): reads self, writes it in `dtype`; clone: reads and
-- writes self; fill_/zero_: write only; constant_pad_nd/pad/reflection_pad/replication_pad (self, pad): read
-- the input, write the padded output. `to` and `contiguous` have no formula: when they do work, the _to_copy /
-- clone / copy_ they call has it; when they do not (already that dtype, already contiguous), they move nothing.
-- FBGEMM's permute_pooled_embs(pooled_embs [B, sum D], offset_dim_list, permute_list, inv_offset_dim_list,
-- inv_permute_list) moves each table's pooled columns to their new place: pooled_embs read, a tensor of its shape
-- written (the four index lists, one entry per table, are not counted); its backward (the autograd node
-- CppNode<PermutePooledEmbsFunction>, recorded with the gradient only) the inverse move, as many bytes; its
-- recat_embedding_grad_output_mixed_D_batch(grad_output [B, sum D], dim_sum_per_rank, cumsum_dim_sum_per_rank)
-- moves the pooled gradient's columns into one block per rank: grad_output read, as many elements written.
-- arange fills a new tensor with start, start + step, ...: ceil((end − start) / step) elements written (torch's
-- count), from its bounds (Scalars: their Concrete Inputs values; NULL when not recorded), in its dtype: the out=
-- tensor's, else the `dtype` argument (a c10::ScalarType code), else torch's rule for Python numbers (integer
-- bounds: int64; a fractional one: the default float dtype, float32), as promoted_bytes applies it.
CREATE OR REPLACE MACRO padded_numel(dims, pad_value) AS (
    list_product(list_transform(range(1, len(dims) + 1), lambda j:
        dims[j] + coalesce(TRY_CAST(pad_value AS BIGINT[])[2 * (len(dims) - j) + 1], 0)
                + coalesce(TRY_CAST(pad_value AS BIGINT[])[2 * (len(dims) - j) + 2], 0)))
);

-- aten::arange's overloads, told apart by how many arguments Kineto records: arange(end, dtype, layout, device,
-- pin_memory), .start(start, end, dtype, ...), .start_step(start, end, step, dtype, ...), .out(end, out),
-- .start_out(start, end, step, out) (which .start runs with an empty out tensor). Positions of start, end, step
-- (NULL: 0 and 1), dtype and out.
CREATE OR REPLACE MACRO arange_layout(a) AS (
    CAST(CASE len(a)
            WHEN 5 THEN {'start': NULL, 'stop': 1, 'step': NULL, 'dtype': 2, 'out': NULL}
            WHEN 6 THEN {'start': 1, 'stop': 2, 'step': NULL, 'dtype': 3, 'out': NULL}
            WHEN 7 THEN {'start': 1, 'stop': 2, 'step': 3, 'dtype': 4, 'out': NULL}
            WHEN 2 THEN {'start': NULL, 'stop': 1, 'step': NULL, 'dtype': NULL, 'out': 2}
            WHEN 4 THEN {'start': 1, 'stop': 2, 'step': 3, 'dtype': NULL, 'out': 4}
        END
    AS STRUCT(start INTEGER, stop INTEGER, step INTEGER, dtype INTEGER, out INTEGER))
);

CREATE OR REPLACE MACRO arange_bytes(a, c) AS (
    list_transform([arange_layout(a)], lambda l:
        CAST(ceil((TRY_CAST(c[l.stop] AS DOUBLE)
                   - CASE WHEN l.start IS NULL THEN 0 ELSE TRY_CAST(c[l.start] AS DOUBLE) END)
                  / CASE WHEN l.step IS NULL THEN 1 ELSE TRY_CAST(c[l.step] AS DOUBLE) END) AS BIGINT)
        * CASE WHEN l.out IS NOT NULL THEN a[l.out].bpe
               ELSE coalesce(scalar_type_bytes(c[l.dtype]),
                             promoted_bytes(a, list_filter([l.start, l.stop, l.step], lambda i: i IS NOT NULL))) END)[1]
);

CREATE OR REPLACE MACRO is_fbgemm_permute(name) AS (
    name IN ('fbgemm::permute_pooled_embs', 'fbgemm::permute_pooled_embs_auto_grad',
             'fbgemm::recat_embedding_grad_output_mixed_D_batch')
    OR name LIKE 'torch::autograd::CppNode<fbgemm_gpu::PermutePooledEmbsFunction<%'
);

CREATE OR REPLACE MACRO copy_bytes(core, d, a, c) AS (
    CASE
        WHEN core = 'aten::copy_' AND a[1].numel IS NOT NULL AND a[2].numel IS NOT NULL
            THEN a[2].numel * a[2].bpe + a[1].numel * a[1].bpe
        WHEN core = 'aten::_copy_from' AND a[1].numel IS NOT NULL AND a[2].numel IS NOT NULL
            THEN a[1].numel * a[1].bpe + a[2].numel * a[2].bpe
        WHEN core = 'aten::_to_copy' AND a[1].numel IS NOT NULL
            THEN a[1].numel * (a[1].bpe + coalesce(scalar_type_bytes(c[2]), a[1].bpe))
        WHEN (core IN ('aten::clone', 'aten::lift_fresh_copy') OR is_fbgemm_permute(core))
             AND a[1].numel IS NOT NULL THEN 2 * a[1].numel * a[1].bpe
        WHEN core IN ('aten::fill_', 'aten::zero_') AND a[1].numel IS NOT NULL THEN a[1].numel * a[1].bpe
        WHEN core = 'aten::arange' THEN arange_bytes(a, c)
        WHEN core IN ('aten::constant_pad_nd', 'aten::pad', 'aten::reflection_pad1d', 'aten::reflection_pad2d',
                      'aten::reflection_pad3d', 'aten::replication_pad1d', 'aten::replication_pad2d',
                      'aten::replication_pad3d')
             AND a[1].numel IS NOT NULL AND TRY_CAST(c[2] AS BIGINT[]) IS NOT NULL
            THEN a[1].numel * a[1].bpe + padded_numel(d[1], c[2]) * a[1].bpe
    END
);

-- ---------------------------------------------------------------------------------------------------------
-- Upsampling (F.interpolate): output spatial sizes from output_size (an int list) or, when only scale factors
-- were given (the .vec overload), floor(input size × scale). FLOPs per output element: 0 for nearest (a
-- gather), else one multiply-add per tap less one add (linear 2 taps, bilinear 4, trilinear 8, bicubic 16).
-- Backward (grad_output, output_size, input_size, ...): reads grad_output, writes grad_input (input_size),
-- 2 FLOPs per tap per grad_output element (nearest: 1 add).
CREATE OR REPLACE MACRO upsample_taps(core) AS (
    CASE
        WHEN core LIKE '%nearest%' THEN 1
        WHEN core LIKE '%bicubic%' THEN 16
        WHEN core LIKE '%trilinear%' THEN 8
        WHEN core LIKE '%bilinear%' THEN 4
        WHEN core LIKE '%linear1d%' THEN 2
    END
);

CREATE OR REPLACE MACRO upsample_out_spatial(d, c) AS (
    coalesce(
        list_filter(list_transform(c[2:], lambda v: CASE WHEN regexp_matches(coalesce(v, ''), '^\[[0-9]+(, ?[0-9]+)*\]$')
                                                          THEN TRY_CAST(v AS BIGINT[]) END),
                    lambda s: len(s) = len(d[1]) - 2)[1],
        list_transform(range(3, len(d[1]) + 1), lambda j: CAST(floor(d[1][j]
            * list_filter(list_transform(c[2:], lambda v: CASE WHEN regexp_matches(coalesce(v, ''), '^\[.*[.].*\]$')
                                                                THEN TRY_CAST(v AS DOUBLE[]) END),
                          lambda s: len(s) = len(d[1]) - 2)[1][j - 2]) AS BIGINT)))
);

CREATE OR REPLACE MACRO upsample_out_numel(d, c) AS (
    d[1][1] * d[1][2] * list_product(upsample_out_spatial(d, c))
);

CREATE OR REPLACE MACRO upsample_flops(core, d, c) AS (
    CASE WHEN core LIKE '%backward%' THEN
        list_product(d[1]) * CASE WHEN upsample_taps(core) = 1 THEN 1 ELSE 2 * upsample_taps(core) END
    WHEN len(d[1]) >= 3 THEN
        upsample_out_numel(d, c) * CASE WHEN upsample_taps(core) = 1 THEN 0 ELSE 2 * upsample_taps(core) - 1 END
    END
);

CREATE OR REPLACE MACRO upsample_bytes(core, d, a, c) AS (
    CASE WHEN a[1].numel IS NULL THEN NULL
         WHEN core LIKE '%backward%' THEN
             a[1].numel * a[1].bpe + list_product(TRY_CAST(c[3] AS BIGINT[])) * a[1].bpe
         WHEN len(d[1]) >= 3 THEN a[1].numel * a[1].bpe + upsample_out_numel(d, c) * a[1].bpe
    END
);

-- ---------------------------------------------------------------------------------------------------------
-- Max pooling: max_pool{1,2,3}d_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode) takes each
-- window's max: one comparison per tap per output element (as a max reduction counts one per element); reads
-- self, writes the output in self's dtype and its int64 indices. Each of the last n dims (n from the name) is
-- PyTorch's pooling_output_shape: (in + 2·pad − dil·(k − 1) − 1 (+ stride − 1 with ceil_mode)) // stride + 1,
-- less one when ceil_mode starts the last window in the padding; an empty stride is the kernel's; a one-element
-- list applies to every dim. Backward (grad_output, self, kernel_size, stride, padding, dilation, ceil_mode,
-- indices): each grad_output element added where its index points (1 FLOP, as accumulating scatters); reads
-- grad_output and indices, writes grad_input (self's shape and dtype; self's values are not read).
CREATE OR REPLACE MACRO max_pool_out_numel(core, d, c) AS (
    list_transform([{'n': TRY_CAST(regexp_extract(core, '([123])d_with_indices$', 1) AS INTEGER),
                     'k': TRY_CAST(c[2] AS BIGINT[]), 's': TRY_CAST(c[3] AS BIGINT[]), 'p': TRY_CAST(c[4] AS BIGINT[]),
                     'dil': TRY_CAST(c[5] AS BIGINT[]), 'ceil': TRY_CAST(c[6] AS BOOLEAN)}], lambda w:
    CASE WHEN len(d[1]) > w.n AND len(w.k) > 0 AND w.p IS NOT NULL AND w.dil IS NOT NULL AND w.ceil IS NOT NULL THEN
        coalesce(list_product(d[1][1:len(d[1]) - w.n]), 1) * list_product(list_transform(range(1, w.n + 1), lambda j:
            list_transform([{'size': d[1][len(d[1]) - w.n + j], 'k': concrete_int(w.k, j), 'p': concrete_int(w.p, j),
                             's': CASE WHEN len(w.s) > 0 THEN concrete_int(w.s, j) ELSE concrete_int(w.k, j) END}],
                lambda x: list_transform([(x.size + 2 * x.p - concrete_int(w.dil, j) * (x.k - 1) - 1
                                           + CASE WHEN w.ceil THEN x.s - 1 ELSE 0 END) // x.s + 1], lambda o:
                    CASE WHEN w.ceil AND (o - 1) * x.s >= x.size + x.p THEN o - 1 ELSE o END)[1])[1]))
    END)[1]
);

CREATE OR REPLACE MACRO max_pool_flops(core, d, a, c) AS (
    CASE WHEN core LIKE '%backward' THEN a[1].numel
         ELSE max_pool_out_numel(core, d, c) * list_product(list_transform(
             range(1, TRY_CAST(regexp_extract(core, '([123])d_with_indices$', 1) AS INTEGER) + 1),
             lambda j: concrete_int(TRY_CAST(c[2] AS BIGINT[]), j)))
    END
);

CREATE OR REPLACE MACRO max_pool_bytes(core, d, a, c) AS (
    CASE WHEN core LIKE '%backward' THEN read_bytes(a, [1, 8]) + a[2].numel * a[2].bpe
         ELSE a[1].numel * a[1].bpe + max_pool_out_numel(core, d, c) * (a[1].bpe + 8)
    END
);

-- ---------------------------------------------------------------------------------------------------------
-- Gathers and scatters: no FLOPs (accumulating ones: one add per element moved). Each reads its index tensor
-- once and the elements it moves once, and writes what it produces:
-- embedding(weight, indices): out = indices × row; index_select(self, dim, index): self with dim cut to the
-- index; gather(self, dim, index): out = index's shape; scatter/scatter_add/scatter_reduce(self, dim, index,
-- src): index's count of elements from src into self (accumulating: read and written); index_add/index_copy
-- (self, dim, index, source): source's rows into self; index_put(self, indices, values, accumulate): values
-- into self (its indices are a TensorList, whose shapes Kineto does not record: not counted);
-- embedding_dense_backward(grad_output, indices, num_weights): sums grad_output rows into the [num_weights, D]
-- gradient. An out-of-place scatter/index_* also copies self (read + write).
CREATE OR REPLACE MACRO index_numel(core, d, a, c) AS (  -- elements moved
    CASE
        WHEN core = 'aten::embedding' THEN a[2].numel * coalesce(list_product(d[1][2:]), 1)
        -- dim: recorded, or 0 for a 1-D input
        WHEN core = 'aten::index_select' THEN
            a[1].numel * a[3].numel / greatest(d[1][coalesce(TRY_CAST(c[2] AS BIGINT), CASE WHEN len(d[1]) = 1 THEN 0 END)
                                                  + CASE WHEN TRY_CAST(c[2] AS BIGINT) < 0 THEN len(d[1]) ELSE 0 END
                                                  + 1], 1)
        WHEN core = 'aten::gather' THEN a[3].numel
        WHEN core IN ('aten::scatter', 'aten::scatter_add', 'aten::scatter_reduce') THEN a[3].numel
        WHEN core IN ('aten::index_add', 'aten::index_copy') THEN a[4].numel
        WHEN core IN ('aten::index_put', 'aten::_index_put_impl') THEN a[3].numel
        WHEN core = 'aten::embedding_dense_backward' THEN a[1].numel
    END
);

CREATE OR REPLACE MACRO index_accumulates(core, c) AS (
    core IN ('aten::scatter_add', 'aten::scatter_reduce', 'aten::index_add', 'aten::embedding_dense_backward')
    OR (core = 'aten::scatter' AND coalesce(c[5], '') NOT IN ('', 'None'))
    OR (core IN ('aten::index_put', 'aten::_index_put_impl') AND lower(c[4]) = 'true')
);

-- NULL when index_numel is (the elements moved: once per call, a lambda's argument).
CREATE OR REPLACE MACRO index_flops(core, d, a, c) AS (
    list_transform([index_numel(core, d, a, c)], lambda moved:
        CASE WHEN moved IS NOT NULL THEN CASE WHEN index_accumulates(core, c) THEN moved ELSE 0 END END)[1]
);

CREATE OR REPLACE MACRO index_bytes(k, core, d, a, c) AS (
    list_transform([index_numel(core, d, a, c)], lambda moved: CASE
        WHEN moved IS NULL THEN NULL
        WHEN core = 'aten::embedding' THEN read_bytes(a, [2]) + 2 * moved * a[1].bpe
        WHEN core IN ('aten::index_select', 'aten::gather') THEN
            read_bytes(a, [3]) + moved * a[1].bpe + moved * CASE WHEN k.out THEN a[-1].bpe ELSE a[1].bpe END
        WHEN core = 'aten::embedding_dense_backward' THEN
            read_bytes(a, [1, 2]) + TRY_CAST(c[3] AS BIGINT) * coalesce(list_product(d[1][len(d[2]) + 1:]), 1) * a[1].bpe
        ELSE
            -- the index (not for index_put), the source elements, the writes (accumulating: reads them too)
            CASE WHEN core IN ('aten::index_put', 'aten::_index_put_impl') THEN 0 ELSE read_bytes(a, [3]) END
            + moved
              * (coalesce(a[CASE WHEN core IN ('aten::index_add', 'aten::index_copy') THEN 4 ELSE 3 + CASE WHEN core IN ('aten::index_put', 'aten::_index_put_impl') THEN 0 ELSE 1 END END].bpe, 0)
                 + a[1].bpe * CASE WHEN index_accumulates(core, c) THEN 2 ELSE 1 END)
            -- out of place: the copy of self
            + CASE WHEN k.inplace THEN 0 ELSE 2 * a[1].numel * a[1].bpe END
    END)[1]
);

-- ---------------------------------------------------------------------------------------------------------
-- Fused kernels of inference engines that the corpus traces show (custom ops, recorded like aten ops):
-- _C::rms_norm(out, input, weight, eps), _C::fused_add_rms_norm(input, residual, weight, eps) (in place:
-- residual += input, input = rms_norm(residual)), _C::silu_and_mul / gelu_and_mul (out, input[..., 2d]),
-- _C::static_scaled_fp8_quant / dynamic_scaled_fp8_quant (out, input, scale), _C::rotary_embedding(positions,
-- query, key, head_size, cos_sin_cache, is_neox) (in place on query and key);
-- aiter::add_rmsnorm(out, input, residual_in, residual_out, weight, eps); aiter::rms_norm(input, weight, eps,
-- use_model_sensitive_rmsnorm) -> out (its CK kernel); aiter::_groupnorm_run(input, num_groups, weight, bias,
-- eps) (group norm, no statistics kept); KV-cache writes: vLLM's
-- _C_cache_ops::reshape_and_cache(_flash)(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
-- k_scale, v_scale) and SGLang's sglang::store_cache(k, v, k_cache, v_cache, indices, ...) write each new token's
-- key and value into its cache slot (in the cache's dtype: an fp8 cache is uint8).
-- MoE routing of Triton's triton_kernels (vLLM's matmul_ogs MoE backend; torch.autograd.Functions, recorded by
-- their class names): TopK(x [T, E], k, apply_softmax, dim, return_bitmatrix, y_indx, n_rows) selects each
-- token's k experts (values in x's dtype and int16 indices), softmaxes their scores and writes the bitmatrix of
-- the choices (T rows of ceil(E/32) 32-bit words); SortTokens(expt_scal [T, k], expt_indx [T, k], n_expts_tot E)
-- counts the routed pairs per expert (a histogram of the bitmatrix), takes the experts' offsets (its prefix
-- sums) and places each of the T·k pairs in expert order: combine and dispatch indices (int32) and the gate
-- scales moved there.
-- FBGEMM's sparse-feature helpers of recommender models: asynchronous_complete_cumsum(t [N]) writes the N + 1
-- offsets of N lengths (0, then the running sums) in t's dtype; bounds_check_indices(rows_per_table [T],
-- indices, offsets, bounds_check_mode, warning, weights, ...) checks each index against 0 and its table's rows and
-- each offset against 0 and the indices' count, in place: only what it finds out of bounds is written (and
-- counted in `warning`), none in a valid batch.
-- Other engines' ops with one of these layouts, by the name of the one they share it with: SGLang's sgl_kernel
-- ops are vLLM's, aiter::rmsnorm(out, input, weight, eps) is _C::rms_norm, aiter::rmsnorm2d_fwd_with_add_ck
-- (the CK kernel) is aiter::add_rmsnorm. NULL: no such fused kernel.
CREATE OR REPLACE MACRO fused_kernel(name) AS (
    CASE
        WHEN name IN ('_C::rms_norm', '_C::fused_add_rms_norm', '_C::silu_and_mul', '_C::gelu_and_mul',
                      '_C::gelu_tanh_and_mul', '_C::static_scaled_fp8_quant', '_C::dynamic_scaled_fp8_quant',
                      '_C::rotary_embedding', 'aiter::add_rmsnorm', 'aiter::rms_norm', 'aiter::_groupnorm_run',
                      '_C_cache_ops::reshape_and_cache', 'sglang::store_cache', 'TopK', 'SortTokens',
                      'fbgemm::asynchronous_complete_cumsum', 'fbgemm::bounds_check_indices') THEN name
        WHEN name = 'aiter::rmsnorm' THEN '_C::rms_norm'
        WHEN name = 'aiter::rmsnorm2d_fwd_with_add_ck' THEN 'aiter::add_rmsnorm'
        WHEN name IN ('sgl_kernel::silu_and_mul', 'sgl_kernel::gelu_and_mul', 'sgl_kernel::gelu_tanh_and_mul',
                      'sgl_kernel::rotary_embedding') THEN replace(name, 'sgl_kernel::', '_C::')
        WHEN name = '_C_cache_ops::reshape_and_cache_flash' THEN '_C_cache_ops::reshape_and_cache'
    END
);

-- TopK's routing (NULL unless x is a matrix and n_rows a number or None: a device tensor's rows are unknown): T
-- tokens (n_rows, else x's rows), E experts, top-k, whether it softmaxes the k scores, whether it selects (no
-- y_indx given: it gathers x at the given indices), x's element size.
CREATE OR REPLACE MACRO topk_routing(d, a) AS (
    CASE WHEN len(d[1]) = 2 AND a[7].numel IS NULL THEN
        {'t': coalesce(TRY_CAST(a[7].value AS BIGINT), d[1][1]), 'e': d[1][2], 'k': TRY_CAST(a[2].value AS BIGINT),
         'softmax': lower(a[3].value) = 'true', 'selects': a[6].numel IS NULL, 'bpe': a[1].bpe}
    END
);

-- name = fused_kernel(op name). TopK: one comparison per score it selects from (as a max reduction counts) and
-- softmax's 5 per element over the k kept; SortTokens: one add per routed pair (the histogram) and per expert
-- (the offsets' prefix sum); the sort itself moves data (0, as a gather or scatter); asynchronous_complete_cumsum:
-- one add per element, as cumsum; bounds_check_indices: two comparisons per index and per offset.
CREATE OR REPLACE MACRO fused_flops(name, d, a) AS (
    CASE name
        WHEN '_C::rms_norm' THEN 4 * a[2].numel
        WHEN '_C::fused_add_rms_norm' THEN 5 * a[1].numel
        WHEN '_C::silu_and_mul' THEN 2 * a[1].numel
        WHEN '_C::gelu_and_mul' THEN 2 * a[1].numel
        WHEN '_C::gelu_tanh_and_mul' THEN 2 * a[1].numel
        WHEN '_C::static_scaled_fp8_quant' THEN 2 * a[2].numel
        WHEN '_C::dynamic_scaled_fp8_quant' THEN 3 * a[2].numel
        WHEN '_C::rotary_embedding' THEN 3 * (a[2].numel + coalesce(a[3].numel, 0))
        WHEN 'aiter::add_rmsnorm' THEN 5 * a[2].numel
        WHEN 'aiter::rms_norm' THEN 4 * a[1].numel
        WHEN 'aiter::_groupnorm_run' THEN 5 * a[1].numel
        WHEN 'TopK' THEN list_transform([topk_routing(d, a)], lambda r: CASE WHEN r IS NOT NULL THEN
            CASE WHEN r.selects THEN r.t * r.e ELSE 0 END + CASE WHEN r.softmax THEN 5 * r.t * r.k ELSE 0 END END)[1]
        WHEN 'SortTokens' THEN CASE WHEN len(d[1]) = 2 THEN a[1].numel + TRY_CAST(a[3].value AS BIGINT) END
        WHEN 'fbgemm::asynchronous_complete_cumsum' THEN a[1].numel
        WHEN 'fbgemm::bounds_check_indices' THEN 2 * (a[2].numel + a[3].numel)
        -- a copy into the cache (an fp8 cache's scaling is not counted, as a cast's)
        WHEN '_C_cache_ops::reshape_and_cache' THEN 0
        WHEN 'sglang::store_cache' THEN 0
    END
);

CREATE OR REPLACE MACRO fused_bytes(name, d, a) AS (
    CASE name
        WHEN '_C::rms_norm' THEN read_bytes(a, [2, 3]) + a[1].numel * a[1].bpe
        WHEN '_C::fused_add_rms_norm' THEN read_bytes(a, [1, 2, 3]) + read_bytes(a, [1, 2])
        WHEN '_C::silu_and_mul' THEN read_bytes(a, [2]) + a[1].numel * a[1].bpe
        WHEN '_C::gelu_and_mul' THEN read_bytes(a, [2]) + a[1].numel * a[1].bpe
        WHEN '_C::gelu_tanh_and_mul' THEN read_bytes(a, [2]) + a[1].numel * a[1].bpe
        WHEN '_C::static_scaled_fp8_quant' THEN read_bytes(a, [2, 3]) + a[1].numel * a[1].bpe
        WHEN '_C::dynamic_scaled_fp8_quant' THEN read_bytes(a, [2, 3]) + a[1].numel * a[1].bpe + 4
        -- positions, and query and key read and written; the cache rows of those positions read
        WHEN '_C::rotary_embedding' THEN read_bytes(a, [1]) + 2 * read_bytes(a, [2, 3])
                                         + a[1].numel * d[5][-1] * a[5].bpe
        -- input, residual_in and weight read; out and residual_out written
        WHEN 'aiter::add_rmsnorm' THEN read_bytes(a, [2, 3, 5]) + read_bytes(a, [1, 4])
        WHEN 'aiter::rms_norm' THEN read_bytes(a, [1, 2]) + a[1].numel * a[1].bpe
        -- the scores it selects from read (given indices: only the k gathered per token); the k values and int16
        -- indices per token written (given indices: read); the bitmatrix written
        WHEN 'TopK' THEN list_transform([topk_routing(d, a)], lambda r:
            CASE WHEN r.selects THEN r.t * r.e ELSE r.t * r.k END * r.bpe + r.t * r.k * (r.bpe + 2)
            + r.t * ceil(r.e / 32) * 4)[1]
        -- the scores and expert ids read, and the bitmatrix (T·ceil(E/32) words: the histogram's input); the
        -- combine and dispatch indices (int32) and the gate scales written in expert order, the histogram and
        -- the offsets (E int32 each) (lower bound: the tile maps the expert GEMMs read, per block size, padded by
        -- the library's build constants, are not counted)
        WHEN 'SortTokens' THEN list_transform([TRY_CAST(a[3].value AS BIGINT)], lambda e:
            CASE WHEN len(d[1]) = 2 THEN read_bytes(a, [1, 2]) + d[1][1] * ceil(e / 32) * 4
                                         + a[1].numel * (2 * 4 + a[1].bpe) + 2 * e * 4 END)[1]
        WHEN 'aiter::_groupnorm_run' THEN read_bytes(a, [1, 3, 4]) + a[1].numel * a[1].bpe
        WHEN 'fbgemm::asynchronous_complete_cumsum' THEN (2 * a[1].numel + 1) * a[1].bpe
        -- the table sizes, indices and offsets read; a valid batch writes nothing
        WHEN 'fbgemm::bounds_check_indices' THEN read_bytes(a, [1, 2, 3])
        -- key, value and the slots read; key and value written in the cache's dtype
        WHEN '_C_cache_ops::reshape_and_cache' THEN read_bytes(a, [1, 2, 5]) + a[1].numel * a[3].bpe
                                                    + a[2].numel * a[4].bpe
        WHEN 'sglang::store_cache' THEN read_bytes(a, [1, 2, 5]) + a[1].numel * a[3].bpe + a[2].numel * a[4].bpe
    END
);

-- ---------------------------------------------------------------------------------------------------------
-- Serving engines' MoE and paged-attention ops, whose own arguments lack what their cost needs. The ingest
-- (tracesql/op_costs.sql) reads it from around each call into `x` (STRUCT(allocs STRUCT(shape BIGINT[], dtype
-- INTEGER)[], kernels VARCHAR, batch VARCHAR)): a MoE op's buffers (the aten::empty calls in it and in the ops
-- it calls: shape and c10::ScalarType code, in order; a graph replay's copy: those of its capture) and its
-- kernels' names (a graph capture's: its launches'); an attention op's step annotation. Without `x` (the op_flops / op_bytes functions, a trace
-- without it) they have no cost.
CREATE OR REPLACE MACRO serving_op_kind(name) AS (
    CASE
        -- vllm::moe_forward(hidden_states [T, H], router_logits [T, E], layer_name): the fused MoE layer, every
        -- backend (Triton fused_moe, matmul_ogs, FlashInfer/TRT-LLM, CUTLASS) under it
        WHEN name = 'vllm::moe_forward' THEN 'moe'
        -- vllm::unified_attention_with_output(query [T, Hq, d], key [T, Hkv, d], value, output, layer_name, ...):
        -- every token of the step's batch against its request's cached keys (any vLLM attention backend);
        -- SGLang's kernel-shape profiler's aiter paged_attention_ragged(out, workspace, query [B, Hq, d],
        -- key_cache [pages, page_size, Hkv, d], value_cache, ...); aiter's paged prefill
        -- mha_batch_prefill(q [T, Hq, d], k_cache [pages, Hkv, d], v_cache, cu_seqlens_q, kv_indptr, ...) -> out
        WHEN name IN ('vllm::unified_attention_with_output', 'aiter::mha_batch_prefill')
             OR regexp_matches(name, '^sglang_profiler::attention_paged_attention_ragged_[0-9]+$')
            THEN 'paged_attention'
    END
);

-- The cost family the op's formula belongs to: the MoE's expert GEMMs are grouped GEMMs ('gemm', as
-- aten::_grouped_mm), paged attention is attention.
CREATE OR REPLACE MACRO serving_op_family(name) AS (
    CASE serving_op_kind(name) WHEN 'moe' THEN 'gemm' WHEN 'paged_attention' THEN 'attention' END
);

-- MoE routing: T tokens of hidden size H, E experts (the router's width), top-k (the width of the first [T, k]
-- buffer the op allocates, itself or in the ops it calls, k < E: the routing weights or expert ids) and the
-- experts' intermediate size I (the last dim of the first non-integer buffer of at least T·k rows whose last dim
-- is not H: the activation between the two expert GEMMs). Sizes as the op ran them (padded for the kernel when
-- the engine pads).
CREATE OR REPLACE MACRO moe_routing(d, x) AS (
    list_transform([{'t': d[1][1], 'h': d[1][2], 'e': d[2][2],
                     'k': list_filter(x.allocs, lambda b: len(b.shape) = 2 AND b.shape[1] = d[1][1]
                                                          AND b.shape[2] < d[2][2])[1].shape[2]}], lambda r:
    {'t': r.t, 'h': r.h, 'e': r.e, 'k': r.k,
     'i': list_filter(x.allocs, lambda b: len(b.shape) >= 2
                                          AND list_product(b.shape[1:len(b.shape) - 1]) >= r.t * r.k
                                          AND b.shape[-1] <> r.h
                                          -- not an index buffer (int16/32/64, bool, uint16/32/64)
                                          AND b.dtype NOT IN (2, 3, 4, 11, 27, 28, 29))[1].shape[-1]})[1]
);

-- Bytes per weight element from the expert GEMM kernels' names: MXFP4 (E2M1, 4 bits, one E8M0 scale byte per
-- block of 32: TRT-LLM's MxE2m1, Triton matmul_ogs' mxfp4), MXFP8 (E4m3 with its scales), else the hidden
-- states' element size (weights in the activations' dtype).
CREATE OR REPLACE MACRO moe_weight_bytes(kernels, act_bpe) AS (
    CASE WHEN regexp_matches(coalesce(kernels, ''), 'MxE2m1|mxfp4') THEN 0.5 + 1 / 32
         WHEN regexp_matches(coalesce(kernels, ''), 'MxE4m3|mxfp8') THEN 1 + 1 / 32
         ELSE act_bpe END
);

-- Paged attention's batch, from the step annotation vLLM writes around each forward (the SGLang decode trace of
-- TraceLens carries it too): execute_{T}_context_{C}(sq{Σq}sk{Σk}sqsq{Σq²}sqsk{Σq·k})_generation_{G}(sq..sk..
-- sqsq..sqsk..), or the shorter execute_context_{C}({Σq}_{Σq·k})_generation_{G}({Σq}_{Σq·k})
-- (G = 0: '(0)'), over the requests in prefill (context) and decode (generation): q = query tokens, kv = key
-- tokens read (the short form has no Σk: its Σq, a lower bound, exact for a prefill with no cached prefix),
-- full = query·key pairs of the whole score matrices (Σ q·k), causal = the pairs the causal mask keeps (query
-- i of a request sees k − q + i + 1 keys: Σ q·k − (Σ q² − Σ q)/2; the short form has no Σq²: the context part
-- halved, as 'flash' counts causal SDPA). NULL when the step has no such annotation.
CREATE OR REPLACE MACRO attention_batch(batch) AS (
    list_transform([{
        'long': regexp_extract(batch, '_context_[0-9]+\(sq([0-9]+)sk([0-9]+)sqsq([0-9]+)sqsk([0-9]+)\)'
                                      || '_generation_[0-9]+\(sq([0-9]+)sk([0-9]+)sqsq([0-9]+)sqsk([0-9]+)\)$',
                       ['cq', 'ck', 'cqq', 'cqk', 'gq', 'gk', 'gqq', 'gqk']),
        'short': regexp_extract(batch, '_context_[0-9]+\(([0-9]+)_([0-9]+)\)'
                                       || '_generation_[0-9]+\(([0-9]+)(_([0-9]+))?\)$',
                                ['cq', 'cqk', 'gq', 'g_', 'gqk'])}], lambda m:
    CASE
        WHEN m.long.cq <> '' THEN list_transform([{
                'cq': CAST(m.long.cq AS DOUBLE), 'ck': CAST(m.long.ck AS DOUBLE), 'cqq': CAST(m.long.cqq AS DOUBLE),
                'cqk': CAST(m.long.cqk AS DOUBLE), 'gq': CAST(m.long.gq AS DOUBLE), 'gk': CAST(m.long.gk AS DOUBLE),
                'gqq': CAST(m.long.gqq AS DOUBLE), 'gqk': CAST(m.long.gqk AS DOUBLE)}], lambda s:
            {'q': s.cq + s.gq, 'kv': s.ck + s.gk, 'full': s.cqk + s.gqk,
             'causal': s.cqk + s.gqk - (s.cqq - s.cq + s.gqq - s.gq) / 2})[1]
        -- decode requests without their Σq·k (G > 0, one number) have no pairs
        WHEN m.short.cq <> '' AND (m.short.gqk <> '' OR m.short.gq = '0') THEN list_transform([{
                'cq': CAST(m.short.cq AS DOUBLE), 'cqk': CAST(m.short.cqk AS DOUBLE),
                'gq': CAST(m.short.gq AS DOUBLE), 'gqk': coalesce(TRY_CAST(m.short.gqk AS DOUBLE), 0)}], lambda s:
            {'q': s.cq + s.gq, 'kv': s.cq + s.gq, 'full': s.cqk + s.gqk, 'causal': s.cqk / 2 + s.gqk})[1]
    END)[1]
);

-- Positions (1-based) of the query, key, value and output arguments (NULL: the op returns a query-shaped output),
-- and whether key and value are the step's new tokens (vLLM: read once more, to be written into the cache) or the
-- whole cache (aiter: not read whole).
CREATE OR REPLACE MACRO paged_attention_layout(name) AS (
    CAST(CASE WHEN name = 'vllm::unified_attention_with_output' THEN {'q': 1, 'k': 2, 'v': 3, 'out': 4, 'new_kv': true}
              WHEN name = 'aiter::mha_batch_prefill' THEN {'q': 1, 'k': 2, 'v': 3, 'out': NULL, 'new_kv': false}
              WHEN serving_op_kind(name) = 'paged_attention' THEN {'q': 3, 'k': 4, 'v': 5, 'out': 1, 'new_kv': false}
         END AS STRUCT(q INTEGER, k INTEGER, v INTEGER, out INTEGER, new_kv BOOLEAN))
);

-- The op's cost, once per call: STRUCT(flash, torch, bytes), NULL without what x must give (each formula expanded
-- once: the ingest binds it for every distinct call of a run).
-- FLOPs. MoE: gate and up projections [T·k, H]·[H, 2I], down projection [T·k, I]·[I, H]: 6·T·k·H·I. Paged
-- attention: 2·Hq·(d_qk + d_v) per query·key pair, as attention_flops; the pairs of every layer's call are the
-- step's (a sliding-window layer is counted as full attention: an upper bound there); 'flash' counts the pairs
-- the causal mask keeps, 'torch' the whole matrices.
-- Bytes. MoE reads the hidden states and router logits, writes its output [T, H], and reads the weights of every
-- expert a routed token can reach (min(E, T·k): all of them once T·k ≥ E) once: 3·H·I elements each at the
-- packed size (moe_weight_bytes). Paged attention reads the query and the keys and values of its step's kv tokens
-- from the cache (Hkv·(d_k + d_v) each, at the cache's element size: the query's when it is smaller, as vLLM
-- quantizes the query for an FP8 cache, else the key's), writes the output; vLLM's op also reads the new tokens'
-- key and value to write them into the cache.
CREATE OR REPLACE MACRO serving_op_cost(name, d, a, x) AS (
    CAST(CASE serving_op_kind(name)
        WHEN 'moe' THEN list_transform([moe_routing(d, x)], lambda r: {
            'flash': 6 * r.t * r.k * r.h * r.i, 'torch': 6 * r.t * r.k * r.h * r.i,
            'bytes': read_bytes(a, [1, 2]) + r.t * r.h * a[1].bpe
                     + least(r.e, r.t * r.k) * 3 * r.h * r.i * moe_weight_bytes(x.kernels, a[1].bpe)})[1]
        WHEN 'paged_attention' THEN list_transform([paged_attention_layout(name)], lambda l:
            list_transform([{'b': attention_batch(x.batch), 'per_pair': 2 * d[l.q][-2] * (d[l.q][-1] + d[l.v][-1])}],
                           lambda p: {
            'flash': p.per_pair * p.b.causal, 'torch': p.per_pair * p.b.full,
            'bytes': read_bytes(a, CASE WHEN l.new_kv THEN [l.q, l.k, l.v] ELSE [l.q] END)
                     + a[coalesce(l.out, l.q)].numel * a[coalesce(l.out, l.q)].bpe
                     + p.b.kv * d[l.k][-2] * (d[l.k][-1] + d[l.v][-1]) * least(a[l.q].bpe, a[l.k].bpe)})[1])[1]
    END AS STRUCT(flash DOUBLE, torch DOUBLE, bytes DOUBLE))
);

-- The dtype whose peak the op is rated against: a MoE whose kernels run MXFP8 activations (TRT-LLM's MxE4m3,
-- with FP8 or FP4 weights: the tensor cores' FP8 rate) 'mxfp8', else the first tensor argument's (op_dtype).
CREATE OR REPLACE MACRO serving_op_dtype(name, x) AS (
    CASE WHEN serving_op_kind(name) = 'moe' AND regexp_matches(coalesce(x.kernels, ''), 'MxE4m3') THEN 'mxfp8' END
);

-- Losses: mse_loss(self, target, reduction) and mse_loss_backward(grad_output, self, target, reduction[,
-- grad_input]) (reduction, a Concrete Input: 0 none, 1 mean, 2 sum). Forward: 2 FLOPs per element (subtract,
-- square) and 1 more to accumulate when reduced; reads self and target, writes one element (reduced) or self's
-- shape. Backward: 3 per element (subtract, scale by 2 (/N), times grad_output); reads grad_output, self and
-- target, writes grad_input (self's shape). NULL when the reduction was not recorded.
CREATE OR REPLACE MACRO loss_flops(core, a, c) AS (
    CASE core
        WHEN 'aten::mse_loss' THEN a[1].numel * CASE c[3] WHEN '0' THEN 2 WHEN '1' THEN 3 WHEN '2' THEN 3 END
        WHEN 'aten::mse_loss_backward' THEN 3 * a[2].numel
    END
);

CREATE OR REPLACE MACRO loss_bytes(core, a, c) AS (
    CASE core
        WHEN 'aten::mse_loss' THEN read_bytes(a, [1, 2])
            + CASE c[3] WHEN '0' THEN a[1].numel WHEN '1' THEN 1 WHEN '2' THEN 1 END * a[1].bpe
        WHEN 'aten::mse_loss_backward' THEN read_bytes(a, [1, 2, 3]) + a[2].numel * a[2].bpe
    END
);

-- Random fills in place (normal_, uniform_, ... (self, parameters, generator)): self written once; 0 FLOPs, as
-- fill_ (the generator's arithmetic is not counted).
CREATE OR REPLACE MACRO op_is_random_fill(base) AS (
    base IN ('aten::normal_', 'aten::uniform_', 'aten::random_', 'aten::exponential_', 'aten::log_normal_',
             'aten::cauchy_', 'aten::geometric_')
);

-- ---------------------------------------------------------------------------------------------------------
-- Views and allocations: no data moved.
CREATE OR REPLACE MACRO op_is_view(core) AS (
    core IN ('aten::view', 'aten::_unsafe_view', 'aten::_reshape_alias', 'aten::as_strided', 'aten::t',
             'aten::transpose', 'aten::permute', 'aten::expand', 'aten::expand_as', 'aten::unsqueeze',
             'aten::squeeze', 'aten::select', 'aten::slice', 'aten::narrow', 'aten::alias', 'aten::detach',
             'aten::view_as', 'aten::split', 'aten::split_with_sizes', 'aten::chunk', 'aten::unbind',
             'aten::diagonal', 'aten::unflatten', 'aten::lift_fresh', 'aten::numpy_T', 'aten::movedim',
             'aten::swapaxes', 'aten::unfold', 'aten::resolve_conj', 'aten::resolve_neg', 'aten::empty',
             'aten::empty_like', 'aten::empty_strided', 'aten::new_empty', 'aten::new_empty_strided',
             'aten::resize_', 'aten::set_')
);

-- ---------------------------------------------------------------------------------------------------------
-- Which formula an op name takes: 'gemm', 'conv', 'attention' (the math that FLOPs are usually about),
-- 'elementwise', 'reduction', 'norm', 'softmax', 'copy', 'upsample', 'pool', 'index', 'fused', 'triton', 'loss',
-- 'random' (memory-bound work),
-- 'view' (views and allocations: nothing moved); NULL when tracesql has no formula for it.
CREATE OR REPLACE MACRO op_base_family(name, base) AS (
    list_transform([op_core_name(base)], lambda fc: CASE
        WHEN base IN ('aten::mm', 'aten::addmm', 'aten::bmm', 'aten::baddbmm', 'aten::linear',
                                    'aten::matmul', 'aten::_scaled_mm', 'aten::_grouped_mm',
                                    'aten::_scaled_grouped_mm') THEN 'gemm'
        WHEN base IN ('aten::conv1d', 'aten::conv2d', 'aten::conv3d', 'aten::convolution',
                                    'aten::_convolution', 'aten::conv_transpose1d', 'aten::conv_transpose2d',
                                    'aten::conv_transpose3d', 'aten::cudnn_convolution',
                                    'aten::cudnn_convolution_transpose', 'aten::mkldnn_convolution',
                                    'aten::miopen_convolution', 'aten::miopen_convolution_transpose',
                                    'aten::convolution_backward') THEN 'conv'
        WHEN attention_layout(base) IS NOT NULL THEN 'attention'
        WHEN op_is_view(fc) THEN 'view'
        WHEN base IN ('aten::copy_', 'aten::_copy_from', 'aten::_to_copy', 'aten::clone',
                                    'aten::lift_fresh_copy', 'aten::fill_', 'aten::zero_', 'aten::arange',
                                    'aten::constant_pad_nd',
                                    'aten::pad', 'aten::reflection_pad1d', 'aten::reflection_pad2d',
                                    'aten::reflection_pad3d', 'aten::replication_pad1d', 'aten::replication_pad2d',
                                    'aten::replication_pad3d') OR is_fbgemm_permute(base) THEN 'copy'
        WHEN elementwise_spec(fc) IS NOT NULL THEN 'elementwise'
        WHEN reduction_spec(base) IS NOT NULL THEN 'reduction'
        WHEN norm_layout(base) IS NOT NULL THEN 'norm'
        WHEN base IN ('aten::softmax', 'aten::_softmax', 'aten::_safe_softmax', 'aten::log_softmax',
                                    'aten::_log_softmax', 'aten::_softmax_backward_data',
                                    'aten::_log_softmax_backward_data') THEN 'softmax'
        WHEN regexp_matches(base, '^aten::_?upsample_[a-z_]+[123]d(_aa)?(_backward)?$')
             AND upsample_taps(base) IS NOT NULL THEN 'upsample'
        WHEN regexp_matches(base, '^aten::max_pool[123]d_with_indices(_backward)?$') THEN 'pool'
        WHEN fc IN ('aten::embedding', 'aten::index_select', 'aten::gather', 'aten::scatter', 'aten::scatter_add',
                    'aten::scatter_reduce', 'aten::index_add', 'aten::index_copy', 'aten::index_put',
                    'aten::_index_put_impl', 'aten::embedding_dense_backward')
            THEN 'index'
        WHEN fused_kernel(name) IS NOT NULL THEN 'fused'
        WHEN base IN ('aten::mse_loss', 'aten::mse_loss_backward') THEN 'loss'
        WHEN op_is_random_fill(base) THEN 'random'
        WHEN regexp_matches(name, '^triton_(poi|red|per)_') THEN 'triton'
    END)[1]
);

CREATE OR REPLACE MACRO op_flop_family(name) AS (
    op_base_family(name, op_base_name(name))
);

-- What the formulas need to know of an op, worked out once: its name, base (op_base_name), core (in-place
-- ops: the functional name), family (op_base_family; max/min of two tensors are the elementwise maximum/
-- minimum), whether it is in place, whether its last argument is an `out=` tensor (has_out_arg, with the
-- arity of the functional form: elementwise per op; reductions, softmax, gather, index_select by schema), and
-- its family's spec (elementwise_spec, reduction_spec, norm_layout). a = op_args(); base = op_base_name(name).
-- (The core name, whether the op is in place, whether it is max/min of two tensors and the elementwise spec are
-- lambdas' arguments: worked out once, not expanded, bound and optimized at each use as a macro is.)
CREATE OR REPLACE MACRO op_kind(name, base, family, a) AS (
    list_transform([{'core': op_core_name(base), 'inplace': op_is_inplace(base),
                     'pair': base IN ('aten::max', 'aten::min') AND a[2].numel IS NOT NULL}], lambda ok:
    list_transform([elementwise_spec(CASE WHEN ok.pair THEN 'aten::maximum'
                                          WHEN family = 'elementwise' THEN ok.core END)], lambda ew:
    {'name': name, 'base': base,
     'core': CASE WHEN ok.pair THEN 'aten::maximum' ELSE ok.core END,
     'family': CASE WHEN ok.pair THEN 'elementwise' ELSE family END,
     'inplace': ok.inplace,
     'out': NOT ok.inplace AND has_out_arg(name, a, CASE
         WHEN ok.pair THEN 2
         WHEN family = 'elementwise' THEN ew.arity
         WHEN family = 'reduction' THEN 1
         WHEN family = 'softmax' THEN CASE WHEN base LIKE '%backward%' THEN 4 ELSE 3 END
         WHEN base = 'aten::gather' THEN 4
         WHEN base = 'aten::index_select' THEN 3
         ELSE 99 END),
     'ew': ew,
     'red': CASE WHEN family = 'reduction' THEN reduction_spec(base) END,
     'nl': CASE WHEN family = 'norm' THEN norm_layout(base) END})[1])[1]
);

-- Each distinct call of the run's framework ops (name, input_dims, input_types, concrete_inputs; XLA ops carry
-- their own costs) as the formulas read it: its base name, family (op_base_family), arguments `a` (op_args) and
-- kind `k` (op_kind; k.family is the formula it takes, NULL: none), each worked out once (a column, not a macro
-- expanded at each use). tracesql/op_costs.sql costs these calls; the ingest binds the formulas of their families.
CREATE OR REPLACE MACRO op_calls() AS TABLE
SELECT *, op_kind(name, base, family, a) AS k
FROM (SELECT *, op_base_family(name, base) AS family, op_args(input_dims, input_types, concrete_inputs) AS a
      FROM (SELECT *, op_base_name(name) AS base
            FROM (SELECT DISTINCT name, input_dims, input_types, concrete_inputs FROM ops WHERE program_id IS NULL)));

-- The formula of each family (op_base_family, op_kind's k.family), over the op's arguments as the `ops` columns
-- type them (d = input_dims, t = input_types, c = concrete_inputs), a = op_args(d, t, c) and k = op_kind() (op_calls
-- gives both): typed_op_flops_FAMILY(k, d, t, c, a, attention_convention) and typed_op_bytes_FAMILY(k, d, t, c, a),
-- one pair per family. typed_op_flops and typed_op_bytes dispatch on k.family to them (31_op_families.sql, generated
-- from these macros' names: a family is added here, as its pair; the ingest binds the pairs of its run's families
-- only). GEMM: 2 FLOPs per multiply-add of the M·N·K (·batch) product; gemm_mkn (a macro: expanded, bound and
-- optimized at each use) once, as a lambda's argument.
CREATE OR REPLACE MACRO typed_op_flops_gemm(k, d, t, c, a, attention_convention) AS (
    list_transform([gemm_mkn(k.base, d)], lambda g: 2 * g.batch * g.m * g.k * g.n)[1]
);

-- Only the operands (and bias) read: an `out=` tensor recorded after them is the output, written once in its dtype.
CREATE OR REPLACE MACRO typed_op_bytes_gemm(k, d, t, c, a) AS (
    list_transform([gemm_mkn(k.base, d)], lambda g: CASE WHEN g IS NOT NULL THEN
        args_bytes(a[1:gemm_operands(k.base)])
        + g.batch * g.m * g.n * gemm_out_matrices(k.base, d)
          * CASE WHEN k.base = 'aten::_scaled_mm'
                 THEN coalesce(scalar_type_bytes(c[7]), 2)  -- out_dtype, else bf16
                 WHEN k.base = 'aten::_scaled_grouped_mm' THEN coalesce(scalar_type_bytes(c[8]), 2)
                 WHEN k.base = 'aten::_grouped_mm' THEN coalesce(scalar_type_bytes(c[5]), a[1].bpe)
                 -- the output has the dtype of the first matrix
                 ELSE a[CASE WHEN k.base IN ('aten::addmm', 'aten::baddbmm') THEN 2 ELSE 1 END].bpe
            END
    END)[1]
);

-- Convolution (conv_flops, conv_bytes).
CREATE OR REPLACE MACRO typed_op_flops_conv(k, d, t, c, a, attention_convention) AS (conv_flops(k.base, d, c));
CREATE OR REPLACE MACRO typed_op_bytes_conv(k, d, t, c, a) AS (conv_bytes(k.base, d, a, c));

-- Attention (attention_flops, attention_bytes), causal counted as attention_convention says.
CREATE OR REPLACE MACRO typed_op_flops_attention(k, d, t, c, a, attention_convention) AS (
    attention_flops(k.base, d, c, attention_convention)
);
CREATE OR REPLACE MACRO typed_op_bytes_attention(k, d, t, c, a) AS (attention_bytes(k.base, d, a));

-- Views and allocations move nothing.
CREATE OR REPLACE MACRO typed_op_flops_view(k, d, t, c, a, attention_convention) AS (0);
CREATE OR REPLACE MACRO typed_op_bytes_view(k, d, t, c, a) AS (0);

-- An elementwise op without a tensor argument recorded has no cost.
CREATE OR REPLACE MACRO typed_op_flops_elementwise(k, d, t, c, a, attention_convention) AS (
    CASE WHEN len(tensor_positions(a, 99)) > 0 THEN k.ew.flops * elementwise_out_numel(k, d, a) END
);
CREATE OR REPLACE MACRO typed_op_bytes_elementwise(k, d, t, c, a) AS (elementwise_bytes(k, d, a));

-- Reductions: the spec's FLOPs per input element (reduction_spec), reduction_bytes.
CREATE OR REPLACE MACRO typed_op_flops_reduction(k, d, t, c, a, attention_convention) AS (k.red.flops * a[1].numel);
CREATE OR REPLACE MACRO typed_op_bytes_reduction(k, d, t, c, a) AS (reduction_bytes(k, d, a, c));

-- Normalization, forward and backward (norm_flops, norm_bytes).
CREATE OR REPLACE MACRO typed_op_flops_norm(k, d, t, c, a, attention_convention) AS (norm_flops(k.nl, d, c));
CREATE OR REPLACE MACRO typed_op_bytes_norm(k, d, t, c, a) AS (norm_bytes(k.nl, d, a, c));

-- Softmax and log-softmax: 5 FLOPs per element, softmax_bytes.
CREATE OR REPLACE MACRO typed_op_flops_softmax(k, d, t, c, a, attention_convention) AS (5 * a[1].numel);
CREATE OR REPLACE MACRO typed_op_bytes_softmax(k, d, t, c, a) AS (softmax_bytes(k, a, c));

-- A copy has no FLOPs when its bytes are known (NULL when they are not).
CREATE OR REPLACE MACRO typed_op_flops_copy(k, d, t, c, a, attention_convention) AS (
    CASE WHEN copy_bytes(k.base, d, a, c) IS NOT NULL THEN 0 END
);
CREATE OR REPLACE MACRO typed_op_bytes_copy(k, d, t, c, a) AS (copy_bytes(k.base, d, a, c));

-- Upsampling (upsample_flops, upsample_bytes).
CREATE OR REPLACE MACRO typed_op_flops_upsample(k, d, t, c, a, attention_convention) AS (upsample_flops(k.base, d, c));
CREATE OR REPLACE MACRO typed_op_bytes_upsample(k, d, t, c, a) AS (upsample_bytes(k.base, d, a, c));

-- Gathers and scatters (index_flops, index_bytes).
CREATE OR REPLACE MACRO typed_op_flops_index(k, d, t, c, a, attention_convention) AS (index_flops(k.core, d, a, c));
CREATE OR REPLACE MACRO typed_op_bytes_index(k, d, t, c, a) AS (index_bytes(k, k.core, d, a, c));

-- Inference engines' fused kernels, by the layout they share (fused_kernel, fused_flops, fused_bytes).
CREATE OR REPLACE MACRO typed_op_flops_fused(k, d, t, c, a, attention_convention) AS (
    fused_flops(fused_kernel(k.name), d, a)
);
CREATE OR REPLACE MACRO typed_op_bytes_fused(k, d, t, c, a) AS (fused_bytes(fused_kernel(k.name), d, a));

-- Inductor's Triton kernels: no FLOPs recorded, each tensor argument moved once (no tensor argument: no cost).
CREATE OR REPLACE MACRO typed_op_flops_triton(k, d, t, c, a, attention_convention) AS (
    CASE WHEN len(tensor_positions(a, 99)) > 0 THEN 0 END
);
CREATE OR REPLACE MACRO typed_op_bytes_triton(k, d, t, c, a) AS (read_bytes(a, tensor_positions(a, 99)));

-- Losses (loss_flops, loss_bytes).
CREATE OR REPLACE MACRO typed_op_flops_loss(k, d, t, c, a, attention_convention) AS (loss_flops(k.base, a, c));
CREATE OR REPLACE MACRO typed_op_bytes_loss(k, d, t, c, a) AS (loss_bytes(k.base, a, c));

-- A random fill writes self once (no self recorded: no cost).
CREATE OR REPLACE MACRO typed_op_flops_random(k, d, t, c, a, attention_convention) AS (
    CASE WHEN a[1].numel IS NOT NULL THEN 0 END
);
CREATE OR REPLACE MACRO typed_op_bytes_random(k, d, t, c, a) AS (a[1].numel * a[1].bpe);

-- Max pooling (max_pool_flops, max_pool_bytes).
CREATE OR REPLACE MACRO typed_op_flops_pool(k, d, t, c, a, attention_convention) AS (max_pool_flops(k.base, d, a, c));
CREATE OR REPLACE MACRO typed_op_bytes_pool(k, d, t, c, a) AS (max_pool_bytes(k.base, d, a, c));
