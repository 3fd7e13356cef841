-- xla_breakdown: The XLA profile overview: device time, share and count of ops by category, named scope, pass (forward / backward / remat), program or op.
--
-- Every device event (kernels, copies, memsets; on TPU and CPU the XLA ops themselves) counts once with its
-- duration, as XProf's op profile sums op time: the rows of one dimension add up to the device time of the run
-- (per = 'run') or of each step (per = 'step': the events the step ran, `slices.step`). Device work that no XLA
-- op ran (runtime copies, kernels of other libraries) is the key '(not an XLA op)'; XLA ops whose program has no
-- HLO in the profile are '(no HLO)' except by op; ops without a framework path '(no op_name)' / '(no scope)'. The pass and the scope come from the op's
-- framework path (`xla_ops.op_name`, see xla_pass() and xla_scope() in tracesql/functions/60_xla.sql); the
-- category is XProf's (`xla_ops.category`); compute_ns / communication_ns / memory_ns split the row's time by the
-- kernel class of its events (infeed/outfeed counts as memory), so a pass shows how much of it is collectives.
--
-- Needs: XLA ops (a JAX / TensorFlow / XLA profile)
-- Parameters:
--   dimensions = 'category,pass'   list of category, scope, pass, program, op: what to group by, comma-separated
--   per = 'run'                    one of run, step: one breakdown per run, or one per step
--   scope_depth = NULL             integer >= 1: named scope: keep the first N components of the path (NULL: all)
--   top = 50                       integer >= 1: rows per dimension (and step), by device time
-- Columns:
--   run_id           VARCHAR   run
--   step             INTEGER   step (NULL with per = 'run')
--   dimension        VARCHAR   category, scope, pass, program or op
--   key              VARCHAR   the category, scope, pass, program (module name) or op name
--   ops              BIGINT    device events
--   device_ns        BIGINT    their summed duration
--   compute_ns       BIGINT    of which events of class compute
--   communication_ns BIGINT    of which events of class communication
--   memory_ns        BIGINT    of which events of class memory or infeed_outfeed
--   share            DOUBLE    device_ns / the device time of the run or step (rows of a dimension sum to 1)
--   total_device_ns  BIGINT    the device time of the run or step
--   flops            DOUBLE    FLOPs of the XLA ops in the row (NULL: none known)
--   ranks            BIGINT    ranks with events in the row
WITH dims AS (
    SELECT trim(unnest(string_split(COALESCE(getvariable('dimensions'), 'category,pass'), ','))) AS dimension
), work AS (
    SELECT a.run_id, a.rank, CASE WHEN COALESCE(getvariable('per'), 'run') = 'step' THEN a.step END AS step,
        a.dur, a.class, o.op_id IS NOT NULL AS xla, o.name AS op, x.module, x.category, x.op_name,
        -- an op's FLOPs once per execution: on the first of its kernels
        CASE WHEN a.slice_id = min(a.slice_id) OVER (PARTITION BY a.run_id, a.rank, o.op_id) THEN o.flops END
            AS flops
    FROM device_activity() a
    LEFT JOIN ops o ON o.run_id = a.run_id AND o.rank = a.rank AND o.op_id = a.op_id AND o.program_id IS NOT NULL
    LEFT JOIN xla_ops x ON x.run_id = o.run_id AND x.rank = o.rank AND x.program_id = o.program_id
                       AND x.name = o.name
    WHERE COALESCE(getvariable('per'), 'run') = 'run' OR a.step IS NOT NULL
), keyed AS (
    SELECT w.*, d.dimension,
        CASE WHEN NOT w.xla THEN '(not an XLA op)'
             WHEN d.dimension = 'op' THEN w.op
             WHEN d.dimension = 'program' THEN w.module
             WHEN d.dimension = 'category' THEN w.category
             WHEN w.module IS NULL THEN '(no HLO)'
             WHEN d.dimension = 'pass' THEN COALESCE(xla_pass(w.op_name, name := w.op), '(no op_name)')
             WHEN d.dimension = 'scope'
                 THEN COALESCE(xla_scope(w.op_name, depth := COALESCE(getvariable('scope_depth'), NULL)),
                               '(no scope)')
        END AS key
    FROM work w CROSS JOIN dims d
), grouped AS (
    SELECT run_id, step, dimension, key, count(*) AS ops, CAST(sum(dur) AS BIGINT) AS device_ns,
        CAST(COALESCE(sum(dur) FILTER (WHERE class = 'compute'), 0) AS BIGINT) AS compute_ns,
        CAST(COALESCE(sum(dur) FILTER (WHERE class = 'communication'), 0) AS BIGINT) AS communication_ns,
        CAST(COALESCE(sum(dur) FILTER (WHERE class IN ('memory', 'infeed_outfeed')), 0) AS BIGINT) AS memory_ns, sum(flops) AS flops, count(DISTINCT rank) AS ranks
    FROM keyed GROUP BY run_id, step, dimension, key
), ranked AS (
    SELECT *, sum(device_ns) OVER (PARTITION BY run_id, step, dimension) AS total,
        row_number() OVER (PARTITION BY run_id, step, dimension ORDER BY device_ns DESC, key) AS row_in_dimension
    FROM grouped
)
SELECT run_id, step, dimension, key, ops, device_ns, compute_ns, communication_ns, memory_ns,
    CASE WHEN total > 0 THEN device_ns / total END AS share, CAST(total AS BIGINT) AS total_device_ns, flops, ranks
FROM ranked
WHERE row_in_dimension <= COALESCE(getvariable('top'), 50)
ORDER BY run_id, step NULLS FIRST, dimension, row_in_dimension;
