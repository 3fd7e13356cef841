-- timeline: Each device's time in four lanes (compute, communication, memory, idle) as intervals a chart can draw.
--
-- From the device timeline (the `analysis_timeline` macro: segments with the set of classes running): a segment
-- belongs to a class's lane while that class runs (so compute overlapping communication is in both lanes), to
-- the idle lane when nothing runs. Within a lane, intervals closer than resolution_ns are merged into one so that
-- a chart gets a bounded number of bars (about 2,000 per lane and device by default); busy_ns keeps the exact time
-- the lane's class ran inside the merged interval. With `step`, only that step's device window (step_timeline).
-- offset_ns is the interval's start from the first activity of the device in the window.
--
-- Needs: device kernels (a GPU/accelerator trace); ProfilerStep ranges for step
-- Parameters:
--   step = NULL                integer: only this step's device window; NULL = the whole window
--   resolution_ns = NULL       integer >= 1: merge gaps shorter than this; NULL = the device's window / 2000
--   class_scheme = 'default'   one of default, hta: kernel class rules from kernel_classes
--   analysis_window = 'all'    one of all, hta: 'all' device work, or 'hta' (launched before the last ProfilerStep began)
--   time_unit_ns = 1           integer >= 1: 1 = exact ns; 1000 = HTA's whole µs (start rounded up, end down)
-- Columns:
--   run_id     VARCHAR  run
--   rank       INTEGER  rank
--   device_id  INTEGER  device
--   step       INTEGER  the step asked for (NULL: the whole window)
--   lane       VARCHAR  compute, communication, memory or idle
--   ts         BIGINT   interval start, ns
--   dur        BIGINT   interval length, ns (merged)
--   busy_ns    BIGINT   time the lane's class really ran inside the interval
--   offset_ns  BIGINT   ts − the device's first activity in the window
WITH segments AS (
    SELECT run_id, rank, device_id, step, ts, ts + dur AS te, classes
    FROM analysis_timeline(
        per := CASE WHEN COALESCE(getvariable('step'), NULL) IS NULL THEN 'rank' ELSE 'step' END,
        class_scheme := COALESCE(getvariable('class_scheme'), 'default'),
        analysis_window := COALESCE(getvariable('analysis_window'), 'all'),
        time_unit_ns := COALESCE(getvariable('time_unit_ns'), 1))
    WHERE COALESCE(getvariable('step'), NULL) IS NULL OR step = COALESCE(getvariable('step'), NULL)
), windows AS (
    SELECT run_id, rank, device_id, min(ts) AS t0,
        coalesce(CAST(COALESCE(getvariable('resolution_ns'), NULL) AS BIGINT), (max(te) - min(ts)) // 2000)
            AS resolution_ns
    FROM segments GROUP BY ALL
), lanes(lane, bit) AS (
    VALUES ('compute', 1), ('communication', 2), ('memory', 4), ('idle', 0)
), in_lane AS (
    SELECT s.run_id, s.rank, s.device_id, s.step, l.lane, s.ts, s.te, w.t0, w.resolution_ns
    FROM segments s
    JOIN lanes l ON CASE WHEN l.bit = 0 THEN s.classes = 0 ELSE (s.classes & l.bit) <> 0 END
    JOIN windows w ON w.run_id = s.run_id AND w.rank = s.rank AND w.device_id = s.device_id
), starts AS (
    -- a lane's segments are disjoint, so the one before ends last of all before
    SELECT *,
        CASE WHEN ts - lag(te) OVER (PARTITION BY run_id, rank, device_id, lane ORDER BY ts) <= resolution_ns
             THEN 0 ELSE 1 END AS starts_interval
    FROM in_lane
), numbered AS (
    SELECT *, sum(starts_interval) OVER (PARTITION BY run_id, rank, device_id, lane ORDER BY ts
                                         ROWS UNBOUNDED PRECEDING) AS interval_no
    FROM starts
)
SELECT run_id, rank, device_id, CAST(COALESCE(getvariable('step'), NULL) AS INTEGER) AS step, lane,
    min(ts) AS ts, max(te) - min(ts) AS dur, CAST(sum(te - ts) AS BIGINT) AS busy_ns, min(ts) - any_value(t0) AS offset_ns
FROM numbered
GROUP BY run_id, rank, device_id, lane, interval_no
ORDER BY run_id, rank, device_id, lane, ts;
