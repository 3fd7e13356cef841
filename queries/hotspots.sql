-- hotspots: The kernels and the ops that take the most device time, with their share and cumulative share.
--
-- Kernels (kind kernel, memcpy, memset) are grouped by name across all ranks of the run; ops by name, with
-- device_ns = the device time of the kernels each op launched itself (`ops.device_self_ns`), so nested ops are
-- not counted twice. share = device_ns / all device time of that level; cumulative_share adds the shares of
-- the rows ranked above. Statistics are over single kernel executions (for ops: over op calls).
--
-- Needs: device kernels (a GPU/accelerator trace)
-- Parameters:
--   top = 20   rows per level (kernel, op)
-- Columns:
--   run_id            VARCHAR  run
--   level             VARCHAR  'kernel' or 'op'
--   rank_in_level     BIGINT   1 = the biggest
--   name              VARCHAR  kernel or op name
--   count             BIGINT   executions (kernels) or calls (ops)
--   device_ns         BIGINT   summed device time
--   share             DOUBLE   device_ns / total device time of the level
--   cumulative_share  DOUBLE   share of this row and all rows above it
--   mean_ns           DOUBLE   mean device time per execution / call
--   p50_ns            DOUBLE   median
--   p99_ns            DOUBLE   99th percentile
--   ranks             BIGINT   ranks on which it ran
WITH per_item AS (
    SELECT run_id, 'kernel' AS level, name, rank, dur AS device_ns
    FROM slices WHERE kind IN ('kernel', 'memcpy', 'memset')
    UNION ALL
    SELECT run_id, 'op' AS level, name, rank, device_self_ns AS device_ns
    FROM ops WHERE device_self_ns > 0
), grouped AS (
    SELECT run_id, level, name, count(*) AS count, CAST(sum(device_ns) AS BIGINT) AS device_ns,
        avg(device_ns) AS mean_ns, quantile_cont(device_ns, 0.5) AS p50_ns, quantile_cont(device_ns, 0.99) AS p99_ns,
        count(DISTINCT rank) AS ranks
    FROM per_item GROUP BY run_id, level, name
), ranked AS (
    SELECT *,
        row_number() OVER (PARTITION BY run_id, level ORDER BY device_ns DESC, name) AS rank_in_level,
        device_ns / sum(device_ns) OVER (PARTITION BY run_id, level) AS share
    FROM grouped
)
SELECT run_id, level, rank_in_level, name, count, device_ns, share,
    sum(share) OVER (PARTITION BY run_id, level ORDER BY rank_in_level ROWS UNBOUNDED PRECEDING) AS cumulative_share,
    mean_ns, p50_ns, p99_ns, ranks
FROM ranked
WHERE rank_in_level <= COALESCE(getvariable('top'), 20)
ORDER BY run_id, level, rank_in_level;
