-- bound: What bounds each step of each rank: compute, communication, host/launch, input, sync or memory copies.
--
-- The step's critical path (the critical_path query's, HTA 0.5's graph) split by what each segment is; the bound
-- is the class with the largest share of the path: compute (compute kernels), communication (collective and
-- point-to-point kernels), host_launch (host work, launch calls and delays, gaps between kernels), input (data
-- loading ops and ranges, see range_phase), sync (host calls that wait for the device) or memory_copy (copies and
-- memsets). The same verdict as the what_if query's `bound` with no change; measured_ns is the step's span as the
-- what-if replays it, path_ns the critical path's length (host gaps between top-level ops weigh 0, as in HTA).
-- The findings (`tracesql findings`) say what to do about it and what that would save.
--
-- Needs: host ops and the device work they launched (Kineto GPU traces with correlation ids), or XLA ops (XPlane)
-- Parameters:
--   annotation = NULL   text: a host range name (substring, as HTA); NULL: each step; '': the whole trace
--   instance = NULL     integer >= 0: which window on each rank (0 = its first step or annotation); NULL: all
--   rank = NULL         integer >= 0: only this rank; NULL: every rank
-- Columns:
--   run_id               VARCHAR  run
--   rank                 INTEGER  rank
--   window_name          VARCHAR  the window: the step's or annotation's range name ('' for the whole trace)
--   instance             INTEGER  its 0-based occurrence on the rank
--   step                 INTEGER  step of the window's range (NULL outside steps)
--   measured_ns          BIGINT   from its start to the later of its end and the end of its last op or device work
--   path_ns              BIGINT   length of the window's critical path
--   bound                VARCHAR  compute, communication, host_launch, input, sync or memory_copy
--   compute_share        DOUBLE   share of path_ns in compute kernels
--   communication_share  DOUBLE   ... in communication kernels
--   host_launch_share    DOUBLE   ... in host work, launch calls, launch delays and gaps between kernels
--   input_share          DOUBLE   ... in data loading
--   sync_share           DOUBLE   ... in host calls that wait for the device
--   memory_copy_share    DOUBLE   ... in copies and memsets
SELECT run_id, rank, window_name, instance, step, measured_ns, path_ns, bound, compute_share, communication_share,
    host_launch_share, input_share, sync_share, memory_copy_share
FROM what_if(annotation := COALESCE(getvariable('annotation'), NULL),
    occurrence := COALESCE(getvariable('instance'), NULL), rank_filter := COALESCE(getvariable('rank'), NULL),
    replay := 0)
ORDER BY run_id, rank, instance, window_name;
