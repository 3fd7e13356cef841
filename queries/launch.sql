-- launch: Kernel launch delay and host launch overhead per rank and per step, and whether each step is CPU-bound.
--
-- launch delay = device start − start of the host runtime call that launched it (slices.launch_id: correlation
-- ids); runtime overhead = that call's duration (each call once, also when it launched a whole graph). One row per
-- rank and step, and one row with step NULL that covers the whole rank (also the launches outside any step); a
-- trace without steps has only that row. outliers = launches whose delay exceeds outlier_delay_ns.
-- host_wait_share = share of the per-stream idle time classified host_wait (see `bubbles`).
-- verdict = 'cpu_bound' when the device mostly waited for the host (host_wait_share ≥ 0.5) and its queue ran
-- nearly empty (median launch delay < median kernel duration: a kernel starts before the previous one could
-- have finished); else 'not_cpu_bound'; NULL when the step has no idle gap to judge by.
--
-- Needs: device kernels with their launching runtime calls (correlation ids)
-- Parameters:
--   outlier_delay_ns = 1000000   integer >= 0: launches delayed longer than this are outliers
--   kernel_wait_ns = 30000       integer >= 0: threshold of the kernel_wait idle category (HTA: 30 µs)
-- Columns:
--   run_id            VARCHAR  run
--   rank              INTEGER  rank
--   step              INTEGER  step (NULL = all steps of the rank)
--   launches          BIGINT   device events with a known launching call
--   delay_mean_ns     DOUBLE   mean launch delay
--   delay_p50_ns      DOUBLE   median launch delay
--   delay_p90_ns      DOUBLE   90th percentile
--   delay_p99_ns      DOUBLE   99th percentile
--   delay_max_ns      BIGINT   longest launch delay
--   outliers          BIGINT   launches delayed more than outlier_delay_ns
--   calls             BIGINT   distinct launching host calls
--   runtime_mean_ns   DOUBLE   mean duration of the launching calls
--   runtime_p50_ns    DOUBLE   median
--   runtime_p99_ns    DOUBLE   99th percentile
--   kernel_p50_ns     DOUBLE   median duration of the launched device events
--   host_wait_share   DOUBLE   host_wait idle / all per-stream idle time (NULL without gaps)
--   verdict           VARCHAR  'cpu_bound', 'not_cpu_bound' or NULL (see above)
WITH launched AS (
    SELECT run_id, rank, step, dur, ts - launch_ts AS delay_ns, launch_id AS call_id, launch_dur AS call_ns
    FROM slices
    WHERE kind IN ('kernel', 'memcpy', 'memset') AND launch_id IS NOT NULL
), per_step AS (
    -- whole: 1 for the whole-rank row (GROUPING), 0 for a step's; launches outside any step have no step row
    SELECT run_id, rank, step, grouping(step) AS whole, count(*) AS launches,
        avg(delay_ns) AS delay_mean_ns, quantile_cont(delay_ns, 0.5) AS delay_p50_ns,
        quantile_cont(delay_ns, 0.9) AS delay_p90_ns, quantile_cont(delay_ns, 0.99) AS delay_p99_ns,
        max(delay_ns) AS delay_max_ns,
        count(*) FILTER (WHERE delay_ns > COALESCE(getvariable('outlier_delay_ns'), 1000000)) AS outliers,
        quantile_cont(dur, 0.5) AS kernel_p50_ns
    FROM launched GROUP BY GROUPING SETS ((run_id, rank), (run_id, rank, step))
), calls AS (
    SELECT run_id, rank, step, grouping(step) AS whole, count(*) AS calls, avg(call_ns) AS runtime_mean_ns,
        quantile_cont(call_ns, 0.5) AS runtime_p50_ns, quantile_cont(call_ns, 0.99) AS runtime_p99_ns
    FROM (SELECT DISTINCT run_id, rank, step, call_id, call_ns FROM launched)
    GROUP BY GROUPING SETS ((run_id, rank), (run_id, rank, step))
), idle AS (
    SELECT run_id, rank, step, grouping(step) AS whole,
        sum(dur) FILTER (WHERE category = 'host_wait') / sum(dur) AS host_wait_share
    FROM idle_gaps(scope := 'stream', kernel_wait_ns := COALESCE(getvariable('kernel_wait_ns'), 30000))
    GROUP BY GROUPING SETS ((run_id, rank), (run_id, rank, step))
)
SELECT p.run_id, p.rank, p.step, p.launches, p.delay_mean_ns, p.delay_p50_ns, p.delay_p90_ns, p.delay_p99_ns,
    p.delay_max_ns, p.outliers, c.calls, c.runtime_mean_ns, c.runtime_p50_ns, c.runtime_p99_ns, p.kernel_p50_ns,
    COALESCE(i.host_wait_share, 0) AS host_wait_share,
    CASE WHEN i.host_wait_share IS NULL THEN NULL
         WHEN i.host_wait_share >= 0.5 AND p.delay_p50_ns < p.kernel_p50_ns THEN 'cpu_bound'
         ELSE 'not_cpu_bound' END AS verdict
FROM per_step p
JOIN calls c ON c.run_id = p.run_id AND c.rank = p.rank AND c.whole = p.whole AND c.step IS NOT DISTINCT FROM p.step
LEFT JOIN idle i ON i.run_id = p.run_id AND i.rank = p.rank AND i.whole = p.whole
 AND i.step IS NOT DISTINCT FROM p.step
WHERE p.whole = 1 OR p.step IS NOT NULL
ORDER BY p.run_id, p.rank, p.step NULLS FIRST;
