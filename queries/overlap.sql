-- overlap: How much communication is hidden under computation, per rank and device.
--
-- overlap_ratio = |union(comm) ∩ union(compute)| / |union(comm)|: the share of communication time during which
-- some compute kernel also runs (HTA's comp_comm_overlap_pctg). exposed_comm_ns = |union(comm)| − overlap_ns is
-- the communication time nothing hides. Unions are taken over all streams of the device, so concurrent kernels
-- are counted once. NULL ratio when the device ran no communication.
-- With class_scheme = 'hta' and analysis_window = 'hta' the numbers are HTA 0.5's (see README).
--
-- Needs: device kernels (a GPU/accelerator trace)
-- Parameters:
--   class_scheme = 'default'   kernel class rules from kernel_classes: 'default' or 'hta'
--   analysis_window = 'all'    'all' device work, or 'hta' (launched before the last ProfilerStep began)
--   time_unit_ns = 1           1 = exact ns; 1000 = HTA's whole µs (start rounded up, end down)
-- Columns:
--   run_id            VARCHAR  run
--   rank              INTEGER  rank
--   device_id         INTEGER  device
--   comm_ns           BIGINT   time with communication running (union over streams)
--   compute_ns        BIGINT   time with compute running (union over streams)
--   overlap_ns        BIGINT   time with both running
--   exposed_comm_ns   BIGINT   communication time not overlapped by compute
--   overlap_ratio     DOUBLE   overlap_ns / comm_ns (NULL without communication)
--   overlap_pct       DOUBLE   overlap_ratio in percent, rounded to 2 decimals
SELECT
    run_id, rank, device_id,
    CAST(COALESCE(sum(dur) FILTER (WHERE classes & 2 = 2), 0) AS BIGINT) AS comm_ns,
    CAST(COALESCE(sum(dur) FILTER (WHERE classes & 1 = 1), 0) AS BIGINT) AS compute_ns,
    CAST(COALESCE(sum(dur) FILTER (WHERE classes & 3 = 3), 0) AS BIGINT) AS overlap_ns,
    comm_ns - overlap_ns AS exposed_comm_ns,
    CAST(overlap_ns AS DOUBLE) / NULLIF(comm_ns, 0) AS overlap_ratio,
    round(100 * overlap_ratio, 2) AS overlap_pct
FROM device_timeline(
    class_scheme := COALESCE(getvariable('class_scheme'), 'default'),
    analysis_window := COALESCE(getvariable('analysis_window'), 'all'),
    time_unit_ns := COALESCE(getvariable('time_unit_ns'), 1))
GROUP BY run_id, rank, device_id
ORDER BY run_id, rank, device_id;
