-- queue_length: How many launched operations wait on each stream: the launch queue's statistics per stream (HTA's queue length summary).
--
-- The queue of a stream grows by one when a host launch call starts (cudaLaunchKernel, cudaMemcpyAsync, ...: HTA's
-- list, macro is_queued_launch) and shrinks by one when the device work it launched starts (macro queue_changes,
-- one row per change). A queue that stays long means the host runs ahead of the device (the device is the
-- bottleneck); a queue near 0 with idle gaps means the device waits for the host (see `launch`). CUDA blocks
-- the launching thread once 1024 operations wait on a stream (max_queue_length): at_max_ns is the time a
-- stream's queue held at or above it.
-- changes, mean_length, std_length and the quartiles are taken over the change points, as HTA's summary
-- (pandas describe) takes them; time_weighted_mean weighs each value by how long it held. With
-- analysis_window = 'hta' and time_unit_ns = 1000 they equal HTA 0.5's get_queue_length_summary (and its time
-- spent blocked on a full queue) on HTA's test traces, except where a launch and a device start share a
-- timestamp: HTA orders those with an unstable sort, tracesql counts the device start first, so the mean and std
-- may differ (by at most 2 x the changes at such timestamps / changes; 0.5 % on HTA's nccl test trace).
--
-- Needs: device work with its launching host calls (correlation ids)
-- Parameters:
--   max_queue_length = 1024    integer >= 1: the length at which launches block (CUDA: 1024 per stream)
--   analysis_window = 'all'    one of all, hta: 'all' device work, or 'hta' (launched before the last ProfilerStep began)
--   time_unit_ns = 1           integer >= 1: 1 = exact ns; 1000 = HTA's whole µs (starts rounded up)
-- Columns:
--   run_id              VARCHAR  run
--   rank                INTEGER  rank
--   device_id           INTEGER  device
--   stream              BIGINT   stream
--   changes             BIGINT   change points of the queue (two per launched operation)
--   mean_length         DOUBLE   mean queue length over the change points
--   std_length          DOUBLE   its sample standard deviation
--   min_length          BIGINT   shortest
--   p25_length          DOUBLE   first quartile (linear interpolation, as pandas)
--   p50_length          DOUBLE   median
--   p75_length          DOUBLE   third quartile
--   max_length          BIGINT   longest
--   time_weighted_mean  DOUBLE   mean length weighted by how long each value held (first to last change)
--   at_max_ns           BIGINT   time the queue held at or above max_queue_length
--   at_max_pct          DOUBLE   at_max_ns in percent of the rank's trace span, rounded to 4 decimals
SELECT q.run_id, q.rank, q.device_id, q.stream,
       count(*) AS changes,
       avg(q.queue_length) AS mean_length,
       -- from exact integer sums, so that the value does not depend on how the rows were split among threads
       sqrt(CAST(count(*) * sum(CAST(q.queue_length AS DECIMAL(38, 0)) * q.queue_length) - sum(CAST(q.queue_length AS DECIMAL(38, 0))) * sum(CAST(q.queue_length AS DECIMAL(38, 0))) AS DOUBLE)
            / nullif(count(*) * (count(*) - 1), 0)) AS std_length,
       min(q.queue_length) AS min_length,
       quantile_cont(q.queue_length, 0.25) AS p25_length,
       quantile_cont(q.queue_length, 0.5) AS p50_length,
       quantile_cont(q.queue_length, 0.75) AS p75_length,
       max(q.queue_length) AS max_length,
       sum(q.queue_length * q.held_ns) / nullif(sum(q.held_ns), 0) AS time_weighted_mean,
       CAST(COALESCE(sum(q.held_ns) FILTER (WHERE q.queue_length >= COALESCE(getvariable('max_queue_length'), 1024)), 0)
            AS BIGINT) AS at_max_ns,
       round(100.0 * COALESCE(sum(q.held_ns) FILTER (WHERE q.queue_length >= COALESCE(getvariable('max_queue_length'), 1024)), 0)
             / nullif(any_value(r.trace_end_ns - r.trace_start_ns), 0), 4) AS at_max_pct
FROM queue_changes(analysis_window := COALESCE(getvariable('analysis_window'), 'all'),
                   time_unit_ns := COALESCE(getvariable('time_unit_ns'), 1)) q
JOIN ranks r ON r.run_id = q.run_id AND r.rank = q.rank
GROUP BY q.run_id, q.rank, q.device_id, q.stream
ORDER BY q.run_id, q.rank, q.device_id, q.stream
