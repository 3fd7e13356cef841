-- roofline: Per op shape: FLOPs, bytes, arithmetic intensity, achieved vs attainable FLOP/s, and the share of the roofline reached.
--
-- One row per run, device model, op name, input shapes and dtypes (and FLOPs/bytes, so that calls with other
-- scalar arguments such as stride never merge) and cost source, over the ops that op_costs() counts: each op's work once
-- (aten::linear and the aten::addmm inside it are not both counted; docs/concepts/cost-model.md). FLOPs and bytes
-- are per call (formulas in tracesql/functions/30_flops.sql, checked against torch's FlopCounterMode and
-- TraceLens), for GEMMs, convolutions, attention and the memory-bound ops (elementwise, reductions, norms,
-- softmax, copies, upsampling, gathers: arithmetic intensity 0 for those that compute nothing). Time is the
-- device time the calls caused (`ops.device_total_ns`: kernels launched by the op or the ops nested in it; an XLA
-- async pair, at its -start: from its start to its -done's end, op_costs), summed over calls and ranks; achieved rates divide the FLOPs and bytes of the calls that have device time by it.
-- Roofline (metrics.md): AI = FLOPs / bytes; ridge point = peak FLOP/s / peak bytes/s; attainable FLOP/s =
-- min(peak, AI · peak bytes/s); roofline time = max(FLOPs / peak, bytes / peak bytes/s); roofline_pct = roofline
-- time / measured time · 100 (100 = at the roof); bound = compute when AI >= ridge point, else memory.
-- Peaks come from the `device_peaks` table (dense, per dtype, unless dtype names a _sparse column), matched on `devices.name` unless `device` says;
-- peak_flops / peak_bytes_per_s replace them (for a device the table lacks, or to rate against other clocks).
--
-- Needs: ops with recorded shapes (record_shapes=True); device time from a GPU trace; a known device or the device parameter for the peaks
-- Parameters:
--   device = NULL                    device key: device_peaks key for every rank (e.g. 'H100-SXM'); NULL = matched from devices.name
--   dtype = NULL                     peak dtype: the device_peaks column to rate against (bf16, fp8, fp4, mxfp4, fp8_sparse, ...); NULL = each op's input dtype
--   top = 20                         integer >= 1: rows per run, by device time, then total FLOPs
--   peak_flops = NULL                number > 0: peak FLOP/s per device, instead of device_peaks'
--   peak_bytes_per_s = NULL          number > 0: peak memory bandwidth per device, instead of device_peaks'
--   attention_convention = 'flash'   one of flash, torch: causal attention FLOPs: 'flash' halves them, 'torch' (FlopCounterMode) does not
-- Columns:
--   run_id                  VARCHAR   run
--   device                  VARCHAR   device_peaks key of the ranks' device (NULL: unknown device)
--   name                    VARCHAR   op name
--   input_dims              BIGINT[][]  recorded input shapes
--   input_types             VARCHAR[]   recorded input dtypes
--   dtype                   VARCHAR   the peak it is rated against
--   calls                   BIGINT    op calls, over all ranks
--   ranks                   BIGINT    ranks that made them
--   flops                   DOUBLE    FLOPs per call
--   bytes                   DOUBLE    bytes per call (inputs read and output written once)
--   cost_source             VARCHAR   where FLOPs and bytes come from: 'formula', 'xla', 'identical kernel' or 'aligned kernel' (kernels with no launch recorded, costed as the op of that name and shapes that launched identical kernels, or those at the kernel's place in its stream's sequence: op_costs)
--   arithmetic_intensity    DOUBLE    FLOPs per byte
--   device_ns               BIGINT    device time of all calls (NULL: no device events)
--   achieved_flops_per_s    DOUBLE    FLOPs of the timed calls / their device time
--   achieved_bytes_per_s    DOUBLE    bytes of the timed calls / their device time
--   peak_flops_per_s        DOUBLE    the device's peak for dtype (dense unless dtype ends in _sparse)
--   peak_bytes_per_s        DOUBLE    the device's memory bandwidth
--   ridge_point             DOUBLE    peak FLOP/s / peak bytes/s: the AI where compute becomes the limit
--   attainable_flops_per_s  DOUBLE    min(peak, AI · bandwidth)
--   roofline_ns             DOUBLE    the roofline's time for all calls
--   roofline_pct            DOUBLE    roofline time / device time of the timed calls · 100
--   bound                   VARCHAR   'compute' or 'memory' by the ridge point
--   warning                 VARCHAR   why there is no peak (unknown or ambiguous device, no peak or no dtype), or that an achieved rate exceeds the device's peak (peak_exceeded); NULL if none
WITH counted AS (
    SELECT * FROM op_costs(attention_convention := COALESCE(getvariable('attention_convention'), 'flash'))
    WHERE counted
), peaks AS (
    SELECT * FROM rank_device_peaks(device_key := COALESCE(getvariable('device'), NULL),
                                    peak_flops := COALESCE(getvariable('peak_flops'), NULL),
                                    peak_bytes_per_s := COALESCE(getvariable('peak_bytes_per_s'), NULL))
), rank_device AS (
    SELECT DISTINCT run_id, rank, device, device_note FROM peaks
), rated AS (
    SELECT c.*, rd.device, rd.device_note, coalesce(COALESCE(getvariable('dtype'), NULL), c.dtype) AS rated_dtype,
        p.peak_flops_per_s, p.peak_bytes_per_s
    FROM counted c
    LEFT JOIN rank_device rd ON rd.run_id = c.run_id AND rd.rank = c.rank
    LEFT JOIN peaks p ON p.run_id = c.run_id AND p.rank = c.rank
                     AND p.dtype = coalesce(COALESCE(getvariable('dtype'), NULL), c.dtype)
), grouped AS (
    SELECT run_id, device, name, input_dims, input_types, rated_dtype AS dtype, flops, bytes, cost_source,
        count(*) AS calls, count(DISTINCT rank) AS ranks,
        count(*) FILTER (WHERE device_total_ns > 0) AS timed_calls,
        CAST(sum(device_total_ns) AS BIGINT) AS device_ns,
        avg(peak_flops_per_s) AS peak_flops_per_s, avg(peak_bytes_per_s) AS peak_bytes_per_s,
        min(device_note) AS device_note
    FROM rated
    GROUP BY run_id, device, name, input_dims, input_types, rated_dtype, flops, bytes, cost_source
), ranked AS (
    SELECT *, row_number() OVER (PARTITION BY run_id ORDER BY device_ns DESC NULLS LAST, flops * calls DESC,
                                                            name, CAST(input_dims AS VARCHAR),
                                                            CAST(input_types AS VARCHAR), dtype, device,
                                                            flops, bytes, cost_source) AS row_in_run
    FROM grouped
)
SELECT run_id, device, name, input_dims, input_types, dtype, calls, ranks, flops, bytes, cost_source,
    arithmetic_intensity(flops, bytes) AS arithmetic_intensity,
    device_ns,
    CASE WHEN device_ns > 0 THEN flops * timed_calls / (device_ns / 1e9) END AS achieved_flops_per_s,
    CASE WHEN device_ns > 0 THEN bytes * timed_calls / (device_ns / 1e9) END AS achieved_bytes_per_s,
    peak_flops_per_s, peak_bytes_per_s,
    peak_flops_per_s / peak_bytes_per_s AS ridge_point,
    attainable_flops(flops, bytes, peak_flops_per_s, peak_bytes_per_s) AS attainable_flops_per_s,
    roofline_time_ns(flops, bytes, peak_flops_per_s, peak_bytes_per_s) * calls AS roofline_ns,
    CASE WHEN device_ns > 0
         THEN 100 * roofline_time_ns(flops, bytes, peak_flops_per_s, peak_bytes_per_s) * timed_calls / device_ns
    END AS roofline_pct,
    CASE WHEN arithmetic_intensity(flops, bytes) >= peak_flops_per_s / peak_bytes_per_s THEN 'compute'
         WHEN arithmetic_intensity(flops, bytes) < peak_flops_per_s / peak_bytes_per_s THEN 'memory'
    END AS bound,
    NULLIF(concat_ws('; ',
        CASE WHEN dtype IS NULL THEN 'the op has no floating-point input to rate: give -p dtype='
             WHEN peak_flops_per_s IS NULL OR peak_bytes_per_s IS NULL
             THEN coalesce(device_note, 'no ' || dtype || ' peak for ' || device || ' in device_peaks')
                  || ': give -p device= or -p peak_flops= and -p peak_bytes_per_s='
        END,
        peak_exceeded(achieved_flops_per_s, peak_flops_per_s, 'FLOP/s',
                      CASE WHEN dtype LIKE '%_sparse' THEN '' ELSE 'dense ' END || dtype
                      || ' compute: the op''s device time is too short for its FLOPs, or the peak '
                      || 'is not this device''s or dtype''s'),
        peak_exceeded(achieved_bytes_per_s, peak_bytes_per_s, 'bytes/s',
                      'memory bandwidth: the op''s device time is too short for its bytes, or it moves them between '
                      || 'other memories (host offload, another device)')), '') AS warning
FROM ranked
WHERE row_in_run <= COALESCE(getvariable('top'), 20)
ORDER BY run_id, row_in_run;
