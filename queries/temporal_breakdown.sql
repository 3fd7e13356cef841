-- temporal_breakdown: Where each device's time went: compute, exposed communication, exposed memory, idle.
--
-- Over the device's window (first to last activity in the analysis window), as unions over all streams:
--   compute = |union(compute)|, exposed_comm = |union(comm) − union(compute)|,
--   exposed_memory = |union(memory) − union(compute) − union(comm)|, idle = window − |union(all)|.
-- The four add up to the window. HTA reports compute, idle and non_compute = window − compute − idle
-- (= exposed_comm + exposed_memory); its percentages are given too.
-- per = 'step': one row per step and device, over the step's device window (`step_windows`: from its first device
-- event to the next step's first; disjoint, so the steps add up to the run over their span); inside it every
-- event counts, whichever step launched it (docs/concepts/steps.md).
--
-- Needs: device kernels (a GPU/accelerator trace)
-- Parameters:
--   per = 'rank'               one of rank, step: one row per device ('rank'), or per step and device
--   class_scheme = 'default'   one of default, hta: kernel class rules from kernel_classes
--   analysis_window = 'all'    one of all, hta: 'all' device work, or 'hta' (launched before the last ProfilerStep began)
--   time_unit_ns = 1           integer >= 1: 1 = exact ns; 1000 = HTA's whole µs (start rounded up, end down)
-- Columns:
--   run_id              VARCHAR  run
--   rank                INTEGER  rank
--   device_id           INTEGER  device
--   step                INTEGER  step (per = 'step'; NULL otherwise)
--   window_ns           BIGINT   first to last device activity (of the step)
--   compute_ns          BIGINT   time with compute running
--   exposed_comm_ns     BIGINT   time with communication but no compute
--   exposed_memory_ns   BIGINT   time with only memory operations
--   idle_ns             BIGINT   time with nothing running
--   non_compute_ns      BIGINT   exposed_comm_ns + exposed_memory_ns (HTA's non_compute_time)
--   compute_pct         DOUBLE   compute_ns / window_ns, percent (2 decimals)
--   exposed_comm_pct    DOUBLE   exposed_comm_ns / window_ns, percent
--   exposed_memory_pct  DOUBLE   exposed_memory_ns / window_ns, percent
--   idle_pct            DOUBLE   idle_ns / window_ns, percent
--   non_compute_pct     DOUBLE   non_compute_ns / window_ns, percent
SELECT
    run_id, rank, device_id, step,
    CAST(sum(dur) AS BIGINT) AS window_ns,
    CAST(COALESCE(sum(dur) FILTER (WHERE classes & 1 = 1), 0) AS BIGINT) AS compute_ns,
    CAST(COALESCE(sum(dur) FILTER (WHERE classes & 3 = 2), 0) AS BIGINT) AS exposed_comm_ns,
    CAST(COALESCE(sum(dur) FILTER (WHERE classes & 7 = 4), 0) AS BIGINT) AS exposed_memory_ns,
    CAST(COALESCE(sum(dur) FILTER (WHERE classes = 0), 0) AS BIGINT) AS idle_ns,
    exposed_comm_ns + exposed_memory_ns AS non_compute_ns,
    round(100.0 * compute_ns / window_ns, 2) AS compute_pct,
    round(100.0 * exposed_comm_ns / window_ns, 2) AS exposed_comm_pct,
    round(100.0 * exposed_memory_ns / window_ns, 2) AS exposed_memory_pct,
    round(100.0 * idle_ns / window_ns, 2) AS idle_pct,
    round(100.0 * non_compute_ns / window_ns, 2) AS non_compute_pct
FROM analysis_timeline(
    per := COALESCE(getvariable('per'), 'rank'),
    class_scheme := COALESCE(getvariable('class_scheme'), 'default'),
    analysis_window := COALESCE(getvariable('analysis_window'), 'all'),
    time_unit_ns := COALESCE(getvariable('time_unit_ns'), 1))
GROUP BY run_id, rank, device_id, step
ORDER BY run_id, rank, device_id, step;
