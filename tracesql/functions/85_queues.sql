-- Counter-style series of the device side, as HTA's TraceCounters computes them: each stream's launch queue and
-- each kind of memory copy's bandwidth, as one row per change (a step function: the value holds until the next).

-- Launch queue per stream: +1 when a host launch call (is_queued_launch: HTA's list) starts, -1 when the device
-- event it launched starts. Only device events whose launching call is in the trace take part (both sides of a
-- pair, as HTA does). At equal timestamps a start on the device is counted before a launch. analysis_window as
-- in device_activity ('hta': the device work launched before the last ProfilerStep began, HTA's default);
-- time_unit_ns 1000 rounds both starts up to whole µs, as HTA reads fractional-µs Kineto timestamps.
CREATE OR REPLACE MACRO queue_changes(analysis_window := 'all', time_unit_ns := 1) AS TABLE
WITH launched AS (
    SELECT d.run_id, d.rank, d.device_id, d.stream, d.slice_id, d.ts AS device_ts,
           (d.launch_ts + time_unit_ns - 1) // time_unit_ns * time_unit_ns AS launch_ts
    FROM device_activity(analysis_window := analysis_window, time_unit_ns := time_unit_ns) d
    JOIN slices l ON l.run_id = d.run_id AND l.rank = d.rank AND l.slice_id = d.launch_id
    WHERE d.stream IS NOT NULL AND is_queued_launch(l.name)
), streams AS (
    -- one number per stream: the changes are sorted by it, faster than by the run's name
    SELECT run_id, rank, device_id, stream, row_number() OVER (ORDER BY run_id, rank, device_id, stream) AS sid
    FROM (SELECT DISTINCT run_id, rank, device_id, stream FROM launched)
), changes AS (
    -- (LEFT JOINs, which every launch matches: DuckDB then estimates the changes as many as the launches, and
    -- joins the streams back onto the counts with the streams as its hash table, not the million counts)
    SELECT s.sid, l.slice_id, l.launch_ts AS ts, 1 AS delta
    FROM launched l
    LEFT JOIN streams s ON s.run_id = l.run_id AND s.rank = l.rank AND s.device_id IS NOT DISTINCT FROM l.device_id
     AND s.stream = l.stream
    UNION ALL
    SELECT s.sid, l.slice_id, l.device_ts, -1
    FROM launched l
    LEFT JOIN streams s ON s.run_id = l.run_id AND s.rank = l.rank AND s.device_id IS NOT DISTINCT FROM l.device_id
     AND s.stream = l.stream
), counted AS (
    -- one running sum over all streams in order (a stream's changes sum to 0), several times faster than one
    -- partitioned by stream when one stream has most of them
    SELECT sid, ts, CAST(sum(delta) OVER w AS BIGINT) AS queue_length,
           CASE WHEN lead(sid) OVER o = sid THEN lead(ts) OVER o - ts END AS held_ns
    FROM changes
    WINDOW o AS (ORDER BY sid, ts, delta, slice_id), w AS (o ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT s.run_id, s.rank, s.device_id, s.stream, c.ts, c.queue_length, c.held_ns
FROM counted c JOIN streams s ON s.sid = c.sid;

-- Memory-copy bandwidth per kind of copy ('Memcpy HtoD', 'Memcpy DtoH', 'Memcpy DtoD', 'Memset', 'Memcpy
-- Unknown': HTA's prefixes): the summed bandwidth (GB/s, the source's 'memory bandwidth (GB/s)' argument) of
-- the copies of that kind running at each change, over all devices of the rank, as HTA sums it. A copy that
-- lasted 0 ns counts as lasting min_dur_ns (HTA: one unit of the trace's clock, 1 µs). analysis_window as in
-- device_activity.
CREATE OR REPLACE MACRO copy_bandwidth_changes(analysis_window := 'all', min_dur_ns := 1000) AS TABLE
WITH copies AS (
    SELECT run_id, rank, slice_id, ts, CASE WHEN dur = 0 THEN min_dur_ns ELSE dur END AS dur,
           CASE WHEN starts_with(name, 'Memset') THEN 'Memset'
                WHEN starts_with(name, 'Memcpy') THEN left(name, 11)
                ELSE 'Memcpy Unknown' END AS copy_kind,
           TRY_CAST(json_extract(args, '$."memory bandwidth (GB/s)"') AS DOUBLE) AS gbps
    FROM device_activity(analysis_window := analysis_window)
    -- (the range as well: DuckDB filters it while reading, so that `args` is read for the copies alone; the list
    -- it checks only after reading every device event's row. The range holds kind 'memory' too, never a device event)
    WHERE kind IN ('memcpy', 'memset') AND kind BETWEEN 'memcpy' AND 'memset'
), changes AS (
    SELECT run_id, rank, copy_kind, slice_id, ts, gbps AS delta FROM copies WHERE gbps IS NOT NULL
    UNION ALL
    SELECT run_id, rank, copy_kind, slice_id, ts + dur, -gbps FROM copies WHERE gbps IS NOT NULL
)
SELECT run_id, rank, copy_kind, ts,
       sum(delta) OVER w AS gbps,
       lead(ts) OVER o - ts AS held_ns
FROM changes
WINDOW o AS (PARTITION BY run_id, rank, copy_kind ORDER BY ts, delta, slice_id),
       w AS (o ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW);
