-- copy_bandwidth: Memory copies and memsets per kind (HtoD, DtoH, DtoD, Memset): their bandwidth, time and bytes (HTA's memory bandwidth summary).
--
-- A copy's bandwidth is the one the trace records for it (Kineto's 'memory bandwidth (GB/s)': bytes / duration).
-- The bandwidth of a kind at an instant is the sum over its copies running then, on every device of the rank
-- (macro copy_bandwidth_changes: one row per change, the time series). points, mean_gbps ... max_gbps are taken
-- over the change points where some copy of the kind runs, as HTA's summary (pandas describe of the positive
-- points) takes them; busy_gbps weighs each value by how long it held, so it is the mean bandwidth while copies
-- of the kind ran. Copies of 0 ns count as 1 µs (HTA's rule). With analysis_window = 'hta' the statistics equal
-- HTA 0.5's get_memory_bw_summary on HTA's test traces, except that HTA also counts points where rounding left a
-- running sum of about 1e-16 GB/s after every copy had ended (5 points of ns_resolution_trace's 'Memcpy DtoD').
-- Slow host-device copies usually mean pageable (not pinned) host memory; DtoD copies inside a step often are
-- avoidable `.contiguous()` or dtype conversions.
--
-- Needs: memory copies or memsets on a device with their bandwidth (Kineto GPU traces)
-- Parameters:
--   analysis_window = 'all'    one of all, hta: 'all' device work, or 'hta' (launched before the last ProfilerStep began)
-- Columns:
--   run_id      VARCHAR  run
--   rank        INTEGER  rank
--   copy_kind   VARCHAR  'Memcpy HtoD', 'Memcpy DtoH', 'Memcpy DtoD', 'Memcpy PtoP', 'Memset' or 'Memcpy Unknown'
--   copies      BIGINT   copies of this kind with a recorded bandwidth
--   bytes       BIGINT   bytes they moved (when the trace records them)
--   busy_ns     BIGINT   time some copy of this kind ran
--   busy_gbps   DOUBLE   mean bandwidth while they ran (time-weighted)
--   points      BIGINT   change points with a copy running (HTA's count)
--   mean_gbps   DOUBLE   mean bandwidth over those points
--   std_gbps    DOUBLE   its sample standard deviation
--   min_gbps    DOUBLE   lowest
--   p25_gbps    DOUBLE   first quartile (linear interpolation, as pandas)
--   p50_gbps    DOUBLE   median
--   p75_gbps    DOUBLE   third quartile
--   max_gbps    DOUBLE   highest
WITH series AS (
    SELECT * FROM copy_bandwidth_changes(analysis_window := COALESCE(getvariable('analysis_window'), 'all'))
), points AS (
    -- a running sum may leave a rounding residue where no copy runs: below 1e-9 GB/s is none
    SELECT run_id, rank, copy_kind, count(*) AS points, avg(gbps) AS mean_gbps, stddev_samp(gbps) AS std_gbps,
           min(gbps) AS min_gbps, quantile_cont(gbps, 0.25) AS p25_gbps, quantile_cont(gbps, 0.5) AS p50_gbps,
           quantile_cont(gbps, 0.75) AS p75_gbps, max(gbps) AS max_gbps,
           CAST(sum(held_ns) AS BIGINT) AS busy_ns, sum(gbps * held_ns) / nullif(sum(held_ns), 0) AS busy_gbps
    FROM series WHERE gbps > 1e-9
    GROUP BY run_id, rank, copy_kind
), totals AS (
    SELECT run_id, rank,
           CASE WHEN starts_with(name, 'Memset') THEN 'Memset'
                WHEN starts_with(name, 'Memcpy') THEN left(name, 11)
                ELSE 'Memcpy Unknown' END AS copy_kind,
           count(*) AS copies,
           CAST(sum(TRY_CAST(json_extract(args, '$.bytes') AS BIGINT)) AS BIGINT) AS bytes
    FROM device_activity(analysis_window := COALESCE(getvariable('analysis_window'), 'all'))
    -- (the range as in copy_bandwidth_changes: `args` read for the copies alone)
    WHERE kind IN ('memcpy', 'memset') AND kind BETWEEN 'memcpy' AND 'memset'
      AND json_extract(args, '$."memory bandwidth (GB/s)"') IS NOT NULL
    GROUP BY ALL
)
SELECT p.run_id, p.rank, p.copy_kind, t.copies, t.bytes, p.busy_ns, p.busy_gbps, p.points, p.mean_gbps, p.std_gbps,
       p.min_gbps, p.p25_gbps, p.p50_gbps, p.p75_gbps, p.max_gbps
FROM points p JOIN totals t USING (run_id, rank, copy_kind)
ORDER BY p.run_id, p.rank, p.copy_kind
