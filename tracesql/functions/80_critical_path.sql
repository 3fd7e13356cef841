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
    -- an XLA profile without steps (an inference, a few jit calls): each step is its profiled range
    SELECT run_id, rank, '', NULL, trace_start_ns, trace_end_ns FROM ranks
    WHERE annotation IS NULL AND (run_id, rank) NOT IN (SELECT run_id, rank FROM steps)
      AND (run_id, rank) IN (SELECT run_id, rank FROM ops WHERE program_id IS NOT NULL)
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

-- The windows (critical_path_windows') each in every time bucket it overlaps (bucket), a bucket as long as the
-- rank's longest window (width), so at most two a window: what events meet their windows by, an event in the
-- bucket `ts // width` of its rank's width, then by its time. (Joined by the rank alone, each event was compared
-- with every window of its rank: 2.2 M host events x 120 steps at 24x, 0.6-1 CPU-s.) A window's first row is the
-- one of bucket `ts // width`.
CREATE OR REPLACE MACRO window_buckets(annotation := NULL, occurrence := NULL, rank_filter := NULL) AS TABLE
SELECT *, unnest(range(ts // width, te // width + 1)) AS bucket
FROM (SELECT *, greatest(max(te - ts) OVER (PARTITION BY run_id, rank), 1) AS width
      FROM critical_path_windows(annotation := annotation, occurrence := occurrence, rank_filter := rank_filter));

-- Per rank with device work (rank_filter: that rank's only): whether none of it has a launch (device_only_ranks),
-- its longest event and the longest from a launch to its start (what bounds the start times of the work
-- critical_path_event_lists reads).
CREATE OR REPLACE MACRO device_work_ranks(rank_filter := NULL) AS TABLE
SELECT run_id, rank, count(launch_id) = 0 AS device_only, max(dur) AS longest,
    greatest(max(ts - launch_ts), 0) AS longest_wait
FROM slices
WHERE kind IN ('kernel', 'memcpy', 'memset') AND (rank_filter IS NULL OR rank = rank_filter)
GROUP BY run_id, rank;

-- Ranks whose device work has no launches (XLA on TPU and CPU: the device runs the program's ops by itself, no
-- host call puts them on a stream): their device work belongs to the windows it starts in, and the replay is
-- each device's line, its ops in order with their gaps (a device-only replay).
CREATE OR REPLACE MACRO device_only_ranks() AS TABLE
SELECT run_id, rank FROM device_work_ranks() WHERE device_only;

-- The XLA ops each window's device ran (its device events, by their launch or, without one, their start; on a GPU
-- several kernels an op), with their HLO facts (xla_ops): what the XLA findings rules (findings/xla_*.sql) look at.
-- event_name: the device event's name, which the what-if's `faster` matches (a GPU kernel's, not the HLO op's).
CREATE OR REPLACE MACRO xla_window_ops() AS TABLE
SELECT w.run_id, w.rank, w.instance, w.step, a.slice_id, a.name AS event_name, a.device_id, a.op_id, a.dur,
    x.* EXCLUDE (run_id, rank)
FROM critical_path_windows() w
JOIN device_activity() a ON a.run_id = w.run_id AND a.rank = w.rank
 AND COALESCE(a.launch_ts, a.ts) BETWEEN w.ts AND w.te
JOIN ops o ON o.run_id = a.run_id AND o.rank = a.rank AND o.op_id = a.op_id
JOIN xla_ops x ON x.run_id = o.run_id AND x.rank = o.rank AND x.program_id = o.program_id AND x.name = o.name;

-- Host calls that put one device event on a stream (HTA's list of launch calls): the stream's queue grows by one
-- when they run and shrinks by one when the event starts.
CREATE OR REPLACE MACRO is_queued_launch(name) AS (
    name IN ('cudaLaunchKernel', 'cudaLaunchKernelExC', 'cuLaunchKernel', 'cudaMemcpyAsync', 'cudaMemsetAsync',
             'hipLaunchKernel', 'hipExtModuleLaunchKernel', 'hipMemsetAsync', 'hipMemcpyAsync',
             'hipMemcpyWithStream', 'runFunction - job_prep_and_submit_for_execution')
);

-- Per window, the list of its events as critical_path_walk takes them (tracesql/critical_path.py EVENT_FIELDS),
-- unchanged, each with what the what-if's changes look at (critical_path_events applies them): the host events
-- that start in it and last (ops are nodes, other ranges only hold them), the device work those host calls
-- launched, and the synchronisations whose host call is in it. Besides EVENT_FIELDS (scale NULL): name; op_role, a
-- range's role if a change makes it an op; sync_call, a host call that waits for the device (remove_syncs removes
-- it); straggles, host ops other than communication calls and device work other than communication (what
-- straggler_to_median scales). A communication kernel carries its collective instance (collective: a digest of
-- recorded_collective_calls' match_key), for the edges across ranks.
CREATE OR REPLACE MACRO critical_path_event_lists(annotation := NULL, occurrence := NULL, rank_filter := NULL) AS TABLE
WITH buckets AS (
    -- (the events meet their windows by time bucket, then time)
    SELECT * FROM window_buckets(annotation := annotation, occurrence := occurrence, rank_filter := rank_filter)
), windows AS (
    SELECT * EXCLUDE (width, bucket) FROM buckets WHERE bucket = ts // width
), bounds AS (
    SELECT run_id, rank, min(ts) AS ts, max(te) AS te, any_value(width) AS width FROM buckets GROUP BY run_id, rank
), device_ranks AS (
    SELECT * FROM device_work_ranks(rank_filter := rank_filter)
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
), starts AS (
    -- the times the work `line` takes starts between, every rank's: it ends after b.ts, so it started at most
    -- the rank's longest event before; it started by the horizon or was launched by it, then started at most
    -- the rank's longest wait after it (what DuckDB filters the read of device work by; without it one step
    -- read every device event of the run)
    SELECT min(h.ts - r.longest) AS first_start, max(h.upto + r.longest_wait) AS last_start
    FROM horizon h JOIN device_ranks r ON r.run_id = h.run_id AND r.rank = h.rank
), device_only AS (
    SELECT run_id, rank FROM device_ranks WHERE device_only
), line AS (
    -- the device work that ends after the rank's first window starts, and when its stream was free: the end of
    -- the event before it on its stream (for the what-if replay, work launched before the window that the
    -- window's work queues behind). Work whose launch the trace lacks (launched before the profile began) holds
    -- its stream all the same
    SELECT d.*, lag(d.ts + d.dur) OVER (PARTITION BY d.run_id, d.rank, d.stream ORDER BY d.ts, d.slice_id) AS stream_free
    FROM device_activity() d
    JOIN starts s ON d.ts >= s.first_start AND d.ts <= s.last_start
    JOIN horizon b ON b.run_id = d.run_id AND b.rank = d.rank AND d.ts + d.dur >= b.ts
     AND (d.launch_ts <= b.upto OR d.ts <= b.upto)
), work AS (
    -- of it, what the windows launched, and all the queue lengths need (work that started before has left its
    -- stream's queue: its launch and start add 0)
    -- (a device-only rank's line is its device: XLA runs a program's ops one at a time on a TPU core, and on
    -- the CPU on whichever thread of its pool is free, the threads' lines never overlapping)
    SELECT d.run_id, d.rank, d.slice_id, d.name, d.ts, d.dur, d.pid, d.tid,
        CASE WHEN o.rank IS NULL THEN d.stream ELSE CAST(hash(d.device_id) >> 1 AS BIGINT) END AS stream,
        d.device_id, d.launch_id, d.launch_ts, d.launch_dur, d.launch_pid, d.launch_tid, is_queued_launch(l.name) AS queued,
        d.class = 'communication' AS communication, d.stream_free
    FROM line d
    LEFT JOIN device_only o ON o.run_id = d.run_id AND o.rank = d.rank
    LEFT JOIN (
        -- (the launches' ids bounded: what DuckDB filters the read of every slice's name by; and the line's
        -- launches only, so that the join is built on them, not on every slice between: 0.68 -> 0.27 CPU-s at 24x)
        SELECT l.run_id, l.rank, l.slice_id, l.name
        FROM slices l
        JOIN (SELECT min(launch_id) AS first_id, max(launch_id) AS last_id FROM line) i
          ON l.slice_id >= i.first_id AND l.slice_id <= i.last_id
        WHERE (l.run_id, l.rank, l.slice_id) IN (SELECT run_id, rank, launch_id FROM line)
    ) l ON l.run_id = d.run_id AND l.rank = d.rank AND l.slice_id = d.launch_id
    WHERE d.launch_dur > 0 AND l.slice_id IS NOT NULL OR o.rank IS NOT NULL
), queue AS (
    -- each stream's queue length after each launch and after each start (HTA counts streams apart by number)
    SELECT run_id, rank, stream, slice_id, at_start,
        CAST(sum(delta) OVER (PARTITION BY run_id, rank, stream ORDER BY t, at_start, slice_id ROWS UNBOUNDED PRECEDING)
            AS BIGINT)
            AS length
    FROM (SELECT run_id, rank, stream, slice_id, launch_ts AS t, 1 AS delta, 0 AS at_start FROM work WHERE queued
          UNION ALL
          SELECT run_id, rank, stream, slice_id, ts, -1, 1 FROM work WHERE queued)
), blocked AS (
    -- launch calls that waited for room in a full launch queue (for the replay: they end when the device frees
    -- it, not after a time of their own): the stream's queue was at its depth after them (within 1 % of the most
    -- it held, and that 64 or more: CUDA's holds about 1,000; HTA's ns_resolution_trace: 1,022) and they lasted
    -- 10 × the rank's median launch call or more (there: 125 µs against 5 µs)
    -- (the depths and medians grouped, then joined: as windows over the launches, 0.23 CPU-s at 24x)
    SELECT w.run_id, w.rank, w.launch_id AS slice_id
    FROM (SELECT w.run_id, w.rank, w.stream, w.launch_id, w.launch_dur, q.length
          FROM work w
          JOIN queue q ON q.run_id = w.run_id AND q.rank = w.rank AND q.slice_id = w.slice_id AND q.at_start = 0
          WHERE w.queued) w
    JOIN (SELECT run_id, rank, stream, max(length) AS depth FROM queue WHERE at_start = 0 GROUP BY ALL) d
      ON d.run_id = w.run_id AND d.rank = w.rank AND d.stream = w.stream
    JOIN (SELECT run_id, rank, median(launch_dur) AS typical_ns FROM work WHERE queued GROUP BY ALL) t
      ON t.run_id = w.run_id AND t.rank = w.rank
    WHERE w.length >= 0.99 * d.depth AND d.depth >= 64 AND w.launch_dur >= 10 * t.typical_ns
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
), collective_kernels AS (
    -- each communication kernel's collective instance: the call on its stream whose device time holds its start.
    -- A stream runs its calls one after another, so that is the latest call to start by then, if it has not ended
    -- (an ASOF join: a join on the stream and the time range compared each kernel with every call on its stream,
    -- 48 k × 48 k on the 24× tile)
    SELECT k.run_id, k.rank, k.slice_id, CASE WHEN k.ts < c.device_te THEN c.collective END AS collective
    FROM work k
    ASOF JOIN (SELECT run_id, rank, stream, device_ts, device_ts + device_dur AS device_te,
                      CAST(hash(match_key) >> 1 AS BIGINT) AS collective
               FROM recorded_collective_calls() WHERE device_ts IS NOT NULL) c
      ON c.run_id = k.run_id AND c.rank = k.rank AND c.stream = k.stream AND k.ts >= c.device_ts
    WHERE k.communication
), launched AS (
    -- the device work each window's host calls launched; a communication kernel with its collective instance
    SELECT w.run_id, w.rank, w.window_name, w.instance, w.step, w.ts AS window_ts, w.te AS window_te,
        COALESCE(w.step, w.instance) AS joint, k.* EXCLUDE (run_id, rank, bucket), c.collective
    FROM buckets w
    JOIN (SELECT k.*, COALESCE(k.launch_ts, k.ts) // b.width AS bucket
          FROM work k JOIN bounds b ON b.run_id = k.run_id AND b.rank = k.rank) k
      ON k.run_id = w.run_id AND k.rank = w.rank AND k.bucket = w.bucket
     AND COALESCE(k.launch_ts, k.ts) BETWEEN w.ts AND w.te
    LEFT JOIN collective_kernels c ON c.run_id = k.run_id AND c.rank = k.rank AND c.slice_id = k.slice_id
), waiting AS (
    -- the host calls that wait for the device (blocking calls; launch calls blocked on a full queue) with the end
    -- of the last device work that ended while they ran (the walk reads it of these only)
    SELECT h.run_id, h.rank, h.slice_id, h.name IN ('cudaDeviceSynchronize', 'cudaStreamSynchronize', 'cudaEventQuery',
            'cudaEventSynchronize', 'cudaMemcpy', 'cudaMemcpyAsync') AS blocking,
        bl.slice_id IS NOT NULL AS blocked, CASE WHEN e.te > h.ts THEN e.te END AS stream_free
    FROM slices h
    JOIN bounds b ON b.run_id = h.run_id AND b.rank = h.rank AND h.ts BETWEEN b.ts AND b.te
    LEFT JOIN blocked bl ON bl.run_id = h.run_id AND bl.rank = h.rank AND bl.slice_id = h.slice_id
    ASOF LEFT JOIN (SELECT run_id, rank, ts + dur AS te FROM line) e
      ON e.run_id = h.run_id AND e.rank = h.rank AND e.te <= h.ts + h.dur
    WHERE h.device_id IS NULL AND h.dur > 0
      AND (h.name IN ('cudaDeviceSynchronize', 'cudaStreamSynchronize', 'cudaEventQuery', 'cudaEventSynchronize',
                      'cudaMemcpy', 'cudaMemcpyAsync') OR bl.slice_id IS NOT NULL)
), events AS (
    SELECT w.run_id, w.rank, w.window_name, w.instance, w.step, w.ts AS window_ts, w.te AS window_te,
        h.slice_id AS id, h.name,
        -- (a range the what-if changes, `faster`: e.g. a data loader's `enumerate(DataLoader)#...` annotation, is
        -- an op of its own, op_role, so that its own time, between its child ops, scales)
        CASE WHEN h.kind NOT IN ('cpu_op', 'runtime', 'driver') THEN 'range'
             WHEN h.blocking THEN 'blocking_op' WHEN h.blocked THEN 'blocked_launch' ELSE 'op' END AS role,
        CASE WHEN h.blocking THEN 'blocking_op' WHEN h.blocked THEN 'blocked_launch' ELSE 'op' END AS op_role,
        h.ts, h.dur, h.pid, h.tid, NULL::BIGINT AS stream, NULL::BIGINT AS launch, NULL::BIGINT AS queue_at_launch,
        NULL::BIGINT AS queue_at_start, NULL::BIGINT AS waits_on,
        h.stream_free,
        is_sync_call(h.kind, h.name) AS sync_call,
        h.kind = 'cpu_op' AND NOT is_communication_call(h.name) AS straggles,
        NULL::BIGINT AS collective
    FROM buckets w
    -- (the waiting calls joined to the host events first: joined after the windows, whose rows DuckDB guessed a
    -- handful, the join was built on the 2.2 M host events at 24x, not on the few waiting calls)
    JOIN (SELECT h.*, h.ts // b.width AS bucket, wt.blocking, wt.blocked, wt.stream_free
          FROM slices h
          JOIN bounds b ON b.run_id = h.run_id AND b.rank = h.rank
          LEFT JOIN waiting wt ON wt.run_id = h.run_id AND wt.rank = h.rank AND wt.slice_id = h.slice_id
          WHERE h.device_id IS NULL AND h.dur > 0) h
      ON h.run_id = w.run_id AND h.rank = w.rank AND h.bucket = w.bucket AND h.ts BETWEEN w.ts AND w.te
    -- (a device-only rank's host work leads to none of its device work: the replay is its devices' alone)
    WHERE (w.run_id, w.rank) NOT IN (SELECT run_id, rank FROM device_only)
    UNION ALL
    SELECT k.run_id, k.rank, k.window_name, k.instance, k.step, k.window_ts, k.window_te, k.slice_id, k.name,
        CASE WHEN k.communication THEN 'communication' ELSE 'device' END, NULL, k.ts, k.dur, k.pid, k.tid, k.stream,
        k.launch_id, ql.length, qs.length, sw.waits_on, k.stream_free, false, NOT k.communication, k.collective
    FROM launched k
    LEFT JOIN queue ql ON ql.run_id = k.run_id AND ql.rank = k.rank AND ql.slice_id = k.slice_id AND ql.at_start = 0
    LEFT JOIN queue qs ON qs.run_id = k.run_id AND qs.rank = k.rank AND qs.slice_id = k.slice_id AND qs.at_start = 1
    LEFT JOIN stream_waits sw ON sw.run_id = k.run_id AND sw.rank = k.rank AND sw.slice_id = k.slice_id
    UNION ALL
    -- HTA takes a stream's synchronisation with its host call, one on no stream (event, device) by its own start
    SELECT w.run_id, w.rank, w.window_name, w.instance, w.step, w.ts, w.te, s.slice_id, NULL,
        CASE s.sync_kind WHEN 'Stream Sync' THEN 'stream_sync' WHEN 'Context Sync' THEN 'context_sync'
            ELSE 'event_sync' END,
        NULL, s.ts, s.dur, NULL, NULL, s.stream, s.launch_id, NULL, NULL, rec.waits_on, NULL, true, false, NULL
    FROM windows w
    JOIN syncs s ON s.run_id = w.run_id AND s.rank = w.rank
     AND CASE WHEN s.stream >= 0 THEN s.launch_ts BETWEEN w.ts AND w.te AND s.launch_dur > 0
              ELSE s.ts BETWEEN w.ts AND w.te AND s.dur > 0 END
    LEFT JOIN recorded rec ON rec.run_id = s.run_id AND rec.rank = s.rank AND rec.slice_id = s.slice_id
    WHERE s.sync_kind IN ('Stream Sync', 'Context Sync', 'Event Sync')
)
SELECT run_id, rank, window_name, instance, step, window_ts, window_te,
    -- in no order (an ordered list took a third of this macro's time): critical_path_walk takes the events in
    -- (rank, slice_id) order, by which it breaks ties between equal paths, the same on every run
    list(struct_pack(id, role, ts, dur, pid, tid, stream, launch, queue_at_launch, queue_at_start, waits_on,
                     stream_free, scale := NULL::DOUBLE, rank := CAST(rank AS BIGINT), collective, name, op_role,
                     sync_call, straggles)) AS events,
    -- the end of its last node (op or device work; ranges and syncs are none): the what-if's measured time ends
    -- no earlier (a list_max over the list took 1 CPU-s at 24x)
    max(ts + dur) FILTER (WHERE role NOT IN ('range', 'stream_sync', 'context_sync', 'event_sync')) AS work_end,
    -- the time of its device work other than communication (NULL: none), which straggler_to_median compares
    -- across the ranks (critical_path_scales; summed from the list there, it read every event again: 0.8 s at 24x)
    CAST(sum(dur) FILTER (WHERE role = 'device') AS BIGINT) AS device_ns,
    -- a key of the list (none here): where `tracesql findings` has walked it ahead, what_if finds its walks by it
    -- without reading the events again (critical_path_replay_lengths; tracesql/findings.py sets it)
    NULL::UBIGINT AS walk_key
FROM events
GROUP BY run_id, rank, window_name, instance, step, window_ts, window_te;

-- What critical_path_events reads: critical_path_event_lists, or, while `tracesql findings` runs its rules, the
-- lists of the default windows it computed once for all of them (tracesql/findings.py replaces this macro).
CREATE OR REPLACE MACRO critical_path_event_source(annotation := NULL, occurrence := NULL, rank_filter := NULL) AS TABLE
FROM critical_path_event_lists(annotation := annotation, occurrence := occurrence, rank_filter := rank_filter);

-- Per window, the scale of each of its events (a list in the order of the events' list; NULL where the change
-- changes nothing) under the what-if's changes, which critical_path_events gives its events: `faster` (a regex
-- of kernel, op or host range names) takes faster_pct % off their time; hide_communication = 1 makes
-- communication kernels weigh 0; remove_syncs = 1 removes the synchronisations and the host calls that wait for
-- them (scale 0: the host no longer waits for the device); straggler_to_median = 1: in each step (annotation
-- instance) of several ranks, the rank whose device work other than communication took the longest (the
-- straggler) does it as fast as the median of the other ranks (its kernels and copies scaled by that median ÷ its
-- time: straggler_scale, on the window of the straggler's rank); in a step without device work (CPU ranks), the
-- rank whose host ops other than communication calls took the longest own time (straggler_on_host). reroled:
-- whether `faster` made a range of the window an op (its graph is not the unchanged one). With the event source's
-- columns. The scales are tracesql/critical_path.py change_scales' (the SQL function critical_path_event_scales),
-- which `tracesql findings` computes of its event lists for each of its rules' changes (of the straggler's scale
-- it reads only straggler_scale and straggler_on_host here: DuckDB then calls no function).
CREATE OR REPLACE MACRO critical_path_scales(annotation := NULL, occurrence := NULL, rank_filter := NULL,
        faster := NULL, faster_pct := 0, hide_communication := 0, remove_syncs := 0, straggler_to_median := 0) AS TABLE
WITH lists AS (
    SELECT *, COALESCE(step, instance) AS joint
    FROM critical_path_event_source(annotation := annotation, occurrence := occurrence, rank_filter := rank_filter)
), device_time AS (
    SELECT run_id, window_name, joint, rank, sum(device_ns) AS busy_ns
    FROM lists
    WHERE straggler_to_median = 1 AND device_ns IS NOT NULL
    GROUP BY ALL
), host_time AS (
    -- a step in which no rank ran device work (CPU ranks, e.g. over gloo): each rank's own time in host ops other
    -- than communication calls (what the straggler's scale then applies to)
    SELECT w.run_id, w.window_name, COALESCE(w.step, w.instance) AS joint, w.rank, sum(o.self_dur) AS busy_ns
    FROM critical_path_windows(annotation := annotation, occurrence := occurrence, rank_filter := rank_filter) w
    JOIN ops o ON o.run_id = w.run_id AND o.rank = w.rank AND o.ts BETWEEN w.ts AND w.te
    ANTI JOIN device_time d ON d.run_id = w.run_id AND d.window_name = w.window_name
     AND d.joint = COALESCE(w.step, w.instance)
    WHERE straggler_to_median = 1 AND NOT is_communication_call(o.name)
    GROUP BY ALL
), stragglers AS (
    -- per step of several ranks: the rank with the most device work (none: host work), scaled to the median of
    -- the others'
    SELECT s.run_id, s.window_name, s.joint, s.rank, s.on_host, median(o.busy_ns) / NULLIF(s.busy_ns, 0) AS scale
    FROM (SELECT *, row_number() OVER (PARTITION BY run_id, window_name, joint ORDER BY busy_ns DESC, rank) AS n
          FROM (SELECT *, false AS on_host FROM device_time UNION ALL SELECT *, true FROM host_time)) s
    JOIN (SELECT * FROM device_time UNION ALL SELECT * FROM host_time) o
      ON o.run_id = s.run_id AND o.window_name = s.window_name AND o.joint = s.joint AND o.rank <> s.rank
    WHERE s.n = 1 AND straggler_to_median = 1
    GROUP BY s.run_id, s.window_name, s.joint, s.rank, s.on_host, s.busy_ns
), straggling AS (
    SELECT l.* EXCLUDE (joint), CASE WHEN l.rank = st.rank THEN st.scale END AS straggler_scale,
        st.on_host AS straggler_on_host
    FROM lists l
    LEFT JOIN stragglers st ON st.run_id = l.run_id AND st.window_name = l.window_name AND st.joint = l.joint
)
SELECT * EXCLUDE (changed), changed.scales, COALESCE(changed.reroled, false) AS reroled
FROM (
    SELECT *,
        CASE WHEN faster IS NOT NULL OR hide_communication = 1 OR remove_syncs = 1 OR straggler_to_median = 1
             THEN critical_path_event_scales(events, CAST(faster AS VARCHAR), faster_pct, hide_communication,
                                             remove_syncs, straggler_scale, straggler_on_host)
        END AS changed
    FROM straggling
);

-- A window's events as critical_path_walk takes them (tracesql/critical_path.py EVENT_FIELDS) of its listed events
-- (critical_path_event_lists'): each with its scale (scales: a list in their order; NULL: none), and a range that
-- `faster` names an op of its own (its op_role).
CREATE OR REPLACE MACRO critical_path_walk_events(events, scales, faster) AS
    [struct_pack(id := e.id,
                 role := CASE WHEN e.role = 'range' AND COALESCE(regexp_matches(e.name, faster), false) THEN e.op_role
                              ELSE e.role END,
                 ts := e.ts, dur := e.dur, pid := e.pid, tid := e.tid, stream := e.stream, launch := e.launch,
                 queue_at_launch := e.queue_at_launch, queue_at_start := e.queue_at_start, waits_on := e.waits_on,
                 stream_free := e.stream_free, scale := scales[i], rank := e.rank, collective := e.collective)
     FOR e, i IN events];

-- Per window, the list of its events as critical_path_walk takes them (critical_path_walk_events), with the
-- what-if's changes (critical_path_scales: each event's scale; a range that `faster` names is an op of its own),
-- and the end of its last node (work_end). The changes take effect when critical_path_walk is given a
-- gaps_scale. walked_ahead := 1: NULL (no list made) where the window's unchanged walks are walked ahead
-- (critical_path_walked_ahead: `tracesql findings` walks them before its rules run), for a caller that reads
-- those walks only (what_if's unchanged replays; making the lists took 0.8 of the 4.3 CPU-s it took at 24x).
CREATE OR REPLACE MACRO critical_path_events(annotation := NULL, occurrence := NULL, rank_filter := NULL,
        faster := NULL, faster_pct := 0, hide_communication := 0, remove_syncs := 0, straggler_to_median := 0,
        walked_ahead := 0) AS TABLE
SELECT run_id, rank, window_name, instance, step, window_ts, window_te,
    CASE WHEN walked_ahead = 1 AND NOT reroled AND critical_path_walked_ahead(walk_key) THEN NULL
         ELSE critical_path_walk_events(events, scales, faster) END AS events,
    reroled,
    -- (a range `faster` makes an op is a node: its end counts)
    CASE WHEN reroled THEN greatest(work_end, list_max([e.ts + e.dur FOR e IN events
                                                        IF e.role = 'range' AND regexp_matches(e.name, faster)]))
         ELSE work_end END AS work_end,
    -- (the walk of a graph the change made anew is no unchanged one's)
    CASE WHEN NOT reroled THEN walk_key END AS walk_key
FROM critical_path_scales(annotation := annotation, occurrence := occurrence, rank_filter := rank_filter,
    faster := faster, faster_pct := faster_pct, hide_communication := hide_communication, remove_syncs := remove_syncs,
    straggler_to_median := straggler_to_median);

-- The host calls that wait for the device: critical_path_cause's 'sync' of a host call
CREATE OR REPLACE MACRO is_sync_call_name(name) AS (
    name IN ('cudaDeviceSynchronize', 'cudaStreamSynchronize', 'cudaEventQuery', 'cudaEventSynchronize',
             'hipDeviceSynchronize', 'hipStreamSynchronize', 'hipEventSynchronize')
);

-- What a critical-path segment is (queries/critical_path.sql's cause), from its edge and the event it belongs to
-- (kind, name, device class): a launch delay, a gap between kernels, a sync wait, a communication kernel, a
-- device copy or memset (or a host cudaMemcpy), a compute kernel, a host call that waits for the device, a
-- launch call, data-loading host work (range_phase), or other host work.
CREATE OR REPLACE MACRO critical_path_cause(edge, kind, name, class) AS (
    CASE WHEN edge IN ('launch', 'kernel_gap', 'sync') THEN edge
         WHEN class = 'communication' THEN 'communication'
         WHEN kind IN ('memcpy', 'memset') OR class = 'memory' THEN 'memory_copy'
         WHEN kind = 'kernel' THEN 'compute'
         WHEN is_sync_call_name(name) THEN 'sync'
         WHEN regexp_matches(name, '^(cuda|hip|cu)Memcpy') THEN 'memory_copy'
         WHEN kind IN ('runtime', 'driver') AND contains(name, 'Launch') OR is_queued_launch(name) THEN 'launch'
         WHEN range_phase(name) = 'data_loading' THEN 'input'
         ELSE 'host' END
);

-- Whether a host event (kind, name) is a call that waits for the device (critical_path_cause's 'sync'): asked of
-- every host event of the steps (critical_path_event_lists, findings/host_sync.sql), whose cause matched each
-- name against the cause's patterns, 0.7 CPU-s over the 24× tile's 3 M host events; the CASE asks the few with a
-- synchronising name only.
CREATE OR REPLACE MACRO is_sync_call(kind, name) AS (
    CASE WHEN is_sync_call_name(name) THEN critical_path_cause(NULL, kind, name, NULL) = 'sync' ELSE false END
);

-- HTA's critical path of each default window (each step) of each rank (rank_filter: of that rank's only), one row
-- per segment (s: critical_path_walk's): where the findings rules host_op and idle_bubbles look for the host work
-- the steps waited for. `tracesql findings` walks them once for its rules (tracesql/findings.py replaces this
-- macro while they run).
CREATE OR REPLACE MACRO step_critical_paths(rank_filter := NULL) AS TABLE
SELECT run_id, rank, instance, unnest(critical_path_walk(events, NULL, NULL)) AS s
FROM critical_path_events(rank_filter := rank_filter);

-- HTA's critical path of each default window walked ahead (critical_path_walked_ahead), as step_critical_paths'
-- rows, where the caller has them: `tracesql findings` walks them before its rules run and what_if reads them here
-- (tracesql/findings.py replaces this macro while they run). Else none. (s: critical_path.SEGMENT_FIELDS, spelt
-- out: the macros are also made where the Python functions are not, and critical_path_walk's type is not known)
CREATE OR REPLACE MACRO step_critical_paths_walked() AS TABLE
SELECT NULL::VARCHAR AS run_id, NULL::INTEGER AS rank, NULL::INTEGER AS instance,
    NULL::STRUCT(seq INTEGER, event_id BIGINT, ts BIGINT, dur_ns BIGINT, edge VARCHAR, bound_by VARCHAR,
                 path_rank BIGINT, rank BIGINT) AS s
WHERE false;

-- What the what-if's windows measure and replay without a change (the what_if macro's columns but the predicted
-- time and the saving), where its caller has them already: `tracesql findings` computes them once for all its
-- rules (tracesql/findings.py replaces this macro while they run; each rule's what-if then walks its changed
-- replay only). Else none: what_if computes them.
CREATE OR REPLACE MACRO what_if_unchanged(annotation := NULL, occurrence := NULL) AS TABLE
SELECT NULL::VARCHAR AS run_id, NULL::INTEGER AS rank, NULL::VARCHAR AS window_name, NULL::INTEGER AS instance,
    NULL::INTEGER AS step, NULL::BIGINT AS range_ns, NULL::BIGINT AS measured_ns, NULL::BIGINT AS replayed_ns,
    NULL::BIGINT AS path_ns, NULL::VARCHAR AS bound, NULL::DOUBLE AS compute_share,
    NULL::DOUBLE AS communication_share, NULL::DOUBLE AS host_launch_share, NULL::DOUBLE AS input_share,
    NULL::DOUBLE AS sync_share, NULL::DOUBLE AS memory_copy_share, NULL::BIGINT AS remote_ns,
    NULL::INTEGER AS remote_rank
WHERE false;

-- A what-if's change (the what_if macro's parameters that change the replay) as one string, the same for equal
-- changes (faster_pct as a DOUBLE; without `faster` it changes nothing, and is left out): how `tracesql findings`
-- names the changes it prices together, each walked once.
CREATE OR REPLACE MACRO what_if_change_key(faster, faster_pct, hide_communication, no_launch_overhead, remove_syncs,
        straggler_to_median) AS (
    concat_ws(chr(31), COALESCE(CAST(faster AS VARCHAR), chr(0)),
              CASE WHEN faster IS NULL THEN chr(0) ELSE COALESCE(CAST(CAST(faster_pct AS DOUBLE) AS VARCHAR), chr(0)) END,
              COALESCE(CAST(hide_communication AS VARCHAR), chr(0)), COALESCE(CAST(no_launch_overhead AS VARCHAR), chr(0)),
              COALESCE(CAST(remove_syncs AS VARCHAR), chr(0)), COALESCE(CAST(straggler_to_median AS VARCHAR), chr(0)))
);

-- The change of a call of the what_if macro (its parameters and their defaults): whether it replays the default
-- windows (each step), the values of its change (faster_pct 0 without `faster`: it changes nothing) and their key
-- (what_if_change_key). `tracesql findings` asks it of each rule's call of what_if with the call's own arguments,
-- to price every rule's change at once.
CREATE OR REPLACE MACRO what_if_change(annotation := NULL, occurrence := NULL, rank_filter := NULL, faster := NULL,
        faster_pct := 0, hide_communication := 0, no_launch_overhead := 0, remove_syncs := 0,
        straggler_to_median := 0, replay := 1) AS TABLE
SELECT annotation IS NULL AND occurrence IS NULL AND replay = 1 AS default_windows, CAST(faster AS VARCHAR) AS faster,
    CAST(CASE WHEN faster IS NULL THEN 0 ELSE faster_pct END AS DOUBLE) AS faster_pct,
    CAST(hide_communication AS INTEGER) AS hide_communication,
    CAST(no_launch_overhead AS INTEGER) AS no_launch_overhead, CAST(remove_syncs AS INTEGER) AS remove_syncs,
    CAST(straggler_to_median AS INTEGER) AS straggler_to_median,
    what_if_change_key(faster, faster_pct, hide_communication, no_launch_overhead, remove_syncs, straggler_to_median)
        AS key;

-- Whether the predicted time of each default window (each step) with this change is known (what_if_predicted):
-- while `tracesql findings` runs its rules, of the changes it priced together (tracesql/findings.py replaces
-- these two macros: what_if then walks nothing; an expression of constants, so that what_if's own walk is
-- planned away). Else none.
CREATE OR REPLACE MACRO what_if_priced(faster, faster_pct, hide_communication, no_launch_overhead, remove_syncs,
        straggler_to_median) AS false;

CREATE OR REPLACE MACRO what_if_predicted(faster, faster_pct, hide_communication, no_launch_overhead, remove_syncs,
        straggler_to_median) AS TABLE
SELECT NULL::VARCHAR AS run_id, NULL::INTEGER AS rank, NULL::VARCHAR AS window_name, NULL::INTEGER AS instance,
    NULL::BIGINT AS predicted_ns
WHERE false;

-- The saving of a what-if in % of the replayed time (the what_if macro's saving_pct)
CREATE OR REPLACE MACRO what_if_saving_pct(replayed_ns, predicted_ns) AS
    round(100 * (replayed_ns - predicted_ns) / replayed_ns, 2);

-- The what_if query's rows (see queries/what_if.sql, which documents the parameters and columns): each window
-- replayed unchanged and with the changes, its measured, replayed and predicted time, and what bounds its
-- critical path. A table macro so that the findings rules (findings/*.sql) price their causes with it. The
-- replay takes the windows of one step (else annotation instance) of every rank together (the ranks wait for
-- each other at collectives); rank_filter only picks the rows shown. replay := 0: no replay (replayed_ns,
-- predicted_ns and what follows from them NULL), only the critical path's verdict: the bound query's. predict
-- := 0: the unchanged replay only (predicted_ns and saving NULL): what `tracesql findings` keeps of it for its
-- rules (_unchanged_once), without walking (or looking up) each step's replay a second time, 1-2 s at 24x.
CREATE OR REPLACE MACRO what_if(annotation := NULL, occurrence := NULL, rank_filter := NULL, faster := NULL,
        faster_pct := 0, hide_communication := 0, no_launch_overhead := 0, remove_syncs := 0,
        straggler_to_median := 0, replay := 1, predict := 1) AS TABLE
WITH windows AS (
    -- (none where the change's predicted times are known: the unchanged rows are then the caller's, `known`)
    SELECT *, COALESCE(step, instance) AS joint
    FROM critical_path_events(annotation := annotation, occurrence := occurrence,
        faster := faster, faster_pct := faster_pct, hide_communication := hide_communication,
        remove_syncs := remove_syncs, straggler_to_median := straggler_to_median,
        -- (the unchanged replay only, of windows no change made anew: their walks walked ahead are all it reads)
        walked_ahead := CASE WHEN predict = 0 AND faster IS NULL THEN 1 ELSE 0 END)
    WHERE NOT (annotation IS NULL AND occurrence IS NULL AND replay = 1
               AND what_if_priced(faster, faster_pct, hide_communication, no_launch_overhead, remove_syncs,
                                  straggler_to_median))
), known AS (
    -- the windows' unchanged rows the caller has (what_if_unchanged)
    SELECT *, COALESCE(step, instance) AS joint
    FROM what_if_unchanged(annotation := annotation, occurrence := occurrence)
    WHERE replay = 1
), fresh AS (
    -- the steps (else annotation instances) whose unchanged replay and paths are walked here: those with a window
    -- the caller has no row of, or whose change makes a range an op (their graphs change)
    SELECT w.run_id, w.window_name, w.joint
    FROM windows w
    LEFT JOIN known k ON k.run_id = w.run_id AND k.rank = w.rank AND k.window_name = w.window_name
     AND k.instance = w.instance
    GROUP BY ALL
    HAVING bool_or(w.reroled OR k.run_id IS NULL)
), shared AS (
    -- the steps (else annotation instances) of several ranks
    SELECT run_id, window_name, joint FROM windows WHERE replay = 1 GROUP BY ALL HAVING count(*) > 1
), joint AS (
    -- each step's windows and their events together: one rank's list as it is (a copy of it, made by a list of
    -- one, took 4 of a what-if's 8 CPU-s on the 24× tile, most in critical_path_walk reading it), several
    -- ranks' joined (in any order: critical_path_walk takes the events by rank, then id, and the windows by rank)
    SELECT run_id, window_name, joint, window_ts AS joint_ts, events,
        [struct_pack(rank := CAST(rank AS BIGINT), ts := window_ts, te := window_te)] AS spans, [walk_key] AS walk_keys
    FROM windows
    WHERE replay = 1 AND (run_id, window_name, joint) NOT IN (SELECT (run_id, window_name, joint) FROM shared)
    UNION ALL
    SELECT run_id, window_name, joint, min(window_ts) AS joint_ts, flatten(list(events)) AS events,
        list(struct_pack(rank := CAST(rank AS BIGINT), ts := window_ts, te := window_te)) AS spans,
        list(walk_key ORDER BY rank) AS walk_keys
    FROM windows
    WHERE replay = 1 AND (run_id, window_name, joint) IN (SELECT (run_id, window_name, joint) FROM shared)
    GROUP BY ALL
), replays AS (
    -- each rank's path in the step's replay without the change and with it: its length, the part on other ranks'
    -- work and whose (critical_path_replay_lengths: their sums, not their segments; without a change the
    -- predicted replay is the unchanged one, the walk the one it kept, critical_path._WALKED; one walked ahead is
    -- found by its keys, its events not read)
    SELECT run_id, window_name, joint, joint_ts,
        CASE WHEN (run_id, window_name, joint) IN (SELECT (run_id, window_name, joint) FROM fresh)
             THEN critical_path_replay_lengths(events, spans, NULL, walk_keys) END AS replayed,
        CASE WHEN predict = 1
             THEN critical_path_replay_lengths(events, spans, CASE WHEN no_launch_overhead = 1 THEN 0.0 ELSE 1.0 END,
                                               NULL) END AS predicted
    FROM joint
), replayed AS (
    -- (a path's length from the earliest window start)
    SELECT run_id, window_name, joint, joint_ts, r.rank, r.length_ns, r.remote_ns, r.remote_rank
    FROM (SELECT run_id, window_name, joint, joint_ts, unnest(replayed) AS r FROM replays)
), predicted AS (
    SELECT w.run_id, w.rank, w.window_name, w.instance, p.r.length_ns - (w.window_ts - p.joint_ts) AS predicted_ns
    FROM windows w
    JOIN (SELECT run_id, window_name, joint, joint_ts, unnest(predicted) AS r FROM replays) p
      ON p.run_id = w.run_id AND p.window_name = w.window_name AND p.joint = w.joint AND p.r.rank = w.rank
    UNION ALL
    SELECT run_id, rank, window_name, instance, predicted_ns
    FROM what_if_predicted(faster, faster_pct, hide_communication, no_launch_overhead, remove_syncs,
                           straggler_to_median)
    WHERE annotation IS NULL AND occurrence IS NULL AND replay = 1
      AND what_if_priced(faster, faster_pct, hide_communication, no_launch_overhead, remove_syncs, straggler_to_median)
), walked AS (
    -- the fresh steps' windows: the end of their last node (op or device work; ranges and syncs are none), the
    -- replayed time
    SELECT w.run_id, w.rank, w.window_name, w.instance, w.step, w.window_ts, w.window_te, w.work_end,
        r.length_ns - (w.window_ts - r.joint_ts) AS replayed_ns, r.remote_ns, r.remote_rank
    FROM windows w
    -- (a window with nothing to replay keeps its row: measured, with no replay)
    LEFT JOIN replayed r ON r.run_id = w.run_id AND r.window_name = w.window_name AND r.joint = w.joint AND r.rank = w.rank
    WHERE (rank_filter IS NULL OR w.rank = rank_filter)
      AND (w.run_id, w.window_name, w.joint) IN (SELECT (run_id, window_name, joint) FROM fresh)
), paths AS (
    -- their HTA paths' segments: of a default window walked ahead, its caller's (step_critical_paths_walked),
    -- else walked here
    SELECT w.run_id, w.rank, w.window_name, w.instance, p.s
    FROM windows w
    JOIN step_critical_paths_walked() p ON p.run_id = w.run_id AND p.rank = w.rank AND p.instance = w.instance
    WHERE annotation IS NULL AND occurrence IS NULL AND critical_path_walked_ahead(w.walk_key)
      AND (rank_filter IS NULL OR w.rank = rank_filter)
      AND (w.run_id, w.window_name, w.joint) IN (SELECT (run_id, window_name, joint) FROM fresh)
    UNION ALL
    SELECT run_id, rank, window_name, instance, unnest(critical_path_walk(events, NULL, NULL)) AS s
    FROM windows
    WHERE NOT (annotation IS NULL AND occurrence IS NULL AND COALESCE(critical_path_walked_ahead(walk_key), false))
      AND (rank_filter IS NULL OR rank = rank_filter)
      AND (run_id, window_name, joint) IN (SELECT (run_id, window_name, joint) FROM fresh)
), causes AS (
    -- (the segments summed by edge and event kind, name and class first: critical_path_cause on each of the 24×
    -- tile's 2.8 M segments took 1.7 CPU-s, on these sums a few hundred rows a window. Where the runs stored
    -- their classes, a device event's is device_activity's: the join with it, 0.45 CPU-s at 24x, is planned away)
    SELECT run_id, rank, window_name, instance,
        CASE critical_path_cause(edge, kind, name, class)
            WHEN 'compute' THEN 'compute' WHEN 'communication' THEN 'communication' WHEN 'input' THEN 'input'
            WHEN 'sync' THEN 'sync' WHEN 'memory_copy' THEN 'memory_copy' ELSE 'host_launch' END AS cause,
        sum(dur_ns) AS dur_ns
    FROM (SELECT w.run_id, w.rank, w.window_name, w.instance, w.edge, e.kind, e.name,
              CASE WHEN COALESCE(getvariable('tracesql_classes_stored'), false)
                   THEN CASE WHEN e.kind IN ('kernel', 'memcpy', 'memset') THEN e.class END ELSE d.class END AS class,
              sum(w.dur_ns) AS dur_ns
          FROM (SELECT run_id, rank, window_name, instance, s.edge AS edge, s.event_id AS event_id,
                       sum(s.dur_ns) AS dur_ns
                FROM paths GROUP BY ALL) w
          LEFT JOIN slices e ON e.run_id = w.run_id AND e.rank = w.rank AND e.slice_id = w.event_id
          LEFT JOIN (SELECT * FROM device_activity() WHERE NOT COALESCE(getvariable('tracesql_classes_stored'), false)) d
            ON d.run_id = w.run_id AND d.rank = w.rank AND d.slice_id = w.event_id
          GROUP BY ALL)
    GROUP BY ALL
), shares AS (
    SELECT run_id, rank, window_name, instance, sum(dur_ns) AS path_ns, arg_max(cause, dur_ns) AS bound,
        COALESCE(sum(dur_ns) FILTER (WHERE cause = 'compute'), 0) AS compute_ns,
        COALESCE(sum(dur_ns) FILTER (WHERE cause = 'communication'), 0) AS communication_ns,
        COALESCE(sum(dur_ns) FILTER (WHERE cause = 'host_launch'), 0) AS host_launch_ns,
        COALESCE(sum(dur_ns) FILTER (WHERE cause = 'input'), 0) AS input_ns,
        COALESCE(sum(dur_ns) FILTER (WHERE cause = 'sync'), 0) AS sync_ns,
        COALESCE(sum(dur_ns) FILTER (WHERE cause = 'memory_copy'), 0) AS memory_copy_ns
    FROM causes
    GROUP BY ALL
), unchanged AS (
    -- the windows without the change (what_if_unchanged's columns): the fresh steps' walked here, the others' known
    SELECT w.run_id, w.rank, w.window_name, w.instance, w.step, w.window_te - w.window_ts AS range_ns,
        greatest(w.window_te, w.work_end) - w.window_ts AS measured_ns, CAST(w.replayed_ns AS BIGINT) AS replayed_ns,
        CAST(s.path_ns AS BIGINT) AS path_ns, s.bound,
        s.compute_ns / s.path_ns AS compute_share, s.communication_ns / s.path_ns AS communication_share,
        s.host_launch_ns / s.path_ns AS host_launch_share, s.input_ns / s.path_ns AS input_share,
        s.sync_ns / s.path_ns AS sync_share, s.memory_copy_ns / s.path_ns AS memory_copy_share,
        CAST(w.remote_ns AS BIGINT) AS remote_ns, CAST(w.remote_rank AS INTEGER) AS remote_rank
    FROM walked w
    LEFT JOIN shares s ON s.run_id = w.run_id AND s.rank = w.rank AND s.window_name = w.window_name
     AND s.instance = w.instance
    UNION ALL
    SELECT * EXCLUDE (joint)
    FROM known
    WHERE (rank_filter IS NULL OR rank = rank_filter)
      AND (run_id, window_name, joint) NOT IN (SELECT (run_id, window_name, joint) FROM fresh)
)
SELECT u.run_id, u.rank, u.window_name, u.instance, u.step, u.range_ns, u.measured_ns, u.replayed_ns,
    p.predicted_ns, u.replayed_ns - p.predicted_ns AS saving_ns, what_if_saving_pct(u.replayed_ns, p.predicted_ns) AS saving_pct,
    u.path_ns, u.bound, u.compute_share, u.communication_share, u.host_launch_share, u.input_share, u.sync_share,
    u.memory_copy_share, u.remote_ns, u.remote_rank
FROM unchanged u
-- (a rank the unchanged replay has no path for has no predicted time either)
LEFT JOIN (SELECT run_id, rank, window_name, instance, CAST(predicted_ns AS BIGINT) AS predicted_ns FROM predicted) p
  ON u.replayed_ns IS NOT NULL AND p.run_id = u.run_id AND p.rank = u.rank AND p.window_name = u.window_name
 AND p.instance = u.instance;

-- The what_if macro's rows of the default windows (each step) with a change whose predicted times are known
-- (what_if_priced), of the rows the caller has (what_if_unchanged, what_if_predicted): what `tracesql findings`
-- reads in place of what_if for the changes it priced (tracesql/findings.py), without binding what_if, 0.06-0.1 s
-- a call (its rules' statements took 0.05-0.25 s each at 24x, most of it binding what_if).
CREATE OR REPLACE MACRO what_if_known(faster, faster_pct, hide_communication, no_launch_overhead, remove_syncs,
        straggler_to_median, rank_filter) AS TABLE
SELECT u.run_id, u.rank, u.window_name, u.instance, u.step, u.range_ns, u.measured_ns, u.replayed_ns,
    p.predicted_ns, u.replayed_ns - p.predicted_ns AS saving_ns, what_if_saving_pct(u.replayed_ns, p.predicted_ns) AS saving_pct,
    u.path_ns, u.bound, u.compute_share, u.communication_share, u.host_launch_share, u.input_share, u.sync_share,
    u.memory_copy_share, u.remote_ns, u.remote_rank
FROM what_if_unchanged() u
LEFT JOIN (SELECT run_id, rank, window_name, instance, CAST(predicted_ns AS BIGINT) AS predicted_ns
           FROM what_if_predicted(faster, faster_pct, hide_communication, no_launch_overhead, remove_syncs,
                                  straggler_to_median)) p
  ON u.replayed_ns IS NOT NULL AND p.run_id = u.run_id AND p.rank = u.rank AND p.window_name = u.window_name
 AND p.instance = u.instance
WHERE rank_filter IS NULL OR u.rank = rank_filter;
