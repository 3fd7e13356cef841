-- memory_curve: Allocated and reserved memory of each device over time, downsampled to a fixed number of points.
--
-- Each device's span, from its first to its last allocator event, is cut into `points` equal intervals (the last
-- event falls in the last one). A point gives the highest level the curve reached in its interval: the level
-- carried in from earlier events or any event inside it, so downsampling never hides a peak (the maximum over the
-- points is the peak of `memory`). Levels are the allocator's running totals (`Total Allocated`,
-- `Total Reserved`). An interval without events keeps the level carried in (events = 0).
--
-- Needs: allocator events (profile_memory=True: PyTorch's [memory] events, torch_npu's memory_record.csv)
-- Parameters:
--   points = 100   integer >= 1: intervals per device
-- Columns:
--   run_id           VARCHAR  run
--   rank             INTEGER  rank
--   device_type      VARCHAR  'cpu', 'gpu', 'tpu', 'npu' or 'other'
--   device_id        INTEGER  device index (-1: host memory)
--   allocator        VARCHAR  allocator or component (torch_npu: PTA, GE, APP, module <NAME>; NULL: not named)
--   point            BIGINT   0 .. points − 1
--   ts               BIGINT   start of the interval, ns
--   allocated_bytes  BIGINT   highest Total Allocated in the interval
--   reserved_bytes   BIGINT   highest Total Reserved in the interval
--   events           BIGINT   allocator events in the interval
WITH params AS (
    SELECT CAST(COALESCE(getvariable('points'), 100) AS BIGINT) AS points
), spans AS (
    -- a curve per device and allocator (torch_npu's components apart); '' keys a NULL allocator in the joins
    SELECT run_id, rank, device_type, device_id, COALESCE(allocator, '') AS allocator_key, min(ts) AS t0,
        max(ts) - min(ts) AS span
    FROM memory GROUP BY ALL
), grid AS (
    SELECT s.*, p.point, s.t0 + s.span * p.point // params.points AS ts
    FROM spans s, params, range(params.points) p(point)
), binned AS (
    SELECT m.*,
        -- integer arithmetic: (ts − t0) · points stays far below 2^63 for any trace shorter than a day
        least(params.points - 1, (m.ts - s.t0) * params.points // NULLIF(s.span, 0)) AS point
    FROM (SELECT *, COALESCE(allocator, '') AS allocator_key FROM memory) m
    JOIN spans s USING (run_id, rank, device_type, device_id, allocator_key)
    CROSS JOIN params
), per_point AS (
    SELECT run_id, rank, device_type, device_id, allocator_key, COALESCE(point, 0) AS point, count(*) AS events,
        max(total_allocated_bytes) AS max_allocated, max(total_reserved_bytes) AS max_reserved,
        arg_max(total_allocated_bytes, (ts, memory_id)) AS last_allocated,
        arg_max(total_reserved_bytes, (ts, memory_id)) AS last_reserved
    FROM binned GROUP BY run_id, rank, device_type, device_id, allocator_key, COALESCE(point, 0)
), curve AS (
    SELECT g.run_id, g.rank, g.device_type, g.device_id, g.allocator_key, g.point, g.ts,
        COALESCE(p.events, 0) AS events,
        p.max_allocated, p.max_reserved,
        -- the level carried into the interval: the last event of the nearest earlier interval that has events
        last_value(p.last_allocated IGNORE NULLS) OVER carried AS allocated_in,
        last_value(p.last_reserved IGNORE NULLS) OVER carried AS reserved_in
    FROM grid g
    LEFT JOIN per_point p USING (run_id, rank, device_type, device_id, allocator_key, point)
    WINDOW carried AS (PARTITION BY g.run_id, g.rank, g.device_type, g.device_id, g.allocator_key ORDER BY g.point
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
)
SELECT run_id, rank, device_type, device_id, NULLIF(allocator_key, '') AS allocator, point, ts,
    greatest(allocated_in, max_allocated) AS allocated_bytes,
    greatest(reserved_in, max_reserved) AS reserved_bytes,
    events
FROM curve
ORDER BY run_id, rank, device_type, device_id, allocator, point;
