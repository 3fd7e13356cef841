-- The critical path's inputs: the windows it is taken over and, per window, the events of its dependency graph
-- (queries/critical_path.sql walks them with tracesql's Python function critical_path_walk; the graph is
-- described in tracesql/critical_path.py).

-- The windows: annotation NULL: each step (`steps`); '': each rank's whole trace; else each host range whose name
-- contains it (HTA's rule), numbered per rank from 0 in time order (instance; occurrence NULL: all of them).
CREATE OR REPLACE MACRO critical_path_windows(annotation := NULL, occurrence := NULL, rank_filter := NULL) AS TABLE
WITH found AS (
    SELECT run_id, rank, name, step, ts, ts + dur AS te FROM steps WHERE annotation IS NULL
    UNION ALL
    SELECT run_id, rank, '', NULL, trace_start_ns, trace_end_ns FROM ranks WHERE annotation = ''
    UNION ALL
    SELECT run_id, rank, name, step, ts, ts + dur FROM slices
    WHERE annotation <> '' AND device_id IS NULL AND dur > 0 AND contains(name, annotation)
), numbered AS (
    SELECT *, CAST(row_number() OVER (PARTITION BY run_id, rank ORDER BY ts, te DESC) - 1 AS INTEGER) AS n
    FROM found
    WHERE rank_filter IS NULL OR rank = rank_filter
)
SELECT run_id, rank, name AS window_name, n AS instance, step, ts, te
FROM numbered
WHERE occurrence IS NULL OR n = occurrence;

-- Host calls that put one device event on a stream (HTA's list of launch calls): the stream's queue grows by one
-- when they run and shrinks by one when the event starts.
CREATE OR REPLACE MACRO is_queued_launch(name) AS (
    name IN ('cudaLaunchKernel', 'cudaLaunchKernelExC', 'cuLaunchKernel', 'cudaMemcpyAsync', 'cudaMemsetAsync',
             'hipLaunchKernel', 'hipExtModuleLaunchKernel', 'hipMemsetAsync', 'hipMemcpyAsync',
             'hipMemcpyWithStream', 'runFunction - job_prep_and_submit_for_execution')
);

-- Per window, the list of its events as critical_path_walk takes them (tracesql/critical_path.py EVENT_FIELDS):
-- the host events that start in it and last (ops are nodes, other ranges only hold them), the device work
-- those host calls launched, and the synchronisations whose host call is in it. What-if: `faster` (a regex of
-- kernel or op names) takes faster_pct % off their time; hide_communication = 1 makes communication kernels
-- weigh 0; remove_syncs = 1 removes the synchronisations (scale 0: the host no longer waits for the device).
-- The changes take effect when critical_path_walk is given a gaps_scale.
CREATE OR REPLACE MACRO critical_path_events(annotation := NULL, occurrence := NULL, rank_filter := NULL,
        faster := NULL, faster_pct := 0, hide_communication := 0, remove_syncs := 0) AS TABLE
WITH windows AS (
    SELECT * FROM critical_path_windows(annotation := annotation, occurrence := occurrence, rank_filter := rank_filter)
), bounds AS (
    SELECT run_id, rank, min(ts) AS ts, max(te) AS te FROM windows GROUP BY run_id, rank
), horizon AS (
    -- the latest time a queue length the windows' work reads can be taken at: the latest launch or start of
    -- the device work launched between the rank's first window start and last window end (a superset of the
    -- windows' own work). The queue's running sum at a time depends on the launches and starts up to it only,
    -- so work launched and started after the horizon is left out (one step of a long trace reads one step's worth)
    SELECT b.run_id, b.rank, b.ts, greatest(b.te, max(greatest(d.ts, d.launch_ts))) AS upto
    FROM bounds b
    LEFT JOIN slices d ON d.run_id = b.run_id AND d.rank = b.rank AND d.launch_ts BETWEEN b.ts AND b.te
     AND d.kind IN ('kernel', 'memcpy', 'memset')
    GROUP BY b.run_id, b.rank, b.ts, b.te
), work AS (
    -- the device work that starts after the rank's first window starts: what the windows launched, and all the
    -- queue lengths need (work that started before has left its stream's queue)
    SELECT d.run_id, d.rank, d.slice_id, d.name, d.ts, d.dur, d.pid, d.tid, d.stream, d.device_id, d.launch_id,
        d.launch_ts, d.launch_pid, d.launch_tid, is_queued_launch(l.name) AS queued,
        d.class = 'communication' AS communication
    FROM device_activity() d
    JOIN horizon b ON b.run_id = d.run_id AND b.rank = d.rank AND d.ts >= b.ts
     AND (d.launch_ts <= b.upto OR d.ts <= b.upto)
    JOIN slices l ON l.run_id = d.run_id AND l.rank = d.rank AND l.slice_id = d.launch_id
    WHERE d.launch_dur > 0
), queue AS (
    -- each stream's queue length after each launch and after each start (HTA counts streams apart by number)
    SELECT run_id, rank, slice_id, at_start,
        CAST(sum(delta) OVER (PARTITION BY run_id, rank, stream ORDER BY t, at_start, slice_id ROWS UNBOUNDED PRECEDING)
            AS BIGINT)
            AS length
    FROM (SELECT run_id, rank, stream, slice_id, launch_ts AS t, 1 AS delta, 0 AS at_start FROM work WHERE queued
          UNION ALL
          SELECT run_id, rank, stream, slice_id, ts, -1, 1 FROM work WHERE queued)
), syncs AS (
    SELECT s.run_id, s.rank, s.slice_id, s.ts, s.dur, s.stream, s.device_id, s.launch_id, l.ts AS launch_ts,
        l.pid AS launch_pid, l.tid AS launch_tid, l.dur AS launch_dur,
        json_extract_string(s.args, '$.cuda_sync_kind') AS sync_kind,
        CAST(json_extract(s.args, '$.wait_on_stream') AS BIGINT) AS wait_on_stream,
        CAST(json_extract(s.args, '$.wait_on_cuda_event_record_corr_id') AS BIGINT) AS record_correlation
    FROM slices s
    JOIN slices l ON l.run_id = s.run_id AND l.rank = s.rank AND l.slice_id = s.launch_id
    WHERE s.kind = 'sync' AND (rank_filter IS NULL OR s.rank = rank_filter)
), recorded AS (
    -- the device event a CUDA event recorded: the last launched on the recorded stream before cudaEventRecord
    SELECT s.run_id, s.rank, s.slice_id, w.slice_id AS waits_on
    FROM syncs s
    JOIN slices r ON r.run_id = s.run_id AND r.rank = s.rank AND r.name = 'cudaEventRecord'
     AND r.correlation = s.record_correlation
    ASOF JOIN (SELECT * FROM work WHERE queued) w
      ON w.run_id = s.run_id AND w.rank = s.rank AND w.device_id = s.device_id AND w.stream = s.wait_on_stream
     AND w.launch_ts <= r.ts
    WHERE s.sync_kind IN ('Event Sync', 'Stream Wait Event')
), stream_waits AS (
    -- cudaStreamWaitEvent: the next device event its thread launches on the waiting stream waits for the recorded one
    SELECT w.run_id, w.rank, w.slice_id, max(rec.waits_on) AS waits_on
    FROM syncs s
    JOIN recorded rec ON rec.run_id = s.run_id AND rec.rank = s.rank AND rec.slice_id = s.slice_id
    ASOF JOIN (SELECT * FROM work WHERE queued) w
      ON w.run_id = s.run_id AND w.rank = s.rank AND w.launch_pid = s.launch_pid AND w.launch_tid = s.launch_tid
     AND w.stream = s.stream AND w.launch_ts >= s.launch_ts
    WHERE s.sync_kind = 'Stream Wait Event'
    GROUP BY w.run_id, w.rank, w.slice_id
), events AS (
    SELECT w.run_id, w.rank, w.window_name, w.instance, w.step, w.ts AS window_ts, w.te AS window_te,
        h.slice_id AS id,
        CASE WHEN h.kind NOT IN ('cpu_op', 'runtime', 'driver') THEN 'range'
             WHEN h.name IN ('cudaDeviceSynchronize', 'cudaStreamSynchronize', 'cudaEventQuery',
                             'cudaEventSynchronize', 'cudaMemcpy', 'cudaMemcpyAsync') THEN 'blocking_op'
             ELSE 'op' END AS role,
        h.ts, h.dur, h.pid, h.tid, NULL::BIGINT AS stream, NULL::BIGINT AS launch, NULL::BIGINT AS queue_at_launch,
        NULL::BIGINT AS queue_at_start, NULL::BIGINT AS waits_on,
        CASE WHEN regexp_matches(h.name, faster) THEN 1 - faster_pct / 100 END AS scale
    FROM windows w
    JOIN slices h ON h.run_id = w.run_id AND h.rank = w.rank AND h.ts BETWEEN w.ts AND w.te
    WHERE h.device_id IS NULL AND h.dur > 0
    UNION ALL
    SELECT w.run_id, w.rank, w.window_name, w.instance, w.step, w.ts, w.te, k.slice_id,
        CASE WHEN k.communication THEN 'communication' ELSE 'device' END, k.ts, k.dur, k.pid, k.tid, k.stream,
        k.launch_id, ql.length, qs.length, sw.waits_on,
        CASE WHEN k.communication AND hide_communication = 1 THEN 0
             WHEN regexp_matches(k.name, faster) THEN 1 - faster_pct / 100 END
    FROM windows w
    JOIN work k ON k.run_id = w.run_id AND k.rank = w.rank AND k.launch_ts BETWEEN w.ts AND w.te
    LEFT JOIN queue ql ON ql.run_id = k.run_id AND ql.rank = k.rank AND ql.slice_id = k.slice_id AND ql.at_start = 0
    LEFT JOIN queue qs ON qs.run_id = k.run_id AND qs.rank = k.rank AND qs.slice_id = k.slice_id AND qs.at_start = 1
    LEFT JOIN stream_waits sw ON sw.run_id = k.run_id AND sw.rank = k.rank AND sw.slice_id = k.slice_id
    UNION ALL
    -- HTA takes a stream's synchronisation with its host call, one on no stream (event, device) by its own start
    SELECT w.run_id, w.rank, w.window_name, w.instance, w.step, w.ts, w.te, s.slice_id,
        CASE s.sync_kind WHEN 'Stream Sync' THEN 'stream_sync' WHEN 'Context Sync' THEN 'context_sync'
            ELSE 'event_sync' END,
        s.ts, s.dur, NULL, NULL, s.stream, s.launch_id, NULL, NULL, rec.waits_on, CASE WHEN remove_syncs = 1 THEN 0 END
    FROM windows w
    JOIN syncs s ON s.run_id = w.run_id AND s.rank = w.rank
     AND CASE WHEN s.stream >= 0 THEN s.launch_ts BETWEEN w.ts AND w.te AND s.launch_dur > 0
              ELSE s.ts BETWEEN w.ts AND w.te AND s.dur > 0 END
    LEFT JOIN recorded rec ON rec.run_id = s.run_id AND rec.rank = s.rank AND rec.slice_id = s.slice_id
    WHERE s.sync_kind IN ('Stream Sync', 'Context Sync', 'Event Sync')
)
SELECT run_id, rank, window_name, instance, step, window_ts, window_te,
    -- in slice_id order: the walk breaks ties between equal paths by it, the same on every run
    list(struct_pack(id, role, ts, dur, pid, tid, stream, launch, queue_at_launch, queue_at_start, waits_on, scale)
         ORDER BY id) AS events
FROM events
GROUP BY run_id, rank, window_name, instance, step, window_ts, window_te;

-- What a critical-path segment is (queries/critical_path.sql's cause), from its edge and the event it belongs to
-- (kind, name, device class): a launch delay, a gap between kernels, a sync wait, a communication kernel, a
-- device copy or memset (or a host cudaMemcpy), a compute kernel, a host call that waits for the device, a
-- launch call, data-loading host work (range_phase), or other host work.
CREATE OR REPLACE MACRO critical_path_cause(edge, kind, name, class) AS (
    CASE WHEN edge IN ('launch', 'kernel_gap', 'sync') THEN edge
         WHEN class = 'communication' THEN 'communication'
         WHEN kind IN ('memcpy', 'memset') OR class = 'memory' THEN 'memory_copy'
         WHEN kind = 'kernel' THEN 'compute'
         WHEN name IN ('cudaDeviceSynchronize', 'cudaStreamSynchronize', 'cudaEventQuery', 'cudaEventSynchronize',
                       'hipDeviceSynchronize', 'hipStreamSynchronize', 'hipEventSynchronize') THEN 'sync'
         WHEN regexp_matches(name, '^(cuda|hip|cu)Memcpy') THEN 'memory_copy'
         WHEN kind IN ('runtime', 'driver') AND contains(name, 'Launch') OR is_queued_launch(name) THEN 'launch'
         WHEN range_phase(name) = 'data_loading' THEN 'input'
         ELSE 'host' END
);
