-- gemm_under_roofline: Steps whose GEMMs run far under their roofline: matmuls slower than the device allows for their shapes.
--
-- A GEMM shape (op name, input shapes, dtype: the roofline query's rows of family gemm) is flagged when its calls
-- over the run reach less than max_roofline_pct % of their roofline (roofline time = max(FLOPs / peak FLOP/s,
-- bytes / peak bandwidth) at the device's dense peak for the dtype, from device_peaks). Priced by the what-if
-- replay of each step with the kernels those GEMM calls launched made faster (the what_if query's faster = their
-- names, faster_pct) by as much as brings the flagged calls, together, to attainable_pct % of their roofline: a
-- tuned library GEMM of a large shape reaches 70 to 90 % of the dense peak, so 70 is what a fix can expect,
-- not the roof itself. A kernel of the same name launched by another op is made faster too. Evidence: the
-- step's flagged calls, their measured and roofline time, and the worst shape. The fix: shapes the tensor cores
-- like (multiples of 64 or 128, no skinny or tiny matmuls; batch them), a lower-precision dtype with a higher
-- peak, a better kernel (cuBLAS's heuristics, torch.compile's max-autotune).
--
-- Needs: ops with recorded shapes (record_shapes=True), their kernels (correlation ids), a device in device_peaks
-- Parameters:
--   run = 'RUN'              text: the run as the user named it, for the query column's command
--   min_saving_pct = 5       number >= 0: fires when the fix saves at least this % of the step
--   max_roofline_pct = 35    number > 0: GEMM shapes under this % of their roofline are flagged
--   attainable_pct = 70      number > 0: the % of the roofline the what-if runs the flagged GEMMs at
-- Columns:
--   run_id      VARCHAR  run
--   rank        INTEGER  rank
--   step        INTEGER  step
--   finding     VARCHAR  the rule that fired (its file's name)
--   evidence    VARCHAR  what it saw, with the numbers
--   saving_ns   BIGINT   step time the what-if replay says the fix saves (0 when it saves none)
--   saving_pct  DOUBLE   saving_ns in % of the step's replayed time
--   query       VARCHAR  the tracesql command that shows the evidence
-- The run's change, worked out first and kept as a value: a what-if regex that is a subquery is compiled again for
-- every name it is matched against (20 s instead of 1 on trace_diff's control trace).
SET VARIABLE gemm_under_roofline_change = (
WITH calls AS (
    -- each GEMM call with device time, and its roofline time at the rank's device peaks for its dtype
    SELECT c.run_id, c.rank, c.op_id, c.name, c.input_dims, c.dtype, c.device_total_ns AS device_ns,
        roofline_time_ns(c.flops, c.bytes, p.peak_flops_per_s, p.peak_bytes_per_s) AS roofline_ns
    FROM op_costs() c
    JOIN rank_device_peaks() p ON p.run_id = c.run_id AND p.rank = c.rank AND p.dtype = c.dtype
    WHERE c.counted AND c.family = 'gemm' AND c.device_total_ns > 0 AND c.flops > 0
      AND p.peak_flops_per_s > 0 AND p.peak_bytes_per_s > 0
), flagged AS (
    -- the shapes under max_roofline_pct over the run, as the roofline query rates them
    SELECT c.*, s.shape_pct FROM calls c
    JOIN (SELECT run_id, name, input_dims, dtype, 100 * sum(roofline_ns) / sum(device_ns) AS shape_pct
          FROM calls GROUP BY ALL
          HAVING shape_pct < COALESCE(getvariable('max_roofline_pct'), 35)) s
      ON s.run_id = c.run_id AND s.name = c.name AND s.input_dims IS NOT DISTINCT FROM c.input_dims
     AND s.dtype = c.dtype
)
-- one what-if for the run: the flagged calls' kernels, and how much faster brings them to attainable_pct
SELECT {'kernels': (SELECT '^(' || string_agg(DISTINCT regexp_escape(d.name), '|' ORDER BY regexp_escape(d.name))
                           || ')$'
                    FROM slices d JOIN flagged f ON f.run_id = d.run_id AND f.rank = d.rank AND f.op_id = d.op_id
                    WHERE d.kind = 'kernel'),
        'faster_pct': round(greatest(0, 100 - sum(roofline_ns) * 100 / COALESCE(getvariable('attainable_pct'), 70)
                                            * 100 / sum(device_ns)), 2),
        'calls': list({'run_id': run_id, 'rank': rank, 'op_id': op_id, 'device_ns': device_ns,
                       'roofline_ns': roofline_ns, 'shape_pct': shape_pct,
                       'shape': name || ' ' || CAST(input_dims AS VARCHAR) || ' ' || dtype})}
FROM flagged);

WITH flagged AS (
    SELECT unnest(getvariable('gemm_under_roofline_change').calls, recursive := true)
), change AS (
    SELECT getvariable('gemm_under_roofline_change').kernels AS kernels,
        getvariable('gemm_under_roofline_change').faster_pct AS faster_pct
), priced AS (
    SELECT * FROM what_if(faster := getvariable('gemm_under_roofline_change').kernels,
                          faster_pct := getvariable('gemm_under_roofline_change').faster_pct)
), in_step AS (
    SELECT w.run_id, w.rank, w.instance, count(*) AS calls, count(DISTINCT f.shape) AS shapes,
        sum(f.device_ns) AS device_ns, sum(f.roofline_ns) AS roofline_ns, arg_min(f.shape, f.shape_pct) AS worst,
        min(f.shape_pct) AS worst_pct
    FROM critical_path_windows() w
    JOIN ops o ON o.run_id = w.run_id AND o.rank = w.rank AND o.ts BETWEEN w.ts AND w.te
    JOIN flagged f ON f.run_id = o.run_id AND f.rank = o.rank AND f.op_id = o.op_id
    GROUP BY ALL
)
SELECT p.run_id, p.rank, p.step, 'gemm_under_roofline' AS finding,
    printf('%d GEMM calls of %d shapes take %.2f ms at %.0f %% of their roofline (%.2f ms at the roof); at %g %% '
           || 'of it (kernels %.2f %% faster) the step takes %.2f ms less of %.2f ms (compute is %.0f %% of its '
           || 'critical path); worst shape %s at %.1f %% over the run',
           s.calls, s.shapes, s.device_ns / 1e6, 100 * s.roofline_ns / s.device_ns, s.roofline_ns / 1e6,
           CAST(COALESCE(getvariable('attainable_pct'), 70) AS DOUBLE), c.faster_pct, p.saving_ns / 1e6, p.replayed_ns / 1e6,
           100 * p.compute_share, s.worst, s.worst_pct) AS evidence,
    p.saving_ns, p.saving_pct,
    printf('tracesql query what_if %s -p ''faster=%s'' -p faster_pct=%s -p rank=%d -p instance=%d',
           COALESCE(getvariable('run'), 'RUN'), c.kernels, CAST(c.faster_pct AS VARCHAR), p.rank, p.instance) AS query
FROM priced p
JOIN in_step s ON s.run_id = p.run_id AND s.rank = p.rank AND s.instance = p.instance
CROSS JOIN change c
WHERE p.saving_pct >= COALESCE(getvariable('min_saving_pct'), 5);
