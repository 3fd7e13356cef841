-- bubbles: Idle gaps per stream (or per device) in the window: how many, how long, why, and their size histogram.
--
-- A gap is a maximal interval, between the first and the last activity of the stream (scope 'stream') or of the
-- whole device (scope 'device', the gaps of its busy set: they add up to temporal_breakdown's idle_ns), during
-- which nothing runs there (`idle_gaps` macro). Each gap is classified HTA's way by the event that ends it:
-- host_wait = its launching host call started after the gap began (the device waited for the CPU); kernel_wait =
-- otherwise and shorter than kernel_wait_ns (launch latency between back-to-back kernels); other = the rest
-- (synchronization, dependencies, input). Gaps shorter than macro_gap_ns are micro, the others macro.
-- histogram counts the gaps per decade: [<1 µs, 1–10 µs, 10–100 µs, 0.1–1 ms, 1–10 ms, ≥10 ms].
-- With class_scheme, analysis_window 'hta' and time_unit_ns 1000 (scope 'stream') the counts and sums are HTA
-- 0.5's get_idle_time_breakdown (see README for the two cases where HTA differs: zero and negative intervals).
-- The largest gaps with the kernels around them: bubbles_largest.
--
-- Needs: device kernels (a GPU/accelerator trace)
-- Parameters:
--   scope = 'stream'           one of stream, device: 'stream' (gaps on each stream) or 'device' (gaps of the device's busy set)
--   kernel_wait_ns = 30000     integer >= 0: shorter gaps not caused by the host are kernel_wait (HTA: 30 µs)
--   macro_gap_ns = 100000      integer >= 0: gaps at least this long are macro, shorter ones micro
--   class_scheme = 'default'   one of default, hta: kernel class rules from kernel_classes
--   analysis_window = 'all'    one of all, hta: 'all' device work, or 'hta' (launched before the last ProfilerStep began)
--   time_unit_ns = 1           integer >= 1: 1 = exact ns; 1000 = HTA's whole µs (start rounded up, end down)
-- Columns:
--   run_id          VARCHAR   run
--   rank            INTEGER   rank
--   device_id       INTEGER   device
--   stream          BIGINT    stream (NULL with scope 'device')
--   category        VARCHAR   host_wait, kernel_wait or other
--   gaps            BIGINT    number of gaps
--   idle_ns         BIGINT    their total duration
--   idle_share      DOUBLE    idle_ns / all idle time of the stream (device)
--   mean_ns         DOUBLE    mean gap
--   p50_ns          DOUBLE    median gap
--   p90_ns          DOUBLE    90th percentile
--   max_ns          BIGINT    longest gap
--   micro_gaps      BIGINT    gaps shorter than macro_gap_ns
--   macro_gaps      BIGINT    gaps of at least macro_gap_ns
--   macro_idle_ns   BIGINT    total duration of the macro gaps
--   histogram       BIGINT[]  gaps per decade: <1 µs, 1–10 µs, 10–100 µs, 0.1–1 ms, 1–10 ms, ≥10 ms
WITH gaps AS (
    -- the columns used, not *: this CTE is read twice, so it is materialized with all it selects
    SELECT run_id, rank, device_id, stream, category, dur, least(greatest(floor(log10(dur))::INTEGER - 2, 0), 5) AS decade
    FROM idle_gaps(
        scope := COALESCE(getvariable('scope'), 'stream'),
        class_scheme := COALESCE(getvariable('class_scheme'), 'default'),
        analysis_window := COALESCE(getvariable('analysis_window'), 'all'),
        time_unit_ns := COALESCE(getvariable('time_unit_ns'), 1),
        kernel_wait_ns := COALESCE(getvariable('kernel_wait_ns'), 30000),
        with_step := false)
), summary AS (
    SELECT run_id, rank, device_id, stream, category,
        count(*) AS gaps, CAST(sum(dur) AS BIGINT) AS idle_ns,
        avg(dur) AS mean_ns, quantile_cont(dur, 0.5) AS p50_ns, quantile_cont(dur, 0.9) AS p90_ns,
        max(dur) AS max_ns,
        count(*) FILTER (WHERE dur < COALESCE(getvariable('macro_gap_ns'), 100000)) AS micro_gaps,
        count(*) FILTER (WHERE dur >= COALESCE(getvariable('macro_gap_ns'), 100000)) AS macro_gaps,
        CAST(COALESCE(sum(dur) FILTER (WHERE dur >= COALESCE(getvariable('macro_gap_ns'), 100000)), 0) AS BIGINT)
            AS macro_idle_ns,
        histogram(decade) AS per_decade
    FROM gaps GROUP BY ALL
)
SELECT run_id, rank, device_id, stream, category, gaps, idle_ns,
    idle_ns / sum(idle_ns) OVER (PARTITION BY run_id, rank, device_id, stream) AS idle_share,
    mean_ns, p50_ns, p90_ns, max_ns, micro_gaps, macro_gaps, macro_idle_ns,
    list_transform(range(6), lambda d: CAST(COALESCE(per_decade[d], 0) AS BIGINT)) AS histogram
FROM summary
ORDER BY run_id, rank, device_id, stream, category;
