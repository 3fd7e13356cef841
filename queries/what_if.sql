-- what_if: What each step would take with kernels or ops faster, communication hidden, no launch overhead or no syncs, and what bounds it.
--
-- Replays each window's dependency graph (the critical_path query's; tracesql/critical_path.py) with every edge
-- weighing the time it took, from the window's start to the later of its end and the end of the last op or
-- device work it holds (measured_ns), then again with the changes: the longest path is the predicted time.
-- Unchanged, the replay is the measured time (replayed_ns; a test holds it within 1 %). Changes: `faster` (a
-- regex of kernel, op or host range names; their own pieces, not their children's) takes faster_pct % off their
-- time; hide_communication = 1 makes communication kernels take no time; no_launch_overhead = 1 makes launch
-- delays and gaps between kernels take no time; remove_syncs = 1 removes the synchronisations (the host stops
-- waiting for the device). Work still waits for what it depends on: a kernel for its launch and the previous
-- kernel on its stream (at the time it was free, if that was launched before the window or the trace), a host
-- call for the device work it synchronises with. The replay takes each step's windows on every rank together: a collective
-- completes on each rank when the last rank has arrived (its communication kernels matched across ranks as in
-- `collectives`), so a rank made faster or slower moves the others' steps; straggler_to_median = 1 makes each
-- step's straggler (the rank with the most device work other than communication) as fast as the median of the
-- others (in a step without device work, CPU ranks: the most own time in host ops other than communication calls,
-- those ops scaled). XLA on TPU and CPU launches nothing: its ranks' replay is device-only, each device's ops in
-- order with their gaps kept (a device the change does not touch keeps its time); an XLA rank without steps is
-- replayed over its profiled range (step NULL). remote_ns is the part of a rank's replayed path on other ranks'
-- work (remote_rank: whose, the most): the rank waited for them. Work outside the trace (and ranks not in the run)
-- is not seen.
-- bound: what takes the largest share of the window's critical path (the critical_path query's, HTA's: the
-- replay's paths all last the measured time, so they tell nothing apart): compute, communication, host_launch
-- (host work, launch calls and delays, gaps between kernels), input (data loading), sync or memory_copy; each
-- *_share is that part of path_ns.
--
-- Needs: host ops and the device work they launched (Kineto GPU traces with correlation ids), or XLA ops (XPlane)
-- Parameters:
--   annotation = NULL          text: a host range name (substring, as HTA); NULL: each step; '': the whole trace
--   instance = NULL            integer >= 0: which window on each rank (0 = its first step or annotation); NULL: all
--   rank = NULL                integer >= 0: only this rank; NULL: every rank
--   faster = NULL              text: regex of kernel, op or host range names made faster (NULL: none)
--   faster_pct = 0             number >= 0: how much faster, in % of their time (100: free)
--   hide_communication = 0     one of 0, 1: 1 = communication kernels take no time
--   no_launch_overhead = 0     one of 0, 1: 1 = launch delays and gaps between kernels take no time
--   remove_syncs = 0           one of 0, 1: 1 = no synchronisation (stream, device, event)
--   straggler_to_median = 0    one of 0, 1: 1 = each step's straggler's device work at the other ranks' median
-- Columns:
--   run_id               VARCHAR  run
--   rank                 INTEGER  rank
--   window_name          VARCHAR  the window: the step's or annotation's range name ('' for the whole trace)
--   instance             INTEGER  its 0-based occurrence on the rank
--   step                 INTEGER  step of the window's range (NULL outside steps)
--   range_ns             BIGINT   the window's range duration
--   measured_ns          BIGINT   from its start to the later of its end and the end of its last op or device work
--   replayed_ns          BIGINT   the unchanged replay (equals measured_ns unless the graph lost time)
--   predicted_ns         BIGINT   the replay with the changes
--   saving_ns            BIGINT   replayed_ns - predicted_ns
--   saving_pct           DOUBLE   saving_ns / replayed_ns in %, 2 decimals
--   path_ns              BIGINT   length of the window's critical path (HTA's: host gaps between top-level ops weigh 0)
--   bound                VARCHAR  compute, communication, host_launch, input, sync or memory_copy (see above)
--   compute_share        DOUBLE   share of path_ns in compute kernels
--   communication_share  DOUBLE   ... in communication kernels
--   host_launch_share    DOUBLE   ... in host work, launch calls, launch delays and gaps between kernels
--   input_share          DOUBLE   ... in data loading
--   sync_share           DOUBLE   ... in host calls that wait for the device
--   memory_copy_share    DOUBLE   ... in copies and memsets
--   remote_ns            BIGINT   part of the replayed path on other ranks' work (waiting for them at collectives)
--   remote_rank          INTEGER  the rank with the most of it (NULL: none)
SELECT *
FROM what_if(annotation := COALESCE(getvariable('annotation'), NULL),
    occurrence := COALESCE(getvariable('instance'), NULL), rank_filter := COALESCE(getvariable('rank'), NULL),
    faster := COALESCE(getvariable('faster'), NULL), faster_pct := COALESCE(getvariable('faster_pct'), 0),
    hide_communication := COALESCE(getvariable('hide_communication'), 0),
    no_launch_overhead := COALESCE(getvariable('no_launch_overhead'), 0),
    remove_syncs := COALESCE(getvariable('remove_syncs'), 0),
    straggler_to_median := COALESCE(getvariable('straggler_to_median'), 0))
ORDER BY run_id, rank, instance, window_name;
