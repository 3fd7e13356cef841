-- FLOPs and bytes of an op call (the formulas of 30_flops.sql), arithmetic intensity, roofline, MFU, a run's op
-- costs and the peaks of the device a run ran on.

-- FLOPs of one op call from its recorded shapes (the `ops` columns name, input_dims, input_types,
-- concrete_inputs). NULL for ops without a formula or without recorded shapes. attention_convention: 'flash'
-- (causal attention counts half, as metrics.md) or 'torch' (never halved, as FlopCounterMode).
CREATE OR REPLACE MACRO op_flops(name, input_dims, input_types, concrete_inputs, attention_convention := 'flash') AS ((
    SELECT typed_op_flops(k, d, t, c, a, attention_convention)
    FROM (SELECT *, op_kind(n, base, family, a) AS k
          FROM (SELECT *, op_base_family(n, base) AS family, op_args(d, t, c) AS a
                FROM (SELECT *, op_base_name(n) AS base
                      FROM (SELECT CAST(name AS VARCHAR) AS n, CAST(input_dims AS BIGINT[][]) AS d,
                                   CAST(input_types AS VARCHAR[]) AS t, CAST(concrete_inputs AS VARCHAR[]) AS c))))
));

-- Bytes one op call moves at least: each tensor it reads read once, each it writes written once, in their
-- dtypes (the result's by type promotion; an `out=` tensor's; in place: the first argument's).
CREATE OR REPLACE MACRO op_bytes(name, input_dims, input_types, concrete_inputs) AS ((
    SELECT typed_op_bytes(k, d, t, c, a)
    FROM (SELECT *, op_kind(n, base, family, a) AS k
          FROM (SELECT *, op_base_family(n, base) AS family, op_args(d, t, c) AS a
                FROM (SELECT *, op_base_name(n) AS base
                      FROM (SELECT CAST(name AS VARCHAR) AS n, CAST(input_dims AS BIGINT[][]) AS d,
                                   CAST(input_types AS VARCHAR[]) AS t, CAST(concrete_inputs AS VARCHAR[]) AS c))))
));

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

-- What a row that reports a rate above the device's peak says in its `warning` column (NULL when the rate is
-- within it): 'exceeds the device''s peak: 1.2e+15 bytes/s > 1.64e+12 bytes/s (memory bandwidth; ...)'. No device
-- does it; such a rate means a time that is too short for the work (an async op's start timed alone, a kernel
-- that overlaps others it waited for) or the wrong peak (device, dtype). `what` names the peak and the likely cause.
CREATE OR REPLACE MACRO peak_exceeded(achieved, peak, unit, what) AS (
    CASE WHEN achieved > peak
         THEN 'exceeds the device''s peak: ' || format('{:.4g}', achieved) || ' ' || unit || ' > '
              || format('{:.4g}', peak) || ' ' || unit || ' (' || what || ')'
    END
);

-- Model FLOPs utilization: model FLOPs / (time × devices × peak FLOP/s per device). Given the FLOPs the
-- hardware executed instead of the model's, it is HFU.
CREATE OR REPLACE MACRO mfu(model_flops, time_ns, devices, peak_flops_per_s) AS (
    model_flops / (time_ns / 1e9 * devices * peak_flops_per_s)
);

-- ---------------------------------------------------------------------------------------------------------
-- Table functions over a run.

-- The error for an op without its row in `op_costs`: the run was ingested before the table existed.
CREATE OR REPLACE MACRO op_costs_missing(run_id) AS
    error('run ' || run_id || ' has no op costs: it was ingested by a tracesql older than schema version 10, '
          || 'which works them out at ingest; ingest it again');

-- Every op with its FLOPs and bytes and whether it is *counted* (the ops whose FLOPs and bytes add up without
-- double counting: the innermost GEMM/conv/attention op, the outermost other op with a formula, XLA ops but the
-- -done of an async pair): the run's `op_costs` table, which the ingest works out once by the formulas above
-- (tracesql/op_costs.sql says which ops are counted and why). attention_convention 'flash' halves causal
-- attention, 'torch' (FlopCounterMode) does not. profiler_flops is `ops.flops` (what
-- torch.profiler(with_flops=True) attached, when the trace carries it). A run ingested before the table existed
-- (schema version 9 and older) has ops but no costs: reading whether an op is counted fails, saying so.
-- Also one row per kernel with no launch recorded whose identical kernels were launched by costed ops
-- (cost_source 'identical kernel' or 'aligned kernel', op_id its slice_id): the name, shapes and dtypes of the op its cost is taken
-- from (cost_op_id; the kernel's own name when their costs differ and it has none), its step, its duration.
CREATE OR REPLACE MACRO op_costs(attention_convention := 'flash') AS TABLE
SELECT o.run_id, o.rank, o.op_id, o.name, o.step, c.family, c.dtype, o.input_dims, o.input_types,
    CASE WHEN attention_convention = 'flash' THEN c.flops ELSE c.torch_flops END AS flops, c.bytes,
    c.device_total_ns, o.flops AS profiler_flops,
    CASE WHEN c.op_id IS NULL THEN op_costs_missing(o.run_id) ELSE c.counted END AS counted, c.cost_source, c.cost_op_id
FROM ops o
LEFT JOIN op_costs c ON c.run_id = o.run_id AND c.rank = o.rank AND c.op_id = o.op_id
UNION ALL
SELECT c.run_id, c.rank, c.op_id, coalesce(s.name, k.name) AS name, k.step, c.family, c.dtype, s.input_dims,
    s.input_types, CASE WHEN attention_convention = 'flash' THEN c.flops ELSE c.torch_flops END AS flops, c.bytes,
    c.device_total_ns, CAST(NULL AS DOUBLE) AS profiler_flops, c.counted, c.cost_source, c.cost_op_id
FROM op_costs c
JOIN slices k ON k.run_id = c.run_id AND k.rank = c.rank AND k.slice_id = c.op_id
LEFT JOIN ops s ON s.run_id = c.run_id AND s.rank = c.rank AND s.op_id = c.cost_op_id
WHERE c.cost_source IN ('identical kernel', 'aligned kernel');

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
    UNPIVOT device_peaks ON fp64, fp32, tf32, bf16, fp16, fp8, int8,
        fp6, fp4, mxfp8, mxfp6, mxfp4,
        tf32_sparse, bf16_sparse, fp16_sparse, fp8_sparse, fp6_sparse, fp4_sparse, int8_sparse
        INTO NAME dtype VALUE peak_flops_per_s
), dtypes AS (
    SELECT unnest(['fp64', 'fp32', 'tf32', 'bf16', 'fp16', 'fp8', 'int8',
                   'fp6', 'fp4', 'mxfp8', 'mxfp6', 'mxfp4',
                   'tf32_sparse', 'bf16_sparse', 'fp16_sparse', 'fp8_sparse', 'fp6_sparse', 'fp4_sparse',
                   'int8_sparse']) AS dtype
)
SELECT m.run_id, m.rank, m.device_name, m.device, m.device_note, t.dtype,
    CAST(coalesce(peak_flops, p.peak_flops_per_s) AS DOUBLE) AS peak_flops_per_s,
    CAST(coalesce(peak_bytes_per_s, d.bytes_per_s) AS DOUBLE) AS peak_bytes_per_s,
    d.link_bytes_per_s
FROM matched m CROSS JOIN dtypes t
LEFT JOIN device_peaks d ON d.device = m.device
LEFT JOIN peaks p ON p.device = m.device AND p.dtype = t.dtype;
