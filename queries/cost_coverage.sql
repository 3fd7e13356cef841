-- cost_coverage: How much of each rank's compute time the cost model rates: compute time under an op with FLOPs or bytes, and the largest part without.
--
-- The roofline, mfu's HFU and every "how far from the roof" verdict see only the ops that have a cost
-- (`op_costs()`: FLOPs or bytes from a formula, or XLA's cost analysis). A compute kernel (class 'compute' of
-- `kernel_classes`: not communication, not copies) is *costed* when the op that launched it (`slices.op_id`), or an
-- op it is nested in, is one that op_costs() counts; every other compute kernel is time the roofline cannot rate.
-- Times are summed kernel durations (concurrent streams add up), so that costed and uncosted time add up to
-- compute_ns. An uncosted kernel is named by the innermost op that launched it (vllm::moe_forward, aten::sort),
-- or by its own name when no op launched it or it is a CUDA/HIP-graph replay; `reason` says why it has no cost.
-- A kernel whose launch is not in the trace is costed when the ops that launched identical kernels (same name,
-- grid, block, registers, shared memory) on its rank all have the same cost (op_costs' cost_source
-- 'identical kernel'), or else when the ops that launched the identical kernels at its place in the traced
-- iterations' kernel sequence on its stream do (cost_source 'aligned kernel').
--
-- Needs: device kernels and ops with recorded shapes (record_shapes=True)
-- Parameters:
--   per = 'rank'                     one of rank, kernel: one row per run and rank, or one row per uncosted op (or kernel without op) and rank
--   top = 5                          integer >= 1: entries of top_uncosted (per = 'kernel': rows per rank)
--   attention_convention = 'flash'   one of flash, torch: as in roofline (which ops are costed does not depend on it)
-- Columns:
--   run_id         VARCHAR  run
--   rank           INTEGER  rank
--   name           VARCHAR  per = 'kernel': the uncosted op, or the kernel's name when no op launched it; NULL per rank
--   reason         VARCHAR  per = 'kernel', why no cost: 'no formula' (tracesql has none for the op), 'shapes not recorded' (the op's formula needs shapes or Scalar values (Concrete Inputs) the trace lacks, or the op takes a TensorList, whose tensors' shapes Kineto does not keep: aten::cat, _foreach_*, or aten::index's list of optional index tensors), 'not counted' (an op with math nested in it: its own kernels), 'graph replay' (a CUDA/HIP-graph replay whose capture trace was not given or did not match: docs/guides/serving.md), 'no launch recorded' (launched before the profile's host events began or by an untraced thread, and no costed op launched an identical kernel), 'identical kernels, different costs' (no launch recorded; the ops that launched identical kernels have different costs, or some none, and so do those at its place in the traced iterations' kernel sequence); NULL per rank
--   kernels        BIGINT   compute kernels of the rank (per = 'kernel': of that name)
--   compute_ns     BIGINT   summed duration of the rank's compute kernels
--   costed_ns      BIGINT   the part under a costed op (per = 'kernel': NULL)
--   uncosted_ns    BIGINT   compute_ns − costed_ns (per = 'kernel': that name's)
--   costed_pct     DOUBLE   costed_ns / compute_ns · 100, 2 decimals (per = 'kernel': NULL)
--   uncosted_pct   DOUBLE   uncosted_ns / compute_ns · 100, 2 decimals
--   top_uncosted      VARCHAR[]  the largest uncosted names (as `name` per kernel), largest first (per = 'kernel': NULL)
--   top_uncosted_ns   BIGINT[]   their uncosted time, in the same order (per = 'kernel': NULL)
WITH RECURSIVE covered AS (
    -- the costed ops and every op nested in them (costed ops never nest in each other: op_costs). The ops whose
    -- parent is covered by a semi-join, whose hash table is built on the few covered ops of the last round: a
    -- join built one on all the ops in every round, also when no op is costed (then no op is read at all)
    SELECT run_id, rank, op_id FROM op_costs WHERE counted
    UNION ALL
    SELECT o.run_id, o.rank, o.op_id
    FROM ops o WHERE (o.run_id, o.rank, o.parent_op_id) IN (SELECT run_id, rank, op_id FROM covered)
), compute AS (
    SELECT k.run_id, k.rank, k.dur,
        -- an XLA op on a TPU/CPU is its own device event (op_id = slice_id), as is a kernel with no launch that
        -- op_costs costs (kernel rows: op_id = its slice_id). (A semi-join, whose hash table is the few covered
        -- ops: as a LEFT JOIN, DuckDB built it on every kernel with its columns, a quarter of the query at 24x)
        COALESCE((k.run_id, k.rank, k.op_id) IN (SELECT run_id, rank, op_id FROM covered), false)
            OR COALESCE(s.counted, false) AS costed,
        -- a graph replay's kernels that kept the graph launch's op by their own names (that op ran none of them);
        -- those the capture trace attributed have the capture op copy as op (docs/guides/serving.md)
        CASE WHEN g.slice_id IS NOT NULL AND k.op_id IS NOT DISTINCT FROM g.op_id THEN k.name
             ELSE COALESCE(o.name, k.name) END AS name,
        CASE WHEN g.slice_id IS NOT NULL AND k.op_id IS NOT DISTINCT FROM g.op_id THEN 'graph replay'
             -- identical kernels (same name and launch configuration) were launched by ops of different costs, and
             -- its place in its stream's sequence does not say which
             WHEN o.op_id IS NULL AND s.cost_source IN ('identical kernel', 'aligned kernel')
                 THEN 'identical kernels, different costs'
             WHEN o.op_id IS NULL THEN 'no launch recorded'
             WHEN oc.op_id IS NULL THEN op_costs_missing(k.run_id)
             -- cat, stack, _foreach_*: Kineto keeps no shape of a TensorList's tensors, so no formula could cost it;
             -- nor of index's indices (a list of optional tensors, recorded with neither type nor shape), which
             -- set the rows it gathers
             WHEN oc.family IS NULL AND o.list_shapes THEN 'shapes not recorded'
             WHEN oc.family IS NULL THEN 'no formula'
             WHEN CASE WHEN COALESCE(getvariable('attention_convention'), 'flash') = 'flash' THEN oc.flops
                       ELSE oc.torch_flops END IS NULL THEN 'shapes not recorded'
             ELSE 'not counted' END AS reason
    FROM device_activity() k
    -- the op that launched the kernel (its name and shapes) and its cost (the tables op_costs() joins, read for
    -- the kernels' ops only)
    -- (list_shapes: the one fact of input_types the reason needs, so that the joins carry no list)
    LEFT JOIN (SELECT run_id, rank, op_id, name,
                   list_contains(input_types, 'TensorList') OR name = 'aten::index' AND input_types[2] = ''
                       AS list_shapes
               FROM ops) o ON o.run_id = k.run_id AND o.rank = k.rank AND o.op_id = k.op_id
    LEFT JOIN op_costs oc ON oc.run_id = k.run_id AND oc.rank = k.rank AND oc.op_id = k.op_id
    -- ... and the kernel's own row, where it has one (a kernel with no launch costed like its identical kernels;
    -- an XLA op's own row is its op's, above)
    LEFT JOIN (SELECT run_id, rank, op_id, counted, cost_source FROM op_costs
               WHERE cost_source IN ('identical kernel', 'aligned kernel')) s
      ON s.run_id = k.run_id AND s.rank = k.rank AND s.op_id = k.slice_id
    -- the graph launches alone, not every slice (a hash table of the millions of host calls was most of the time)
    LEFT JOIN (SELECT run_id, rank, slice_id, op_id FROM slices
               WHERE kind IN ('runtime', 'driver') AND name ILIKE '%GraphLaunch%') g
      ON g.run_id = k.run_id AND g.rank = k.rank AND g.slice_id = k.launch_id
    WHERE k.class = 'compute'
), kinds AS (
    -- the compute kernels by whether costed, name and reason: the ranks' totals and the uncosted names from one
    -- grouping of the kernels
    SELECT run_id, rank, costed, name, reason, count(*) AS kernels, sum(dur) AS dur
    FROM compute
    GROUP BY run_id, rank, costed, name, reason
), ranks AS (
    SELECT run_id, rank, CAST(sum(kernels) AS BIGINT) AS kernels, CAST(sum(dur) AS BIGINT) AS compute_ns,
        CAST(COALESCE(sum(dur) FILTER (WHERE costed), 0) AS BIGINT) AS costed_ns
    FROM kinds
    GROUP BY run_id, rank
), uncosted AS (
    SELECT run_id, rank, name, reason, kernels, CAST(dur AS BIGINT) AS uncosted_ns,
        row_number() OVER (PARTITION BY run_id, rank ORDER BY dur DESC, name, reason) AS nth
    FROM kinds
    WHERE NOT costed
)
SELECT r.run_id, r.rank, CAST(NULL AS VARCHAR) AS name, CAST(NULL AS VARCHAR) AS reason, r.kernels, r.compute_ns,
    r.costed_ns, r.compute_ns - r.costed_ns AS uncosted_ns,
    round(100.0 * r.costed_ns / r.compute_ns, 2) AS costed_pct,
    round(100.0 * (r.compute_ns - r.costed_ns) / r.compute_ns, 2) AS uncosted_pct,
    t.top_uncosted, t.top_uncosted_ns
FROM ranks r
LEFT JOIN (SELECT run_id, rank, list(name ORDER BY nth) AS top_uncosted, list(uncosted_ns ORDER BY nth) AS top_uncosted_ns
           FROM uncosted WHERE nth <= COALESCE(getvariable('top'), 5) GROUP BY run_id, rank) t
  ON t.run_id = r.run_id AND t.rank = r.rank
WHERE COALESCE(getvariable('per'), 'rank') = 'rank'
UNION ALL
SELECT u.run_id, u.rank, u.name, u.reason, u.kernels, r.compute_ns, NULL, u.uncosted_ns, NULL,
    round(100.0 * u.uncosted_ns / r.compute_ns, 2), NULL, NULL
FROM uncosted u JOIN ranks r ON r.run_id = u.run_id AND r.rank = u.rank
WHERE COALESCE(getvariable('per'), 'rank') = 'kernel' AND u.nth <= COALESCE(getvariable('top'), 5)
ORDER BY run_id, rank, uncosted_ns DESC, name;
