-- collective_stragglers: Which ranks arrive last at collectives, how often and how late.
--
-- Calls are matched across ranks into instances as in `collectives` (by (pg_name, kind, seq), collective_match_key;
-- a send and its peer's recv as a pair, p2p_match_key) and timed as there (kernels when the
-- call has them, else the host call). Only instances recorded by at least two ranks of the run and consistent
-- (one call per rank, all of one dtype) count. For each rank: how often it started last (ties: the
-- higher rank), its lateness = its start − the instance's earliest start (the start skew), and wait_ns = how much
-- longer its calls lasted than each instance's shortest call: time spent waiting for later ranks (meaningful
-- with device timing; host calls of CPU backends only enqueue the work). A rank that is last far more often than
-- 1 / ranks of the time, with a large mean lateness, is a straggler. Across hosts, lateness includes clock offsets
-- unless align_clocks = true (as in `collectives`: each rank's times moved by its clock_offsets offset).
--
-- Needs: collective calls recorded by at least two ranks of the run
-- Parameters:
--   align_clocks = false       one of true, false: move each rank's times onto the reference rank's clock (clock_offsets)
-- Columns:
--   run_id            VARCHAR  run
--   rank              INTEGER  rank
--   straggler_rank    BIGINT   1 = the rank most often last (ties: the larger mean lateness)
--   instances         BIGINT   matched instances the rank took part in
--   times_last        BIGINT   instances at which it started last
--   last_share        DOUBLE   times_last / instances
--   mean_lateness_ns  DOUBLE   mean of its start − the instance's earliest start
--   max_lateness_ns   BIGINT   largest such lateness
--   wait_ns           BIGINT   summed duration beyond each instance's minimum duration
WITH calls AS (
    -- timed as in collectives.sql; `wait` records are not collectives
    SELECT run_id, rank, collective_id, pg_name, seq, collective, dtype, match_key,
        COALESCE(device_ts, cpu_ts) AS start_ns,
        CASE WHEN device_ts IS NOT NULL THEN device_dur ELSE cpu_dur END AS duration_ns
    FROM collective_calls(aligned := CAST(COALESCE(getvariable('align_clocks'), false) AS BOOLEAN))
), matched AS (
    SELECT *,
        start_ns - min(start_ns) OVER instance AS lateness_ns,
        duration_ns - min(duration_ns) OVER instance AS wait_ns,
        row_number() OVER (instance ORDER BY start_ns DESC, rank DESC, collective_id DESC) = 1 AS is_last,
        count(*) OVER instance AS ranks_seen,
        count(DISTINCT rank) OVER instance = count(*) OVER instance AND count(DISTINCT dtype) OVER instance <= 1
            AS consistent
    FROM calls
    WINDOW instance AS (PARTITION BY run_id, match_key)
), per_rank AS (
    SELECT run_id, rank, count(*) AS instances, count(*) FILTER (WHERE is_last) AS times_last,
        avg(lateness_ns) AS mean_lateness_ns, max(lateness_ns) AS max_lateness_ns,
        CAST(sum(wait_ns) AS BIGINT) AS wait_ns
    FROM matched
    WHERE ranks_seen >= 2 AND consistent
    GROUP BY run_id, rank
)
SELECT run_id, rank,
    row_number() OVER (PARTITION BY run_id ORDER BY times_last DESC, mean_lateness_ns DESC, rank) AS straggler_rank,
    instances, times_last, times_last / instances AS last_share, mean_lateness_ns, max_lateness_ns, wait_ns
FROM per_rank
ORDER BY run_id, straggler_rank;
