-- kernel_breakdown: Device busy time by kernel class and by overlap combination ('compute overlapping communication', ...).
--
-- The device timeline (union over all streams) cut into the combinations of classes running at each moment:
-- 'compute', 'communication', 'memory', 'compute overlapping communication', ..., 'compute overlapping
-- communication overlapping memory'. The combinations are disjoint and add up to the busy time (window − idle),
-- so pct is a share of busy time. This is HTA 0.5's get_gpu_kernel_breakdown kernel_type table (which sums the
-- ranks): with class_scheme, analysis_window 'hta' and time_unit_ns 1000 the sums are its µs.
--
-- Needs: device kernels (a GPU/accelerator trace)
-- Parameters:
--   class_scheme = 'default'   one of default, hta: kernel class rules from kernel_classes
--   analysis_window = 'all'    one of all, hta: 'all' device work, or 'hta' (launched before the last ProfilerStep began)
--   time_unit_ns = 1           integer >= 1: 1 = exact ns; 1000 = HTA's whole µs (start rounded up, end down)
-- Columns:
--   run_id       VARCHAR  run
--   rank         INTEGER  rank
--   device_id    INTEGER  device
--   kernel_type  VARCHAR  the classes running together, e.g. 'compute overlapping communication'
--   classes      INTEGER  the same as bits: 1 compute, 2 communication, 4 memory
--   busy_ns      BIGINT   time with exactly these classes running
--   pct          DOUBLE   busy_ns / the device's busy time, percent (2 decimals)
SELECT run_id, rank, device_id,
    array_to_string(list_filter(['compute', 'communication', 'memory'], lambda name, i: classes & (1 << (i - 1)) > 0),
                    ' overlapping ') AS kernel_type,
    classes,
    CAST(sum(dur) AS BIGINT) AS busy_ns,
    round(100.0 * busy_ns / sum(busy_ns) OVER (PARTITION BY run_id, rank, device_id), 2) AS pct
FROM device_timeline(
    class_scheme := COALESCE(getvariable('class_scheme'), 'default'),
    analysis_window := COALESCE(getvariable('analysis_window'), 'all'),
    time_unit_ns := COALESCE(getvariable('time_unit_ns'), 1))
WHERE classes > 0
GROUP BY run_id, rank, device_id, classes
ORDER BY run_id, rank, device_id, busy_ns DESC, classes;
