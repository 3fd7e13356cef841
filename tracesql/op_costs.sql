-- The `op_costs` table of a run (tracesql/schema.py), worked out once when the run is ingested
-- (ingestion._write_op_costs) over the run's ops, slices and xla_ops, by the formulas of
-- tracesql/functions/30_flops.sql: each distinct call (name, shapes, dtypes, scalar arguments) costed once, in
-- both attention conventions, and joined back to its ops. Queries read the numbers (op_costs()) instead of
-- expanding the formulas into every query that costs ops.
--
-- One row per op: its FLOPs and bytes, and whether it is *counted*: the ops whose FLOPs and bytes add up without
-- double counting. Wrappers record their inner ops too (aten::linear → aten::addmm, conv2d → convolution →
-- _convolution → cudnn_convolution, scaled_dot_product_attention → _scaled_dot_product_flash_attention,
-- layer_norm → native_layer_norm, to → _to_copy → copy_, mean → sum + div_), so:
-- - a GEMM/conv/attention op ("math") is counted when no math op is nested in it: the innermost one, whose
--   shapes are the ones the kernel ran with;
-- - any other op with a formula is counted when no math op is nested in it and it is not nested in a counted
--   math op (the bias copy inside addmm is part of that op's work) nor in another such op (the outermost one:
--   mean, not the sum and div_ it runs on CPU; add_, not the copy_ of the Python scalar it converts first).
--   A softmax inside an unfused attention whose matmuls are counted is counted too.
-- - views and allocations (family 'view', 0 FLOPs and 0 bytes) are never counted, nor are ops without formula.
-- Nesting is interval containment on the op's thread (with a smaller op_depth), so it needs no parent links.
-- An op whose formula applies but whose shapes were not recorded has NULL flops and counts as having no formula.
-- XLA ops (family 'xla') take their FLOPs and bytes from `ops.flops` / `ops.bytes_accessed` (xla_ops) and are
-- counted: one row per execution of an HLO op, none inside another; but an asynchronous pair (copy-start /
-- copy-done, all-reduce-start / -done, collective-permute-start / -done, send / send-done, async-start / -done,
-- ...: xla_ops.async_start) is one piece of work, which XLA's cost analysis gives to both halves: it is costed once,
-- at its -start, and the -done (the wait for it) is not counted. Where the halves are device events (TPU ops),
-- the -start's device time is the pair's async span, from its start to the end of the first execution of its
-- -done on the same device lane after it: the 1-2 µs of the start op alone would credit it with moving gigabytes
-- at petabytes per second (a TPU copy-start of 5.37 GB: 56,441,433 % of the roofline).
WITH RECURSIVE async_done AS (
    SELECT d.run_id, d.rank, d.program_id, x.async_start AS name, d.pid, d.tid, d.ts, d.ts + d.dur AS te
    FROM ops d
    JOIN xla_ops x ON x.run_id = d.run_id AND x.rank = d.rank AND x.program_id = d.program_id AND x.name = d.name
    JOIN slices s ON s.run_id = d.run_id AND s.rank = d.rank AND s.slice_id = d.op_id
    WHERE x.async_start IS NOT NULL AND s.kind IN ('kernel', 'memcpy', 'memset')
), async_span AS (
    -- to the end of the first -done on the pair's lane at or after the -start (a join and arg_min, not an ASOF
    -- join: Spark has none)
    SELECT o.run_id, o.rank, o.op_id, arg_min(d.te, d.ts) - o.ts AS span_ns
    FROM (SELECT o.* FROM ops o JOIN slices s ON s.run_id = o.run_id AND s.rank = o.rank AND s.slice_id = o.op_id
          WHERE o.program_id IS NOT NULL AND s.kind IN ('kernel', 'memcpy', 'memset')) o
    JOIN async_done d ON d.run_id = o.run_id AND d.rank = o.rank AND d.program_id = o.program_id
     AND d.name = o.name AND d.pid = o.pid AND d.tid = o.tid AND d.ts >= o.ts
    GROUP BY o.run_id, o.rank, o.op_id, o.ts
), serving_ops AS (
    -- serving engines' MoE and attention ops, whose formulas read what their arguments lack from around them
    -- (30_flops.sql, serving_op_kind)
    SELECT run_id, rank, op_id, ts, serving_op_kind(name) AS kind FROM ops
    WHERE program_id IS NULL AND serving_op_kind(name) IS NOT NULL
), moe_tree AS (  -- each MoE op and the ops nested in it (node), down the parent links
    SELECT run_id, rank, op_id, op_id AS node FROM serving_ops WHERE kind = 'moe'
    UNION ALL
    SELECT t.run_id, t.rank, t.op_id, o.op_id
    FROM moe_tree t JOIN ops o ON o.run_id = t.run_id AND o.rank = t.rank AND o.parent_op_id = t.node
), moe_allocs AS (
    -- the buffers a MoE op allocates, in order: the aten::empty calls in it or in the ops it calls (Triton
    -- matmul_ogs' TopK allocates the [T, k] ones), their size and c10::ScalarType code (Kineto's first two
    -- Concrete Inputs)
    SELECT t.run_id, t.rank, t.op_id,
        list([c.concrete_inputs[1], c.concrete_inputs[2]] ORDER BY c.ts, c.op_id) AS calls
    FROM moe_tree t JOIN ops c ON c.run_id = t.run_id AND c.rank = t.rank AND c.op_id = t.node
    WHERE c.name = 'aten::empty'
    GROUP BY t.run_id, t.rank, t.op_id
    UNION ALL
    -- a graph replay's copy of the op, which has no such calls (only the capture's ops that launched kernels are
    -- copied), carries those of its capture in its args (readers/graph_capture.py)
    SELECT s.run_id, s.rank, s.op_id, CAST(json_extract(m.args, '$.graph_capture_allocations') AS VARCHAR[][])
    FROM serving_ops s JOIN slices m ON m.run_id = s.run_id AND m.rank = s.rank AND m.slice_id = s.op_id
    WHERE s.kind = 'moe' AND json_extract(m.args, '$.graph_capture_allocations') IS NOT NULL
), moe_kernels AS (
    -- the names of the kernels a MoE op launched: its kernels', or, in a graph capture (kernels captured, not
    -- run), its launches' `kernel` argument
    SELECT s.run_id, s.rank, s.op_id, string_agg(DISTINCT k.kernel, ' ' ORDER BY k.kernel) AS kernels
    FROM serving_ops s
    JOIN slices l ON l.run_id = s.run_id AND l.rank = s.rank AND l.op_id = s.op_id
     AND l.kind IN ('kernel', 'runtime', 'driver'),
    LATERAL (SELECT CASE WHEN l.kind = 'kernel' THEN l.name ELSE l.args->>'kernel' END AS kernel) k
    WHERE s.kind = 'moe'
    GROUP BY s.run_id, s.rank, s.op_id
), batch_steps AS (  -- the engine's annotation of each step's batch (30_flops.sql, attention_batch)
    SELECT run_id, rank, ts, ts + dur AS te, name FROM slices
    WHERE kind = 'user_annotation' AND starts_with(name, 'execute_')
      AND regexp_matches(name, '_context_[0-9]+\(.*\)_generation_[0-9]+\(.*\)$')
), attention_anchors AS (
    -- where an attention op ran on the host: its start, and its kernels' launches (a graph replay's op, copied
    -- from the capture trace, sits at its kernels' device time, after the step's host annotation: its kernels'
    -- launch is the graph launch, in it)
    SELECT run_id, rank, op_id, ts FROM serving_ops WHERE kind = 'paged_attention'
    UNION ALL
    SELECT s.run_id, s.rank, s.op_id, k.launch_ts
    FROM serving_ops s
    JOIN slices k ON k.run_id = s.run_id AND k.rank = s.rank AND k.op_id = s.op_id AND k.kind = 'kernel'
    WHERE s.kind = 'paged_attention' AND k.launch_ts IS NOT NULL
), attention_batches AS (  -- an attention op's step: the innermost such annotation around it
    SELECT s.run_id, s.rank, s.op_id, arg_max(b.name, b.ts) AS batch
    FROM attention_anchors s
    JOIN batch_steps b ON b.run_id = s.run_id AND b.rank = s.rank AND s.ts >= b.ts AND s.ts < b.te
    GROUP BY s.run_id, s.rank, s.op_id
), serving_context AS (
    SELECT s.run_id, s.rank, s.op_id,
        CAST({'allocs': list_transform(a.calls, lambda c: {'shape': TRY_CAST(c[1] AS BIGINT[]),
                                                           'dtype': TRY_CAST(c[2] AS INTEGER)}),
              'kernels': k.kernels, 'batch': b.batch}
             AS STRUCT(allocs STRUCT(shape BIGINT[], dtype INTEGER)[], kernels VARCHAR, batch VARCHAR)) AS x
    FROM serving_ops s
    LEFT JOIN moe_allocs a ON a.run_id = s.run_id AND a.rank = s.rank AND a.op_id = s.op_id
    LEFT JOIN moe_kernels k ON k.run_id = s.run_id AND k.rank = s.rank AND k.op_id = s.op_id
    LEFT JOIN attention_batches b ON b.run_id = s.run_id AND b.rank = s.rank AND b.op_id = s.op_id
), contexts AS (  -- every op, with what its formula reads around it (NULL for all but serving_ops)
    SELECT o.*, sc.x FROM ops o
    LEFT JOIN serving_context sc ON sc.run_id = o.run_id AND sc.rank = o.rank AND sc.op_id = o.op_id
), signatures AS (
    -- the formulas once per distinct call (name, shapes, dtypes, scalar arguments: a few hundred in a run of
    -- millions of ops), joined back to the ops below. (No column here is named as a macro is, op_flops or
    -- op_bytes: the ingest creates the macros whose names this file's words are, and those two took 80 ms.)
    SELECT name, input_dims, input_types, concrete_inputs, x, coalesce(k.family, serving_op_family(name)) AS family,
        coalesce(conventions[1], sv.flash) AS flops, coalesce(conventions[2], sv.torch) AS torch_flops,
        coalesce(typed_op_bytes(k, input_dims, input_types, concrete_inputs, a), sv.bytes) AS bytes,
        coalesce(serving_op_dtype(name, x), op_dtype(input_types)) AS dtype
    -- the FLOPs in both attention conventions from one use of the formulas (a macro is expanded, bound and
    -- optimized at each use: typed_op_flops is a third of the formulas' planning)
    FROM (SELECT *, list_transform(['flash', 'torch'], lambda convention:
                        typed_op_flops(k, input_dims, input_types, concrete_inputs, a, convention)) AS conventions
    FROM (SELECT c.*, s.x, serving_op_cost(c.name, c.input_dims, c.a, s.x) AS sv
          FROM op_calls() c
          JOIN (SELECT DISTINCT name, input_dims, input_types, concrete_inputs, x FROM contexts
                WHERE program_id IS NULL) s
            ON s.name IS NOT DISTINCT FROM c.name AND s.input_dims IS NOT DISTINCT FROM c.input_dims
           AND s.input_types IS NOT DISTINCT FROM c.input_types
           AND s.concrete_inputs IS NOT DISTINCT FROM c.concrete_inputs))
), costed AS (
    SELECT o.run_id, o.rank, o.op_id, o.name, o.step, o.pid, o.tid, o.ts, o.dur, o.op_depth, o.input_dims,
        o.input_types, COALESCE(a.span_ns, o.device_total_ns) AS device_total_ns, o.flops AS profiler_flops,
        x.async_start IS NOT NULL AS async_done,
        -- XLA ops (program_id set) carry XLA's own FLOPs and bytes (cost analysis, or counted from the HLO)
        CASE WHEN o.program_id IS NOT NULL THEN 'xla' ELSE s.family END AS family,
        CASE WHEN o.program_id IS NOT NULL THEN o.flops ELSE s.flops END AS flops,
        CASE WHEN o.program_id IS NOT NULL THEN o.flops ELSE s.torch_flops END AS torch_flops,
        CASE WHEN o.program_id IS NOT NULL THEN o.bytes_accessed ELSE s.bytes END AS bytes,
        CASE WHEN o.program_id IS NOT NULL THEN op_dtype(o.input_types) ELSE s.dtype END AS dtype
    FROM contexts o
    LEFT JOIN async_span a ON a.run_id = o.run_id AND a.rank = o.rank AND a.op_id = o.op_id
    LEFT JOIN xla_ops x ON o.program_id IS NOT NULL AND x.run_id = o.run_id AND x.rank = o.rank
     AND x.program_id = o.program_id AND x.name = o.name
    LEFT JOIN signatures s ON o.program_id IS NULL AND s.name IS NOT DISTINCT FROM o.name
     AND s.input_dims IS NOT DISTINCT FROM o.input_dims AND s.input_types IS NOT DISTINCT FROM o.input_types
     AND s.concrete_inputs IS NOT DISTINCT FROM o.concrete_inputs AND s.x IS NOT DISTINCT FROM o.x
), formula AS (
    SELECT * FROM costed WHERE flops IS NOT NULL AND family NOT IN ('xla', 'view')  -- XLA ops never nest
), lanes AS (
    -- each thread's time cut into buckets about one op apart (its formula ops' span over their count) ...
    SELECT run_id, rank, pid, tid, min(ts) AS t0, greatest((max(ts + dur) - min(ts)) // count(*), 1) AS width
    FROM formula
    GROUP BY run_id, rank, pid, tid
), placed AS (
    SELECT f.run_id, f.rank, f.pid, f.tid, f.op_id, f.family, f.ts, f.ts + f.dur AS te, f.op_depth,
        (f.ts - l.t0) // l.width AS first_bucket, (f.ts + f.dur - l.t0) // l.width AS last_bucket
    FROM formula f
    JOIN lanes l ON l.run_id = f.run_id AND l.rank = f.rank AND l.pid = f.pid AND l.tid = f.tid
), links AS (
    -- (outer, inner) pairs of ops with a formula where the outer one encloses the inner one: ... and an op
    -- compared only with the ops that span its start's bucket (an op with every op of its thread would grow with
    -- the square of the trace); the inner one starts inside the outer one, so the pair meets in exactly one bucket
    SELECT i.run_id, i.rank, i.op_id AS inner_id, i.family AS inner_family,
        o.op_id AS outer_id, o.family AS outer_family
    FROM placed i
    JOIN (SELECT p.*, b.bucket FROM placed p, range(p.first_bucket, p.last_bucket + 1) b(bucket)) o
      ON o.run_id = i.run_id AND o.rank = i.rank AND o.pid = i.pid AND o.tid = i.tid AND o.bucket = i.first_bucket
     AND o.ts <= i.ts AND o.te >= i.te AND o.op_depth < i.op_depth
), math_inside AS (  -- ops with a GEMM/conv/attention op nested in them
    SELECT DISTINCT run_id, rank, outer_id AS op_id FROM links WHERE inner_family IN ('gemm', 'conv', 'attention')
), shadowed AS (
    -- other ops nested in an op that is counted for them: a math op with no math inside (counted), or an
    -- op of another family with no math inside
    SELECT DISTINCT l.run_id, l.rank, l.inner_id AS op_id
    FROM links l
    LEFT JOIN math_inside m ON m.run_id = l.run_id AND m.rank = l.rank AND m.op_id = l.outer_id
    WHERE l.inner_family NOT IN ('gemm', 'conv', 'attention') AND m.op_id IS NULL
), op_rows AS (
    SELECT c.run_id, c.rank, c.op_id, c.family, c.dtype, c.flops, c.torch_flops, c.bytes, c.device_total_ns,
        c.flops IS NOT NULL AND CASE
            WHEN c.family = 'view' THEN false
            WHEN c.family = 'xla' THEN NOT c.async_done
            ELSE m.op_id IS NULL AND (c.family IN ('gemm', 'conv', 'attention') OR s.op_id IS NULL)
        END AS counted,
        CASE WHEN c.flops IS NULL THEN NULL WHEN c.family = 'xla' THEN 'xla' ELSE 'formula' END AS cost_source,
        CAST(NULL AS BIGINT) AS cost_op_id
    FROM costed c
    LEFT JOIN math_inside m ON m.run_id = c.run_id AND m.rank = c.rank AND m.op_id = c.op_id
    LEFT JOIN shadowed s ON s.run_id = c.run_id AND s.rank = c.rank AND s.op_id = c.op_id
), covered AS (  -- each counted op and the ops nested in it, with the counted op (counted ops never nest)
    SELECT run_id, rank, op_id, op_id AS cost_op_id FROM op_rows WHERE counted
    UNION ALL
    SELECT o.run_id, o.rank, o.op_id, c.cost_op_id
    FROM covered c JOIN ops o ON o.run_id = c.run_id AND o.rank = c.rank AND o.parent_op_id = c.op_id
), launched_names AS (
    -- the names of the kernels whose launch is in the trace, per rank: a kernel with no launch is costed from, and
    -- aligned on, identical kernels only, so one of another name is left out of the work below (its position, of
    -- a few columns, is still counted)
    SELECT DISTINCT run_id, rank, name FROM slices WHERE kind = 'kernel' AND (op_id IS NOT NULL OR launch_id IS NOT NULL)
), kernel_positions AS (
    -- each kernel's place in its stream's order of the launchless kernels (or of the launched ones), and the
    -- counted op whose cost covers it: over these few columns alone, not the kernels' names and args (200,000
    -- launchless kernels of 700-byte name and args, sorted by the window and held in a join's hash table with
    -- them: 587 MB)
    SELECT k.run_id, k.rank, k.slice_id,
        row_number() OVER (PARTITION BY k.run_id, k.rank, k.stream, k.op_id IS NULL AND k.launch_id IS NULL
                           ORDER BY k.ts, k.slice_id) AS position,
        v.cost_op_id
    FROM slices k
    LEFT JOIN covered v ON v.run_id = k.run_id AND v.rank = k.rank AND v.op_id = k.op_id
    WHERE k.kind = 'kernel'
), kernel_launches AS (
    -- device kernels and what identifies their launch: the kernel and its launch configuration (grid, block,
    -- registers, shared memory: as Kineto records them); a kernel whose launch is not in the trace (no launch, no
    -- op: not a graph replay, whose launch is there) is launchless
    SELECT k.run_id, k.rank, k.slice_id, k.op_id, k.stream, k.dur, k.launch, k.launchless, p.position, p.cost_op_id
    FROM (SELECT run_id, rank, slice_id, op_id, stream, dur,
              {'name': name, 'grid': args->>'grid', 'block': args->>'block',
               'registers': args->>'registers per thread', 'shared_memory': args->>'shared memory'} AS launch,
              op_id IS NULL AND launch_id IS NULL AS launchless
          FROM slices
          WHERE kind = 'kernel' AND (op_id IS NOT NULL OR launch_id IS NOT NULL
                                     OR (run_id, rank, name) IN (SELECT run_id, rank, name FROM launched_names))) k
    JOIN kernel_positions p ON p.run_id = k.run_id AND p.rank = k.rank AND p.slice_id = k.slice_id
), single_kernel_ops AS (  -- counted ops whose device work is one kernel: its cost is that kernel's
    SELECT run_id, rank, cost_op_id FROM kernel_launches WHERE cost_op_id IS NOT NULL
    GROUP BY run_id, rank, cost_op_id HAVING count(*) = 1
), launched_costs AS (
    -- each launched kernel with the cost of its op when that cost is the one kernel's (cost NULL: the op has none,
    -- or its cost covers other kernels too)
    SELECT l.run_id, l.rank, l.op_id, l.stream, l.position, l.launch, one.cost_op_id,
        CASE WHEN one.cost_op_id IS NOT NULL THEN {'name': o.name, 'family': r.family, 'dtype': r.dtype,
            'flops': r.flops, 'torch_flops': r.torch_flops, 'bytes': r.bytes} END AS cost
    FROM kernel_launches l
    LEFT JOIN single_kernel_ops one ON one.run_id = l.run_id AND one.rank = l.rank AND one.cost_op_id = l.cost_op_id
    LEFT JOIN op_rows r ON r.run_id = l.run_id AND r.rank = l.rank AND r.op_id = one.cost_op_id
    LEFT JOIN ops o ON o.run_id = l.run_id AND o.rank = l.rank AND o.op_id = one.cost_op_id
    WHERE NOT l.launchless
), identical_costs AS (  -- per launch identity, the costs of the ops that launched such a kernel
    SELECT run_id, rank, launch, count(DISTINCT cost) AS costs, count(*) FILTER (WHERE cost IS NULL) AS without_cost,
        min(cost_op_id) AS cost_op_id
    FROM launched_costs
    WHERE op_id IS NOT NULL
    GROUP BY run_id, rank, launch
), shifts AS (
    -- the launchless kernels of a stream are the tail of the iteration before the profile (they ran before its
    -- first host event), and the traced iterations launch the same sequence again: each shift of the launchless
    -- sequence along the launched one, with how many kernels it lines up with identical kernels
    SELECT t.run_id, t.rank, t.stream, l.position - t.position AS shift, count(*) AS matched
    FROM kernel_launches t
    JOIN launched_costs l ON l.run_id = t.run_id AND l.rank = t.rank AND l.stream IS NOT DISTINCT FROM t.stream
     AND l.launch = t.launch
    WHERE t.launchless
    GROUP BY t.run_id, t.rank, t.stream, shift
), best_shifts AS (  -- the shifts that line up the most kernels (one per traced iteration that repeats the tail)
    SELECT run_id, rank, stream, shift FROM shifts
    QUALIFY matched = max(matched) OVER (PARTITION BY run_id, rank, stream)
), aligned_costs AS (
    -- per launchless kernel, the costs of the ops that launched the identical kernels at its place in the best
    -- shifts (no identical kernel there in one of them: without cost)
    SELECT t.run_id, t.rank, t.slice_id, count(DISTINCT l.cost) AS costs,
        count(*) FILTER (WHERE l.cost IS NULL) AS without_cost, min(l.cost_op_id) AS cost_op_id
    FROM kernel_launches t
    JOIN best_shifts b ON b.run_id = t.run_id AND b.rank = t.rank AND b.stream IS NOT DISTINCT FROM t.stream
    LEFT JOIN launched_costs l ON l.run_id = t.run_id AND l.rank = t.rank AND l.stream IS NOT DISTINCT FROM t.stream
     AND l.position = t.position + b.shift AND l.launch = t.launch
    WHERE t.launchless
    GROUP BY t.run_id, t.rank, t.slice_id
), kernel_rows AS (
    -- a launchless kernel takes the cost of the ops that launched identical kernels on its rank when they all have
    -- the same cost (cost_source 'identical kernel'); when they differ, the cost of the ops that launched the
    -- identical kernels at its place in the traced iterations' sequence, when those agree (cost_source 'aligned
    -- kernel'); else it stays without cost, and its row says why (flops NULL)
    SELECT k.run_id, k.rank, k.slice_id AS op_id, r.family, r.dtype, r.flops, r.torch_flops, r.bytes,
        k.dur AS device_total_ns, r.op_id IS NOT NULL AS counted,
        CASE WHEN i.costs = 1 AND i.without_cost = 0 OR r.op_id IS NULL THEN 'identical kernel'
             ELSE 'aligned kernel' END AS cost_source, r.op_id AS cost_op_id
    FROM kernel_launches k
    JOIN identical_costs i ON i.run_id = k.run_id AND i.rank = k.rank AND i.launch = k.launch
    LEFT JOIN aligned_costs a ON a.run_id = k.run_id AND a.rank = k.rank AND a.slice_id = k.slice_id
    LEFT JOIN op_rows r ON r.run_id = k.run_id AND r.rank = k.rank AND r.op_id = CASE
        WHEN i.costs = 1 AND i.without_cost = 0 THEN i.cost_op_id
        WHEN a.costs = 1 AND a.without_cost = 0 THEN a.cost_op_id END
    WHERE k.launchless AND i.costs > 0
)
SELECT * FROM op_rows
UNION ALL
SELECT * FROM kernel_rows
