-- critical_path: The chain of host and device work that set each step's length, segment by segment, and what bounds it.
--
-- The dependency graph of HTA 0.5's critical_path_analysis, per rank and window (tracesql/critical_path.py):
-- host ops nested and in order on their thread, each launch -> the device work it launched (correlation ids),
-- device work in order on its stream, stream / device / event synchronisation (Kineto cuda_sync events) ->
-- the host call that waited, cudaStreamWaitEvent -> the next work on the waiting stream; the path is the
-- longest one through it. Windows: each step (`steps`), or with annotation each host range whose name contains
-- it (HTA's rule; '' = the whole trace), instance = its 0-based occurrence on the rank (NULL: every one).
-- A window holds the host events that start in it and the device work they launched (also when it runs past
-- the window's end). One row per path segment (a piece of an op, a kernel, a launch delay, a gap between two
-- kernels), in path order; dependency and sync edges weigh 0 and are no rows. The total per bound_by equals
-- HTA's on HTA's own critical-path traces (a test). bound_by: HTA's class (cpu_bound, gpu_compute_bound,
-- gpu_communication_bound, gpu_kernel_kernel_overhead, gpu_kernel_launch_overhead). cause, ours: compute,
-- communication, memory_copy (device copies and memsets, host cudaMemcpy), sync (a host call that waits for the
-- device), input (ops and ranges of data loading, see range_phase), launch (launch delay, the launch calls
-- themselves), kernel_gap, host (other host work). per = 'class': one row per window, bound_by and cause (seq,
-- event_id, name, ts, edge NULL). The path sees one rank's trace only: the time a collective waits for another
-- rank shows as its kernel's duration (see the what_if query and docs/guides/critical-path.md).
--
-- Needs: host ops and the device work they launched (Kineto GPU traces with correlation ids), or XLA ops (XPlane); cuda_sync events for the synchronisation edges
-- Parameters:
--   annotation = NULL   text: a host range name (substring, as HTA); NULL: each step; '': the whole trace
--   instance = NULL     integer >= 0: which window on each rank (0 = its first step or annotation); NULL: all
--   rank = NULL         integer >= 0: only this rank; NULL: every rank
--   per = 'segment'     one of segment, class: one row per path segment, or the totals per bound_by and cause
-- Columns:
--   run_id       VARCHAR  run
--   rank         INTEGER  rank
--   window_name  VARCHAR  the window: the step's or annotation's range name ('' for the whole trace)
--   instance     INTEGER  its 0-based occurrence on the rank
--   step         INTEGER  step of the window's range (NULL outside steps)
--   seq          INTEGER  the segment's place on the path (0 = first); NULL per class
--   event_id     BIGINT   slices.slice_id of the event the segment belongs to; NULL per class
--   name         VARCHAR  that event's name; NULL per class
--   ts           BIGINT   start of the segment, ns; NULL per class
--   dur_ns       BIGINT   length of the segment (per class: summed)
--   share        DOUBLE   dur_ns / the path's length
--   edge         VARCHAR  op (a piece of an op or device event), launch, kernel_gap; NULL per class
--   bound_by     VARCHAR  HTA's class of the segment
--   cause        VARCHAR  what the segment is (see above)
WITH paths AS (
    SELECT run_id, rank, window_name, instance, step, critical_path_walk(events, NULL, NULL) AS path
    FROM critical_path_events(annotation := COALESCE(getvariable('annotation'), NULL),
        occurrence := COALESCE(getvariable('instance'), NULL), rank_filter := COALESCE(getvariable('rank'), NULL))
), walked AS (
    -- (the path's length summed per list, before the list is unnested: a window function over every segment
    -- took 7 times as long)
    SELECT run_id, rank, window_name, instance, step, path_ns, unnest(path) AS s
    FROM (SELECT *, list_sum([s.dur_ns FOR s IN path]) AS path_ns FROM paths)
), segments AS (
    SELECT w.run_id, w.rank, w.window_name, w.instance, w.step, w.seq, w.event_id, e.name, w.ts, w.dur_ns,
        w.dur_ns / w.path_ns AS share, w.edge, w.bound_by, critical_path_cause(w.edge, e.kind, e.name, d.class) AS cause
    FROM (SELECT run_id, rank, window_name, instance, step, path_ns, s.* FROM walked) w
    LEFT JOIN slices e ON e.run_id = w.run_id AND e.rank = w.rank AND e.slice_id = w.event_id
    LEFT JOIN device_activity() d ON d.run_id = w.run_id AND d.rank = w.rank AND d.slice_id = w.event_id
)
SELECT run_id, rank, window_name, instance, step, seq, event_id, name, ts, dur_ns, share, edge, bound_by, cause
FROM segments
WHERE COALESCE(getvariable('per'), 'segment') = 'segment'
UNION ALL
SELECT run_id, rank, window_name, instance, step, NULL, NULL, NULL, NULL, CAST(sum(dur_ns) AS BIGINT), sum(share),
    NULL, bound_by, cause
FROM segments
WHERE COALESCE(getvariable('per'), 'segment') = 'class'
GROUP BY run_id, rank, window_name, instance, step, bound_by, cause
ORDER BY run_id, rank, instance, window_name, seq NULLS FIRST, dur_ns DESC;
