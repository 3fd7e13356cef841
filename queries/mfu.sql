-- mfu: Model and hardware FLOPs utilization per step (MFU from the model's FLOPs, HFU from the FLOPs in the trace).
--
-- Step time is the step's device window (`step_windows`: from the step's first device event to the next step's
-- first, the last step to its last event; windows are disjoint, docs/concepts/steps.md), the longest over the
-- traced ranks and their devices: the job moves at its slowest rank. Inference iterations (vLLM, SGLang) are
-- steps too (`iterations`). A run without steps gets one row, step NULL, over its whole device window (first
-- to last device event of each rank). Definitions (metrics.md):
--   MFU = model FLOPs per step / (step time × devices × peak FLOP/s per device). Model FLOPs are the job's
--   (all devices, no recomputation): model_flops_per_step, else 6 · params · tokens_per_step (dense
--   transformer training). Without either, MFU is NULL.
--   HFU = FLOPs the traced ranks executed in the step / (step time × traced ranks × peak). Those FLOPs are, per
--   op, the profiler's own count (`ops.flops`, with_flops=True) where the op has one and tracesql's formula where
--   it has none (flops_source 'auto': the profiler counts no attention, so a step's profiler total alone misses
--   it), summed over the ops op_costs() counts (innermost op with a formula, recomputation included); or only
--   the profiler's, or only the formulas. A kernel with no launch recorded that op_costs() costs as its identical
--   kernels' op (cost_source 'identical kernel' or 'aligned kernel') is hardware work too: its FLOPs count in the step its device
--   work belongs to (slices.step: by its order on its stream, as the step's window counts its time), in the
--   whole window of a run without steps, and in no step when it ran before the first (the previous iteration's
--   tail, outside every window).
-- The peak is the device's peak for dtype (dense unless dtype ends in _sparse), from `device_peaks` (device
-- matched from devices.name unless the device parameter names one; peak_flops replaces it), averaged over the
-- traced ranks. `warning` says when a number cannot be trusted: unknown or ambiguous device (no peak), MFU or HFU
-- above 1.
--
-- Needs: device events; for HFU, ops with recorded shapes (record_shapes=True); a known device, or the device or peak_flops parameter
-- Parameters:
--   model_flops_per_step = NULL      number > 0: model FLOPs of one step of the whole job
--   params = NULL                    number > 0: model parameters P: with tokens_per_step, model FLOPs = 6 · P · T
--   tokens_per_step = NULL           number > 0: tokens the whole job processes per step (global batch × sequence length)
--   num_devices = NULL               integer >= 1: devices of the job; NULL = ranks.world_size, else the ranks in the run
--   device = NULL                    device key: device_peaks key (e.g. 'H100-SXM'); NULL = matched from devices.name
--   dtype = NULL                     peak dtype: the device_peaks column to use (bf16, fp8, fp4, mxfp4, fp8_sparse, ...); NULL = the dtype with most counted FLOPs, else bf16
--   flops_source = 'auto'            one of formula, profiler, auto: HFU's FLOPs ('auto': per op, the profiler's where it counted the op, else the formula)
--   peak_flops = NULL                number > 0: peak FLOP/s per device, instead of device_peaks'
--   attention_convention = 'flash'   one of flash, torch: causal attention FLOPs: 'flash' halves them, 'torch' (FlopCounterMode) does not
-- Columns:
--   run_id            VARCHAR   run
--   step              INTEGER   step number (NULL: a run without steps, over its whole device window)
--   ranks             BIGINT    traced ranks with this step
--   step_time_ns      BIGINT    longest device window of the step over those ranks
--   device            VARCHAR   device_peaks key (NULL: unknown device)
--   dtype             VARCHAR   the peak used
--   peak_flops_per_s  DOUBLE    peak FLOP/s per device for dtype (dense unless dtype ends in _sparse)
--   devices           BIGINT    devices the model FLOPs are spread over
--   model_flops       DOUBLE    model FLOPs of the step (NULL: not given)
--   mfu               DOUBLE    model FLOPs utilization, 0..1
--   formula_flops     DOUBLE    FLOPs of the counted ops of the traced ranks in the step, from their shapes
--   profiler_flops    DOUBLE    FLOPs the profiler recorded for the step's ops (NULL: none recorded)
--   hardware_flops    DOUBLE    the FLOPs HFU uses (flops_source)
--   hfu               DOUBLE    hardware FLOPs utilization, 0..1
--   warning           VARCHAR   why mfu/hfu cannot be trusted (unknown or ambiguous device; above 1: exceeds the device's peak); NULL if none
WITH costs AS (
    SELECT * FROM op_costs(attention_convention := COALESCE(getvariable('attention_convention'), 'flash'))
), main_dtype AS (
    SELECT run_id, arg_max(dtype, (flops, dtype)) AS dtype FROM (
        SELECT run_id, dtype, sum(flops) AS flops FROM costs WHERE counted AND dtype IS NOT NULL GROUP BY ALL
    ) GROUP BY run_id
), step_flops AS (
    SELECT run_id, step, sum(flops) FILTER (WHERE counted) AS formula_flops, sum(profiler_flops) AS profiler_flops,
        -- per op: the profiler's count where it has one, else the formula (of a counted op); ops with no formula
        -- keep the profiler's
        sum(CASE WHEN counted THEN coalesce(profiler_flops, flops) WHEN flops IS NULL THEN profiler_flops END)
            AS per_op_flops
    FROM costs GROUP BY run_id, step
), step_times AS (
    -- each rank's and device's window of the step (step_windows: disjoint, consecutive windows), the longest
    SELECT s.run_id, s.step, count(DISTINCT s.rank) AS ranks, max(w.te - w.ts) AS step_time_ns,
        list(s.rank) AS rank_list
    FROM steps s
    LEFT JOIN step_windows() w ON w.run_id = s.run_id AND w.rank = s.rank AND w.step = s.step
    GROUP BY s.run_id, s.step
    UNION ALL
    -- a run without steps: its whole device window
    SELECT run_id, NULL AS step, count(*) AS ranks, max(te - ts) AS step_time_ns, list(rank) AS rank_list
    FROM (SELECT run_id, rank, min(ts) AS ts, max(ts + dur) AS te FROM slices
          WHERE kind IN ('kernel', 'memcpy', 'memset') AND run_id NOT IN (SELECT run_id FROM steps)
          GROUP BY run_id, rank)
    GROUP BY run_id
), job AS (
    SELECT run_id, coalesce(COALESCE(getvariable('num_devices'), NULL), max(world_size), count(*)) AS devices
    FROM ranks GROUP BY run_id
), step_peaks AS (
    SELECT t.run_id, t.step, mode(p.device) AS device, d.dtype, avg(p.peak_flops_per_s) AS peak_flops_per_s,
        min(p.device_note) AS device_note
    FROM step_times t
    JOIN (SELECT r.run_id, coalesce(COALESCE(getvariable('dtype'), NULL), m.dtype, 'bf16') AS dtype
          FROM (SELECT DISTINCT run_id FROM step_times) r LEFT JOIN main_dtype m ON m.run_id = r.run_id) d
      ON d.run_id = t.run_id
    LEFT JOIN rank_device_peaks(device_key := COALESCE(getvariable('device'), NULL),
                                peak_flops := COALESCE(getvariable('peak_flops'), NULL)) p
      ON p.run_id = t.run_id AND list_contains(t.rank_list, p.rank) AND p.dtype = d.dtype
    GROUP BY t.run_id, t.step, d.dtype
), measured AS (
    SELECT t.run_id, t.step, t.ranks, t.step_time_ns, k.device, k.device_note, k.dtype, k.peak_flops_per_s, j.devices,
        -- as DOUBLE: 6 · parameters · tokens is far beyond 32-bit integers, as which small values arrive
        coalesce(CAST(COALESCE(getvariable('model_flops_per_step'), NULL) AS DOUBLE),
                 6.0 * CAST(COALESCE(getvariable('params'), NULL) AS DOUBLE)
                     * CAST(COALESCE(getvariable('tokens_per_step'), NULL) AS DOUBLE))
            AS model_flops,
        f.formula_flops, f.profiler_flops,
        CASE COALESCE(getvariable('flops_source'), 'auto')
            WHEN 'formula' THEN f.formula_flops
            WHEN 'profiler' THEN f.profiler_flops
            ELSE f.per_op_flops
        END AS hardware_flops
    FROM step_times t
    JOIN job j ON j.run_id = t.run_id
    JOIN step_peaks k ON k.run_id = t.run_id AND k.step IS NOT DISTINCT FROM t.step
    LEFT JOIN step_flops f ON f.run_id = t.run_id AND f.step IS NOT DISTINCT FROM t.step
), rated AS (
    SELECT *, mfu(model_flops, step_time_ns, devices, peak_flops_per_s) AS mfu,
        mfu(hardware_flops, step_time_ns, ranks, peak_flops_per_s) AS hfu
    FROM measured
)
SELECT run_id, step, ranks, step_time_ns, device, dtype, peak_flops_per_s, devices,
    CAST(model_flops AS DOUBLE) AS model_flops, mfu, formula_flops, profiler_flops, hardware_flops, hfu,
    CASE WHEN peak_flops_per_s IS NULL
              THEN coalesce(device_note, 'no ' || dtype || ' peak for ' || device || ' in device_peaks')
                   || ': give -p device= or -p peak_flops='
         WHEN mfu > 1 THEN peak_exceeded(mfu * peak_flops_per_s, peak_flops_per_s, 'FLOP/s per device',
                                         'MFU above 1: the model FLOPs, the step time or the peak is wrong')
         WHEN hfu > 1 THEN peak_exceeded(hfu * peak_flops_per_s, peak_flops_per_s, 'FLOP/s per device',
                                         'HFU above 1: the counted FLOPs, the step time or the peak is wrong')
    END AS warning
FROM rated
ORDER BY run_id, step;
