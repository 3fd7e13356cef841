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
    -- one number per device (dev): the lanes below are sorted by it, faster than by the run's name
    SELECT *, row_number() OVER (ORDER BY run_id, rank, device_id) AS dev
    FROM (
        SELECT run_id, rank, device_id, min(ts) AS t0,
            coalesce(CAST(COALESCE(getvariable('resolution_ns'), NULL) AS BIGINT), (max(te) - min(ts)) // 2000)
                AS resolution_ns
        FROM segments GROUP BY ALL)
), lanes(lane, bit) AS (
    VALUES ('compute', 1), ('communication', 2), ('memory', 4), ('idle', 0)
), in_lane AS (
    -- each lane's segments summed per stretch of resolution_ns (its bucket): two segments of a lane in one bucket
    -- are less than resolution_ns apart, so only a bucket's first segment can start an interval, and the merge
    -- below sorts the buckets (a few thousand per lane and device) rather than every segment
    SELECT w.dev, l.bit, min(s.ts) AS ts, max(s.te) AS te, sum(s.te - s.ts) AS busy,
        any_value(w.resolution_ns) AS resolution_ns
    FROM segments s
    JOIN lanes l ON CASE WHEN l.bit = 0 THEN s.classes = 0 ELSE (s.classes & l.bit) <> 0 END
    JOIN windows w ON w.run_id = s.run_id AND w.rank = s.rank AND w.device_id = s.device_id
    GROUP BY w.dev, l.bit, (s.ts - w.t0) // greatest(w.resolution_ns, 1)
), ordered AS (
    -- every lane in one pass, sorted by (device, lane, start): a lane's buckets are disjoint, so the one before
    -- ends last of all before. A bucket starts an interval when it is its lane's first or the gap before it is
    -- longer than resolution_ns; busy_before: the lane's segment time before it (a running sum over all lanes:
    -- only differences within a lane are used)
    SELECT dev, bit, ts, te,
        lag(te) OVER o AS prev_te,
        COALESCE(lag(dev) OVER o <> dev OR lag(bit) OVER o <> bit OR ts - lag(te) OVER o > resolution_ns, true)
            AS starts,
        COALESCE(lead(dev) OVER o <> dev OR lead(bit) OVER o <> bit, true) AS last,
        sum(busy) OVER (o ROWS UNBOUNDED PRECEDING) - busy AS busy_before, busy
    FROM in_lane
    WINDOW o AS (ORDER BY dev, bit, ts)
), intervals AS (
    -- the starts and each lane's last bucket only: an interval runs from its start to the bucket before the
    -- next start (which ends at that start's prev_te) or to its lane's last bucket
    SELECT dev, bit, ts,
        CASE WHEN last THEN te WHEN lead(starts) OVER k THEN lead(prev_te) OVER k ELSE lead(te) OVER k END AS te,
        CASE WHEN last THEN busy_before + busy WHEN lead(starts) OVER k THEN lead(busy_before) OVER k
             ELSE lead(busy_before) OVER k + lead(busy) OVER k END - busy_before AS busy_ns,
        starts
    FROM ordered
    WHERE starts OR last
    WINDOW k AS (ORDER BY dev, bit, ts)
)
SELECT w.run_id, w.rank, w.device_id, CAST(COALESCE(getvariable('step'), NULL) AS INTEGER) AS step, l.lane, i.ts,
    i.te - i.ts AS dur, CAST(i.busy_ns AS BIGINT) AS busy_ns, i.ts - w.t0 AS offset_ns
FROM intervals i
JOIN windows w ON w.dev = i.dev
JOIN lanes l ON l.bit = i.bit
WHERE i.starts
ORDER BY w.run_id, w.rank, w.device_id, l.lane, i.ts;
