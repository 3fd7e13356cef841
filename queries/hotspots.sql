-- hotspots: The kernels and the ops that take the most device time, with their share and cumulative share.
--
-- One ranking per level named in `levels` (comma-separated), across all ranks of the run:
--   kernel         device events (kind kernel, memcpy, memset) by exact name;
--   kernel_family  the same grouped by kernel_family(name): template arguments, argument lists and launch-shape
--                  suffixes folded, so instantiations of one kernel rank together (variants = distinct names);
--   op             ops by name; device_ns = the device time of the kernels each call launched itself
--                  (`ops.device_self_ns`, so nested ops are not counted twice), inclusive_ns = with the kernels of
--                  nested ops (`ops.device_total_ns`; an op nested in an op of the same name counts in both);
--   op_args        ops by name and unique arguments (input shapes and types, in `args`).
-- Ops whose calls ran no device work at all are left out (a call whose device work rounds to 0 ns is kept). share = device_ns / all device time of the level;
-- cumulative_share adds the shares of the rows ranked above. Statistics are over single kernel executions (ops:
-- over calls).
--
-- Needs: device kernels (a GPU/accelerator trace)
-- Parameters:
--   top = 20            integer >= 1: rows per level
--   levels = 'kernel,op'   list of kernel, kernel_family, op, op_args: levels to list, comma-separated
-- Columns:
--   run_id            VARCHAR  run
--   level             VARCHAR  'kernel', 'kernel_family', 'op' or 'op_args'
--   rank_in_level     BIGINT   1 = the biggest
--   name              VARCHAR  kernel name, kernel family or op name
--   args              VARCHAR  op_args: the input shapes and types; NULL for the other levels
--   count             BIGINT   executions (kernels) or calls (ops)
--   device_ns         BIGINT   summed device time (ops: of the kernels they launched themselves)
--   inclusive_ns      BIGINT   ops: with the kernels of nested ops; kernels: device_ns
--   share             DOUBLE   device_ns / total device time of the level
--   cumulative_share  DOUBLE   share of this row and all rows above it
--   mean_ns           DOUBLE   mean device time per execution / call
--   p50_ns            DOUBLE   median
--   p99_ns            DOUBLE   99th percentile
--   variants          BIGINT   distinct kernel names in the row (kernel_family; 1 otherwise)
--   ranks             BIGINT   ranks on which it ran
WITH levels AS (
    SELECT trim(unnest(string_split(COALESCE(getvariable('levels'), 'kernel,op'), ','))) AS level
), kernels AS (
    SELECT run_id, rank, name, dur FROM slices WHERE kind IN ('kernel', 'memcpy', 'memset')
), families AS (
    -- kernel_family's regular expressions once per distinct name (a few hundred), not once per kernel (millions);
    -- only when the level is asked for
    SELECT name, kernel_family(name) AS family FROM (SELECT DISTINCT name FROM kernels)
    WHERE 'kernel_family' IN (SELECT level FROM levels)
), op_calls AS (
    SELECT run_id, rank, name, device_self_ns, device_total_ns,
        'dims ' || CAST(input_dims AS VARCHAR) || ' types ' || CAST(input_types AS VARCHAR) AS op_args
    FROM ops WHERE kernel_count_total > 0  -- (not device_total_ns: a TPU op under a nanosecond rounds to 0 ns)
), per_item AS (
    SELECT run_id, 'kernel' AS level, name, NULL AS args, rank, name AS variant, dur AS device_ns,
        dur AS inclusive_ns FROM kernels
    UNION ALL
    SELECT k.run_id, 'kernel_family', f.family, NULL, k.rank, k.name, k.dur, k.dur
    FROM kernels k JOIN families f ON f.name IS NOT DISTINCT FROM k.name
    UNION ALL
    SELECT run_id, 'op', name, NULL, rank, name, device_self_ns, device_total_ns FROM op_calls
    UNION ALL
    SELECT run_id, 'op_args', name, op_args, rank, name, device_self_ns, device_total_ns FROM op_calls
    WHERE 'op_args' IN (SELECT level FROM levels)
), grouped AS (
    SELECT run_id, level, name, args, count(*) AS count, CAST(sum(device_ns) AS BIGINT) AS device_ns,
        CAST(sum(inclusive_ns) AS BIGINT) AS inclusive_ns,
        avg(device_ns) AS mean_ns, quantile_cont(device_ns, 0.5) AS p50_ns, quantile_cont(device_ns, 0.99) AS p99_ns,
        count(DISTINCT variant) AS variants, count(DISTINCT rank) AS ranks
    FROM per_item SEMI JOIN levels USING (level)
    GROUP BY run_id, level, name, args
), ranked AS (
    SELECT *,
        row_number() OVER (PARTITION BY run_id, level ORDER BY device_ns DESC, inclusive_ns DESC, name, args)
            AS rank_in_level,
        device_ns / sum(device_ns) OVER (PARTITION BY run_id, level) AS share
    FROM grouped
)
SELECT run_id, level, rank_in_level, name, args, count, device_ns, inclusive_ns, share,
    sum(share) OVER (PARTITION BY run_id, level ORDER BY rank_in_level ROWS UNBOUNDED PRECEDING) AS cumulative_share,
    mean_ns, p50_ns, p99_ns, variants, ranks
FROM ranked
WHERE rank_in_level <= COALESCE(getvariable('top'), 20)
ORDER BY run_id, level, rank_in_level;
