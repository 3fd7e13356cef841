-- annotations: Device time under each user annotation (record_function / NVTX-style ranges), by name.
--
-- A host annotation (kind 'user_annotation'; ProfilerStep#N ranges are left to `steps`) owns the device events
-- whose launching host call (slices.launch_id: correlation ids) started inside its time range, by one of two rules
-- (column `projection` says which one the row used):
--   process  launches from any thread of the annotation's process (the default). PyTorch runs backward on an
--            autograd thread: '## backward ##' on the main thread holds the kernels that thread launched meanwhile.
--   thread   only launches from the annotation's own thread (the NVTX-style rule).
-- Nested annotations each count the events under them; self_device_ns is the part no deeper annotation of the same
-- thread holds, child_device_ns the rest. other_thread_ns is the part launched from other threads (0 under
-- 'thread'). device_ns sums the events' durations (concurrent streams add up); device_span_ns runs from the first
-- start to the last end of those events, per annotation instance, summed. Kineto's device-side annotations
-- (kind 'gpu_annotation', 'gpu_user_annotation' in the trace) are their own device intervals: source 'gpu'.
--
-- Needs: user annotations (torch.profiler.record_function) with device kernels
-- Parameters:
--   top = 50              integer >= 1: annotation names per run and source, by device time
--   projection = 'process'  one of process, thread: whose launches a host annotation owns (see above)
-- Columns:
--   run_id           VARCHAR  run
--   source           VARCHAR  'host' (projected through launches) or 'gpu' (gpu_user_annotation)
--   projection       VARCHAR  the rule host rows used: 'process' or 'thread' (NULL for 'gpu')
--   name             VARCHAR  annotation name
--   instances        BIGINT   annotation ranges with that name (all ranks)
--   ranks            BIGINT   ranks on which it occurs
--   host_ns          BIGINT   summed duration of the ranges on the host (NULL for 'gpu')
--   kernels          BIGINT   device events under them (NULL for 'gpu')
--   device_ns        BIGINT   summed duration of those device events (for 'gpu': of the device ranges)
--   self_device_ns   BIGINT   the part of device_ns no nested annotation holds (NULL for 'gpu')
--   child_device_ns  BIGINT   the part nested annotations hold: device_ns - self_device_ns (NULL for 'gpu')
--   other_thread_ns  BIGINT   the part launched from threads other than the annotation's (NULL for 'gpu')
--   device_span_ns   BIGINT   summed first-start-to-last-end of each instance's device events
--   share            DOUBLE   device_ns / all device event time of the run
WITH projected AS (
    SELECT run_id, rank, slice_id, count(*) AS kernels, sum(dur) AS device_ns,
        sum(CASE WHEN innermost THEN dur ELSE 0 END) AS self_device_ns,
        sum(CASE WHEN own_thread THEN 0 ELSE dur END) AS other_thread_ns,
        max(ts + dur) - min(ts) AS device_span_ns
    FROM range_launches(ranges := 'annotations', projection := COALESCE(getvariable('projection'), 'process'))
    GROUP BY run_id, rank, slice_id
), per_name AS (
    SELECT a.run_id, 'host' AS source, COALESCE(getvariable('projection'), 'process') AS projection, a.name,
        count(*) AS instances, count(DISTINCT a.rank) AS ranks, CAST(sum(a.dur) AS BIGINT) AS host_ns,
        CAST(COALESCE(sum(p.kernels), 0) AS BIGINT) AS kernels,
        CAST(COALESCE(sum(p.device_ns), 0) AS BIGINT) AS device_ns,
        CAST(COALESCE(sum(p.self_device_ns), 0) AS BIGINT) AS self_device_ns,
        CAST(COALESCE(sum(p.device_ns - p.self_device_ns), 0) AS BIGINT) AS child_device_ns,
        CAST(COALESCE(sum(p.other_thread_ns), 0) AS BIGINT) AS other_thread_ns,
        CAST(COALESCE(sum(p.device_span_ns), 0) AS BIGINT) AS device_span_ns
    FROM host_ranges(ranges := 'annotations') a
    LEFT JOIN projected p ON p.run_id = a.run_id AND p.rank = a.rank AND p.slice_id = a.slice_id
    GROUP BY a.run_id, a.name
    UNION ALL
    SELECT run_id, 'gpu', NULL, name, count(*), count(DISTINCT rank), NULL, NULL,
        CAST(sum(dur) AS BIGINT), NULL, NULL, NULL, CAST(sum(dur) AS BIGINT)
    FROM slices WHERE kind = 'gpu_annotation' GROUP BY run_id, name
), totals AS (
    -- (the range as well: DuckDB filters it while reading, so that `dur` is read for the device events alone; the
    -- list it checks only after reading every row. The range holds kind 'memory' too, never a device event)
    SELECT run_id, sum(dur) AS device_total FROM slices
    WHERE kind IN ('kernel', 'memcpy', 'memset') AND kind BETWEEN 'kernel' AND 'memset'
    GROUP BY run_id
)
SELECT p.*, p.device_ns / t.device_total AS share
FROM per_name p LEFT JOIN totals t USING (run_id)
QUALIFY row_number() OVER (PARTITION BY p.run_id, p.source ORDER BY p.device_ns DESC, p.name)
        <= COALESCE(getvariable('top'), 50)
ORDER BY p.run_id, p.source DESC, p.device_ns DESC, p.name;
