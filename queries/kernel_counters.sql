-- kernel_counters: Hardware counters of each profiled kernel (CUPTI profiler mode) with the operators that launched it (HTA's CUPTI counter analysis).
--
-- PyTorch's profiler in CUPTI range-profiling mode (experimental_config with profiler_metrics) writes one event of
-- category 'cuda_profiler_range' per kernel with the counters as arguments, but no correlation id. As HTA does,
-- the n-th such event (in time order) is the kernel of the rank's n-th cudaLaunchKernel call; when the two counts
-- differ the pairing is unknown and the rank has no rows. op_stack lists the operators enclosing that launch,
-- outermost first (top_level_op, bottom_level_op: its ends). sass_flops counts floating-point work from the SASS
-- instruction counters when they were collected: fma counts 2, add and mul 1, for half, single and double
-- precision (HTA's rule; per-thread instruction counts, so predicated-off lanes are excluded). Equal to HTA 0.5's
-- get_cupti_counter_data_with_operators on HTA's test trace.
--
-- Needs: CUPTI profiler-range events (category cuda_profiler_range) and cudaLaunchKernel calls
-- Columns:
--   run_id           VARCHAR    run
--   rank             INTEGER    rank
--   kernel_index     BIGINT     0-based position of the kernel among the rank's profiled kernels
--   name             VARCHAR    kernel name
--   ts               BIGINT     start of its launch call (the counter event's own time is the profiler's range)
--   launch_id        BIGINT     slice_id of its cudaLaunchKernel call
--   top_level_op     VARCHAR    outermost operator enclosing the launch (NULL when none)
--   bottom_level_op  VARCHAR    innermost operator enclosing the launch
--   op_stack         VARCHAR[]  every enclosing operator, outermost first
--   sass_flops       DOUBLE     floating-point operations from the SASS counters (NULL when none were collected)
--   counters         JSON       every counter the profiler recorded for the kernel
WITH RECURSIVE ranges AS (
    SELECT run_id, rank, name, args,
           row_number() OVER (PARTITION BY run_id, rank ORDER BY ts, slice_id) - 1 AS kernel_index
    FROM slices WHERE category = 'cuda_profiler_range'
), launches AS (
    SELECT run_id, rank, slice_id, ts, op_id,
           row_number() OVER (PARTITION BY run_id, rank ORDER BY ts, slice_id) - 1 AS kernel_index
    FROM slices WHERE kind = 'runtime' AND starts_with(name, 'cudaLaunchKernel')
        AND rank IN (SELECT rank FROM slices WHERE category = 'cuda_profiler_range')
), paired AS (
    -- only ranks where both counts agree (HTA's condition)
    SELECT r.*, l.slice_id AS launch_id, l.ts, l.op_id
    FROM ranges r
    JOIN launches l ON l.run_id = r.run_id AND l.rank = r.rank AND l.kernel_index = r.kernel_index
    WHERE (SELECT count(*) FROM ranges x WHERE x.run_id = r.run_id AND x.rank = r.rank)
        = (SELECT count(*) FROM launches x WHERE x.run_id = r.run_id AND x.rank = r.rank)
), stack AS (
    SELECT p.run_id, p.rank, p.kernel_index, o.op_id, o.parent_op_id, o.name, o.op_depth
    FROM paired p JOIN ops o ON o.run_id = p.run_id AND o.rank = p.rank AND o.op_id = p.op_id
    UNION ALL
    SELECT s.run_id, s.rank, s.kernel_index, o.op_id, o.parent_op_id, o.name, o.op_depth
    FROM stack s JOIN ops o ON o.run_id = s.run_id AND o.rank = s.rank AND o.op_id = s.parent_op_id
), stacks AS (
    SELECT run_id, rank, kernel_index, list(name ORDER BY op_depth) AS op_stack FROM stack GROUP BY ALL
), sass AS (
    -- HTA's nine SASS instruction counters (half, single, double precision: fma, mul, add)
    SELECT run_id, rank, kernel_index,
           CASE WHEN contains(CAST(args AS VARCHAR), 'smsp__sass_thread_inst_executed_op_') THEN
               2 * COALESCE(TRY_CAST(json_extract(args, '$."smsp__sass_thread_inst_executed_op_hfma_pred_on.sum"') AS DOUBLE), 0)
             + 1 * COALESCE(TRY_CAST(json_extract(args, '$."smsp__sass_thread_inst_executed_op_hmul_pred_on.sum"') AS DOUBLE), 0)
             + 1 * COALESCE(TRY_CAST(json_extract(args, '$."smsp__sass_thread_inst_executed_op_hadd_pred_on.sum"') AS DOUBLE), 0)
             + 2 * COALESCE(TRY_CAST(json_extract(args, '$."smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"') AS DOUBLE), 0)
             + 1 * COALESCE(TRY_CAST(json_extract(args, '$."smsp__sass_thread_inst_executed_op_fmul_pred_on.sum"') AS DOUBLE), 0)
             + 1 * COALESCE(TRY_CAST(json_extract(args, '$."smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"') AS DOUBLE), 0)
             + 2 * COALESCE(TRY_CAST(json_extract(args, '$."smsp__sass_thread_inst_executed_op_dfma_pred_on.sum"') AS DOUBLE), 0)
             + 1 * COALESCE(TRY_CAST(json_extract(args, '$."smsp__sass_thread_inst_executed_op_dmul_pred_on.sum"') AS DOUBLE), 0)
             + 1 * COALESCE(TRY_CAST(json_extract(args, '$."smsp__sass_thread_inst_executed_op_dadd_pred_on.sum"') AS DOUBLE), 0)
           END AS sass_flops
    FROM paired
)
SELECT p.run_id, p.rank, p.kernel_index, p.name, p.ts, p.launch_id,
       s.op_stack[1] AS top_level_op, s.op_stack[-1] AS bottom_level_op, COALESCE(s.op_stack, []) AS op_stack,
       f.sass_flops, p.args AS counters
FROM paired p
LEFT JOIN stacks s ON s.run_id = p.run_id AND s.rank = p.rank AND s.kernel_index = p.kernel_index
LEFT JOIN sass f ON f.run_id = p.run_id AND f.rank = p.rank AND f.kernel_index = p.kernel_index
ORDER BY p.run_id, p.rank, p.kernel_index
