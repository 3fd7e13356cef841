-- annotations: Device time under each user annotation (record_function / NVTX-style ranges), by name.
--
-- A host annotation (kind 'user_annotation'; ProfilerStep#N ranges are left to `steps`) owns the device events
-- whose launching host call started inside its time range on the same thread (slices.launch_id → the call's ts
-- and tid): the CPU→device projection by correlation ids. Nested annotations each count the events under them.
-- device_ns sums the events' durations (concurrent streams add up); device_span_ns runs from the first start to
-- the last end of those events, per annotation instance, summed. Kineto's device-side annotations
-- (kind 'gpu_annotation', 'gpu_user_annotation' in the trace) are their own device intervals: source 'gpu'.
--
-- Needs: user annotations (torch.profiler.record_function) with device kernels
-- Parameters:
--   top = 50   integer >= 1: annotation names per run and source, by device time
-- Columns:
--   run_id          VARCHAR  run
--   source          VARCHAR  'host' (projected through launches) or 'gpu' (gpu_user_annotation)
--   name            VARCHAR  annotation name
--   instances       BIGINT   annotation ranges with that name (all ranks)
--   ranks           BIGINT   ranks on which it occurs
--   host_ns         BIGINT   summed duration of the ranges on the host (NULL for 'gpu')
--   kernels         BIGINT   device events under them (NULL for 'gpu')
--   device_ns       BIGINT   summed duration of those device events (for 'gpu': of the device ranges)
--   device_span_ns  BIGINT   summed first-start-to-last-end of each instance's device events
--   share           DOUBLE   device_ns / all device event time of the run
WITH launches AS (
    SELECT d.run_id, d.rank, l.tid, l.ts AS launch_ts, d.ts, d.ts + d.dur AS te, d.dur
    FROM slices d JOIN slices l ON l.run_id = d.run_id AND l.rank = d.rank AND l.slice_id = d.launch_id
    WHERE d.kind IN ('kernel', 'memcpy', 'memset')
), host_ranges AS (
    SELECT run_id, rank, slice_id, name, tid, ts, ts + dur AS te, dur
    FROM slices WHERE kind = 'user_annotation' AND NOT starts_with(name, 'ProfilerStep#')
), projected AS (
    SELECT a.run_id, a.rank, a.slice_id, any_value(a.name) AS name, any_value(a.dur) AS host_ns,
        count(k.dur) AS kernels, sum(k.dur) AS device_ns, max(k.te) - min(k.ts) AS device_span_ns
    FROM host_ranges a
    LEFT JOIN launches k ON k.run_id = a.run_id AND k.rank = a.rank AND k.tid = a.tid
     AND k.launch_ts >= a.ts AND k.launch_ts < a.te
    GROUP BY a.run_id, a.rank, a.slice_id
), per_name AS (
    SELECT run_id, 'host' AS source, name, count(*) AS instances, count(DISTINCT rank) AS ranks,
        CAST(sum(host_ns) AS BIGINT) AS host_ns, CAST(sum(kernels) AS BIGINT) AS kernels,
        CAST(COALESCE(sum(device_ns), 0) AS BIGINT) AS device_ns,
        CAST(COALESCE(sum(device_span_ns), 0) AS BIGINT) AS device_span_ns
    FROM projected GROUP BY run_id, name
    UNION ALL
    SELECT run_id, 'gpu', name, count(*), count(DISTINCT rank), NULL, NULL,
        CAST(sum(dur) AS BIGINT), CAST(sum(dur) AS BIGINT)
    FROM slices WHERE kind = 'gpu_annotation' GROUP BY run_id, name
), totals AS (
    SELECT run_id, sum(dur) AS device_total FROM slices WHERE kind IN ('kernel', 'memcpy', 'memset') GROUP BY run_id
)
SELECT p.*, p.device_ns / t.device_total AS share
FROM per_name p LEFT JOIN totals t USING (run_id)
QUALIFY row_number() OVER (PARTITION BY p.run_id, p.source ORDER BY p.device_ns DESC, p.name)
        <= COALESCE(getvariable('top'), 50)
ORDER BY p.run_id, p.source DESC, p.device_ns DESC, p.name;
