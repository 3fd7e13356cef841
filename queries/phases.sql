-- phases: Where each step's device time went: forward, backward, optimizer, data loading, exposed communication, other, idle.
--
-- Each device event (kernel, copy, memset) gets the phase of the host work that launched it, the first rule that
-- applies:
--   1. communication kernels (class 'communication') are communication, whatever launched them;
--   2. the phase ranges on the launching thread that hold the launch: annotations and ops whose name says
--      backward (also the autograd engine's evaluate_function ops and the backward ops linked to their forward op,
--      ops.fwd_op_id), optimizer (Optimizer.step#..., zero_grad), data_loading (DataLoader...) or forward
--      ('## forward ##', DistributedDataParallel.forward, the module stack's 'nn.Module: X_N' calls), see the
--      range_phase macro; when several hold it, the first of backward, optimizer, data_loading, forward (a module
--      that activation checkpointing runs again inside backward is backward);
--   3. backward when the launching thread is an autograd thread: it runs backward ops (fwd_thread_id > 0 or
--      evaluate_function) and no top-level op that records an autograd node for a forward pass (forward ops that
--      activation checkpointing recomputes are nested in backward ones). PyTorch runs backward on a thread of its
--      own per device;
--   4. forward when the launch falls, on its thread, between the step's first and last forward op (ops that
--      recorded an autograd node: sequence_number >= 0 and no fwd_thread_id), the loss included;
--   5. other.
-- The step's device window (`steps.device_ts/device_dur`; a trace without steps: one window per rank, from its first
-- to its last device event, step NULL) is cut into instants by what runs on the rank's devices: an instant where
-- compute or memory work runs goes to the first of forward, backward, optimizer, data_loading, other that runs
-- then; one where only communication runs is exposed_communication; one where nothing runs is idle. The seven
-- columns add up to window_ns. Every device event in the window counts, whichever step launched it.
--
-- Needs: device kernels with their launching host calls (correlation ids); ProfilerStep ranges for per-step rows
-- Columns:
--   run_id                       VARCHAR  run
--   rank                         INTEGER  rank
--   step                         INTEGER  step (NULL: a trace without steps, the whole rank)
--   window_ns                    BIGINT   the step's device window: first device start to last device end
--   forward_ns                   BIGINT   time forward work ran
--   backward_ns                  BIGINT   time backward work ran (and no forward work)
--   optimizer_ns                 BIGINT   time optimizer work ran (and no forward or backward work)
--   data_loading_ns              BIGINT   time only data-loading work (copies of the batch, ...) ran
--   exposed_communication_ns     BIGINT   time only communication ran
--   other_ns                     BIGINT   time only work of no phase above ran
--   idle_ns                      BIGINT   time nothing ran
--   communication_ns             BIGINT   time any communication ran (exposed or overlapped by compute)
--   data_loading_host_ns         BIGINT   host time of the step's data-loading ranges (the device may idle meanwhile)
--   forward_kernels              BIGINT   device events of the window labelled forward
--   backward_kernels             BIGINT   device events labelled backward
--   optimizer_kernels            BIGINT   device events labelled optimizer
--   busy_share                   DOUBLE   1 - idle_ns / window_ns
WITH ranges AS (
    SELECT * FROM host_ranges(ranges := 'phases')
), range_threads AS (
    -- one number per thread with phase ranges, and the thread's stretch of the sort key of `held` below: an instant
    -- t of the thread is `off` + t - lo, where lo and hi are one before its first range start and one after its last
    -- range end (a launch outside them, held by none of its ranges, is sorted at lo or hi); the threads' stretches
    -- follow one another in the order of (run, rank, pid, tid). One BIGINT key sorts several times faster than
    -- (thread, time), let alone (run name, ..., time)
    SELECT run_id, rank, pid, tid, row_number() OVER (ORDER BY run_id, rank, pid, tid) AS thid, lo, hi,
        CAST(sum(hi - lo + 1) OVER (ORDER BY run_id, rank, pid, tid ROWS UNBOUNDED PRECEDING) - (hi - lo + 1)
            AS BIGINT) AS off
    FROM (SELECT run_id, rank, pid, tid, min(ts) - 1 AS lo, max(te) + 1 AS hi FROM ranges
          GROUP BY run_id, rank, pid, tid)
), phase_ranges AS (
    -- the phase ranges (host_ranges' 'phases'), each from its start to where it stops holding launches: its end, or
    -- the start of the next range of its thread and depth if that is earlier. At each nesting depth a launch is held
    -- by the latest range of that depth to start at or before it (of two starting together, the longer), if it has
    -- not ended (range_launches' rule)
    SELECT t.thid, t.off - t.lo AS base, r.name, r.ts,
        least(r.te, COALESCE(lead(r.ts) OVER (PARTITION BY t.thid, r.depth ORDER BY r.ts, r.te, r.slice_id), r.te))
            AS te
    FROM ranges r
    JOIN range_threads t ON t.run_id = r.run_id AND t.rank = r.rank AND t.pid = r.pid AND t.tid = r.tid
), named_phases AS (
    -- range_phase once per distinct range name (its regexes per range row cost more than the rest of the query),
    -- as the range's count in its phase's field of a packed integer: backward + optimizer * 2^15
    -- + data_loading * 2^30 + forward * 2^45 (exact while fewer than 2^15 ranges of a phase hold one instant on one
    -- thread); names of no phase kept (0), as a filter here would be pushed below the DISTINCT, to every row
    SELECT name,
        CASE range_phase(name) WHEN 'backward' THEN 1 WHEN 'optimizer' THEN 32768 WHEN 'data_loading' THEN 1073741824
            WHEN 'forward' THEN 35184372088832 ELSE 0 END AS count
    FROM (SELECT DISTINCT name FROM phase_ranges)
), windows AS (
    SELECT run_id, rank, step, device_ts AS ts, device_ts + device_dur AS te
    FROM steps WHERE device_dur IS NOT NULL
    UNION ALL
    -- a rank without steps: its whole device time
    SELECT s.run_id, s.rank, NULL, min(s.ts), max(s.ts + s.dur)
    FROM slices s
    JOIN (
        SELECT run_id, rank FROM (SELECT run_id, rank FROM ranks EXCEPT SELECT run_id, rank FROM steps)
        -- (true of every such rank, but DuckDB then estimates them few and builds the join on them: with none, the
        -- usual case, the device events are not read for it)
        GROUP BY ALL HAVING count(*) > 0) r ON r.run_id = s.run_id AND r.rank = s.rank
    WHERE s.kind IN ('kernel', 'memcpy', 'memset')
    GROUP BY s.run_id, s.rank
), rank_ids AS (
    -- one number per rank with windows: the events are matched to the windows by it
    SELECT run_id, rank, row_number() OVER (ORDER BY run_id, rank) AS rk
    FROM (SELECT DISTINCT run_id, rank FROM windows)
), threads AS (
    -- autograd threads: backward ops and no top-level forward op
    SELECT run_id, rank, pid, tid
    FROM ops
    GROUP BY run_id, rank, pid, tid
    HAVING count(*) FILTER (WHERE fwd_thread_id > 0 OR starts_with(name, 'autograd::engine::evaluate_function: ')) > 0
       AND count(*) FILTER (WHERE op_depth = 0 AND sequence_number >= 0 AND COALESCE(fwd_thread_id, 0) = 0) = 0
), forward_spans AS (
    SELECT run_id, rank, step, pid, tid, min(ts) AS ts, max(ts + dur) AS te
    FROM ops
    WHERE sequence_number >= 0 AND COALESCE(fwd_thread_id, 0) = 0
    GROUP BY run_id, rank, step, pid, tid
    -- (true of every span, but DuckDB then estimates them fewer than the device events, and joins them to the
    -- events with the spans, not the events, as its hash table: 0.1 of 2 CPU-s at 3.6 M slices)
    HAVING count(*) > 0
), device AS (
    -- each device event with its rank's number (`rk`; NULL: a rank without windows), the phase of rules 1, 3, 4
    -- and 5 (`ruled`: 1 communication, 2 backward, 3 forward, 4 other; rule 2 is looked up below, for the events
    -- that rule 1 leaves) and its launch's key in the sort below when the launching thread has phase ranges (else
    -- NULL, held by none): numbers only, as they ride through that sort. The launching call's thread, start and
    -- step (a launched event's step is its launch's)
    SELECT k.rk, d.ts, d.ts + d.dur AS te,
        CASE WHEN d.launch_id IS NOT NULL THEN t.off + least(greatest(d.launch_ts, t.lo), t.hi) - t.lo END AS key,
        CASE WHEN d.class = 'communication' THEN 1 WHEN bt.tid IS NOT NULL THEN 2 WHEN fs.tid IS NOT NULL THEN 3
             ELSE 4 END AS ruled
    FROM device_activity() d
    -- (a LEFT JOIN: an inner one made DuckDB estimate the events few and build the joins below on them)
    LEFT JOIN rank_ids k ON k.run_id = d.run_id AND k.rank = d.rank
    LEFT JOIN range_threads t ON t.run_id = d.run_id AND t.rank = d.rank AND t.pid = d.launch_pid
     AND t.tid = d.launch_tid
    LEFT JOIN threads bt ON bt.run_id = d.run_id AND bt.rank = d.rank AND bt.pid = d.launch_pid
     AND bt.tid = d.launch_tid
    LEFT JOIN forward_spans fs ON fs.run_id = d.run_id AND fs.rank = d.rank AND fs.step IS NOT DISTINCT FROM d.step
     AND fs.pid = d.launch_pid AND fs.tid = d.launch_tid AND d.launch_ts >= fs.ts AND d.launch_ts < fs.te
), held AS (
    -- one sorted stream per thread of its ranges' starts (+count) and ends (-count) and the device events it
    -- launched: the running sum at a launch counts, per phase, the ranges that hold it (the RANGE frame takes in
    -- every edge at the launch's instant: a range holds the launches from its start up to, not at, its end).
    -- One running sum over all threads in order of the key (range_threads): a thread's edges sum to 0 (and the
    -- events without a key have none). The events ride along in the sort, rather than being joined back to it by id
    SELECT *, CAST(sum(count) OVER (ORDER BY key RANGE UNBOUNDED PRECEDING) AS BIGINT) AS counts
    FROM (
        SELECT r.base + CASE e.edge WHEN 1 THEN r.ts ELSE r.te END AS key, e.edge * n.count AS count,
            CAST(NULL AS BIGINT) AS rk, CAST(NULL AS BIGINT) AS ts, CAST(NULL AS BIGINT) AS te,
            CAST(NULL AS INTEGER) AS ruled
        FROM phase_ranges r
        JOIN named_phases n ON n.name = r.name
        CROSS JOIN (VALUES (1), (-1)) e(edge)
        WHERE r.te > r.ts
        UNION ALL
        SELECT key, 0, rk, ts, te, ruled
        FROM device)
), events AS (
    -- rule 2 before rules 3-5: the first phase (backward, optimizer, data_loading, forward) of the ranges that hold
    -- the launch
    SELECT rk, ts, te,
        CASE WHEN ruled = 1 THEN 'communication'
             WHEN counts > 0 THEN CASE WHEN counts & 32767 > 0 THEN 'backward'
                                       WHEN (counts >> 15) & 32767 > 0 THEN 'optimizer'
                                       WHEN (counts >> 30) & 32767 > 0 THEN 'data_loading' ELSE 'forward' END
             WHEN ruled = 2 THEN 'backward' WHEN ruled = 3 THEN 'forward' ELSE 'other' END AS phase
    FROM held
    WHERE ruled IS NOT NULL
), window_ids AS (
    -- one number per (run, rank, step): the sweep below sorts by it, several times faster than by the run's name;
    -- and a common bucket width, half the mean length of the non-empty windows
    SELECT w.run_id, w.rank, w.step, k.rk, w.ts, w.te, dense_rank() OVER (ORDER BY w.run_id, w.rank, w.step) AS wid,
        CAST(greatest(sum(w.te - w.ts) OVER () // NULLIF(2 * count(CASE WHEN w.te > w.ts THEN 1 END) OVER (), 0), 1)
             AS BIGINT) AS width
    FROM windows w JOIN rank_ids k ON k.run_id = w.run_id AND k.rank = w.rank
), window_keys AS (
    -- each window's stretch of the sweep's sort key: an instant t of the window is its `base` + t; the windows'
    -- stretches follow one another in the order of wid, one apart. One BIGINT key sorts several times faster than
    -- (wid, t)
    SELECT wid, CAST(sum(te - ts + 1) OVER (ORDER BY wid ROWS UNBOUNDED PRECEDING) - (te - ts + 1) - ts AS BIGINT)
        AS base
    FROM (SELECT wid, min(ts) AS ts, max(te) AS te FROM window_ids GROUP BY wid)
), window_buckets AS (
    -- each window once per bucket of that width it touches
    SELECT w.wid, k.base, w.rk, w.ts, w.te, w.width,
        unnest(range(w.ts // w.width, greatest(w.te - 1, w.ts) // w.width + 1)) AS bucket
    FROM window_ids w JOIN window_keys k ON k.wid = w.wid
), event_buckets AS (
    SELECT v.*, unnest(range(v.ts // x.width, greatest(v.te - 1, v.ts) // x.width + 1)) AS bucket
    FROM events v CROSS JOIN (SELECT max(width) AS width FROM window_ids) x
), placed AS (
    -- each event with each window it overlaps, found by an equi-join on the buckets both touch, each pair once: in
    -- the first bucket of their overlap (that of the later start), rather than a range join of every event with
    -- every window of its rank
    SELECT w.wid, w.base, w.ts AS window_ts, w.te AS window_te, v.ts, v.te, v.phase
    FROM event_buckets v
    JOIN window_buckets w ON w.rk = v.rk AND w.bucket = v.bucket
     AND (v.bucket = v.ts // w.width OR v.bucket = w.ts // w.width) AND v.ts < w.te AND v.te > w.ts
), edges AS (
    -- each event clipped to each window it overlaps: +1 at its start and -1 at its end, in its phase's count.
    -- The six counts share two integers, 21 bits each (early: forward + backward * 2^21 + optimizer * 2^42; late:
    -- data_loading, other, communication), so that two running sums keep all six (exact while fewer than 2^21
    -- events of a phase run at once in a window). A start edge of a forward, backward or optimizer event has early
    -- 1, 2^21 or 2^42: the kernel counts below
    SELECT v.wid, v.base + CASE e.edge WHEN 1 THEN greatest(v.ts, v.window_ts) ELSE least(v.te, v.window_te) END
            AS key,
        e.edge * CASE v.phase WHEN 'forward' THEN 1 WHEN 'backward' THEN 2097152 WHEN 'optimizer' THEN 4398046511104
                              ELSE 0 END AS early,
        e.edge * CASE v.phase WHEN 'data_loading' THEN 1 WHEN 'other' THEN 2097152
                              WHEN 'communication' THEN 4398046511104 ELSE 0 END AS late
    FROM placed v
    CROSS JOIN (VALUES (1), (-1)) e(edge)
), sweep AS (
    -- the counts after each edge (a running sum over the rows in order, an instant's edges one by one) and before
    -- it (the same less the edge's own). Every event adds +1 and -1 inside one window, so each window's running
    -- sums start from 0 and one running sum over all windows in order equals the per-window one (DuckDB runs it
    -- ~10x faster than one partitioned by window when one partition is much larger than the others)
    SELECT wid, key, early, early_after - early AS early_before, early_after, late_after - late AS late_before,
        late_after
    FROM (
        SELECT *, CAST(sum(early) OVER o AS BIGINT) AS early_after, CAST(sum(late) OVER o AS BIGINT) AS late_after
        FROM edges
        WINDOW o AS (ORDER BY key ROWS UNBOUNDED PRECEDING))
), changes AS (
    -- what runs before and after each edge, as a number: 2 * the first phase with a count (1 forward, 2 backward,
    -- 3 optimizer, 4 data_loading, 5 other; 0 none) + 1 when communication runs; per window and pair of numbers,
    -- the sum of the edges' keys
    SELECT wid,
        2 * CASE WHEN early_before & 2097151 > 0 THEN 1 WHEN early_before & 4398046511103 > 0 THEN 2
                 WHEN early_before > 0 THEN 3 WHEN late_before & 2097151 > 0 THEN 4
                 WHEN late_before & 4398046511103 > 0 THEN 5 ELSE 0 END
            + CAST(late_before >> 42 > 0 AS INTEGER) AS before,
        2 * CASE WHEN early_after & 2097151 > 0 THEN 1 WHEN early_after & 4398046511103 > 0 THEN 2
                 WHEN early_after > 0 THEN 3 WHEN late_after & 2097151 > 0 THEN 4
                 WHEN late_after & 4398046511103 > 0 THEN 5 ELSE 0 END
            + CAST(late_after >> 42 > 0 AS INTEGER) AS after,
        sum(key) AS keys, count(*) FILTER (WHERE early = 1) AS forward_kernels,
        count(*) FILTER (WHERE early = 2097152) AS backward_kernels,
        count(*) FILTER (WHERE early = 4398046511104) AS optimizer_kernels
    FROM sweep
    GROUP BY ALL
), per_window AS (
    -- the time each window spends in each state: the sum over its edges of the key where the state ends less the
    -- key where it begins (each stretch between two edges, k1 to k2, adds k2 - k1, and the window starts and ends
    -- with nothing running). No lead(key) over the sorted rows, and no peers: an instant's edges cancel out.
    -- (`changes` read once: Spark inlines a CTE at each reference, the sweeps with it)
    SELECT i.run_id, i.rank, i.step, i.te - i.ts AS window_ns, s.*
    FROM (
        SELECT wid,
            COALESCE(sum(ns) FILTER (WHERE state // 2 = 1), 0) AS forward_ns,
            COALESCE(sum(ns) FILTER (WHERE state // 2 = 2), 0) AS backward_ns,
            COALESCE(sum(ns) FILTER (WHERE state // 2 = 3), 0) AS optimizer_ns,
            COALESCE(sum(ns) FILTER (WHERE state // 2 = 4), 0) AS data_loading_ns,
            COALESCE(sum(ns) FILTER (WHERE state = 1), 0) AS exposed_communication_ns,
            COALESCE(sum(ns) FILTER (WHERE state // 2 = 5), 0) AS other_ns,
            COALESCE(sum(ns) FILTER (WHERE state > 0), 0) AS busy_ns,
            COALESCE(sum(ns) FILTER (WHERE state % 2 = 1), 0) AS communication_ns,
            sum(forward_kernels) AS forward_kernels, sum(backward_kernels) AS backward_kernels,
            sum(optimizer_kernels) AS optimizer_kernels
        FROM (
            SELECT c.wid, CASE e.side WHEN 1 THEN c.before ELSE c.after END AS state, sum(e.side * c.keys) AS ns,
                sum(CASE e.side WHEN 1 THEN c.forward_kernels ELSE 0 END) AS forward_kernels,
                sum(CASE e.side WHEN 1 THEN c.backward_kernels ELSE 0 END) AS backward_kernels,
                sum(CASE e.side WHEN 1 THEN c.optimizer_kernels ELSE 0 END) AS optimizer_kernels
            FROM changes c
            CROSS JOIN (VALUES (1), (-1)) e(side)
            GROUP BY c.wid, state)
        GROUP BY wid
    ) s
    JOIN (SELECT wid, run_id, rank, step, min(ts) AS ts, max(te) AS te FROM window_ids GROUP BY ALL) i
      ON i.wid = s.wid
), data_host AS (
    -- (every annotation's name but ProfilerStep#N's, which names no phase, is a phase range's, whose phase
    -- named_phases has, data_loading as the count 2^30: no regex per annotation)
    SELECT run_id, rank, step, sum(dur) AS data_loading_host_ns
    FROM slices
    WHERE kind = 'user_annotation' AND name IN (SELECT name FROM named_phases WHERE count = 1073741824)
    GROUP BY run_id, rank, step
)
SELECT p.run_id, p.rank, p.step, CAST(p.window_ns AS BIGINT) AS window_ns,
    CAST(p.forward_ns AS BIGINT) AS forward_ns, CAST(p.backward_ns AS BIGINT) AS backward_ns,
    CAST(p.optimizer_ns AS BIGINT) AS optimizer_ns, CAST(p.data_loading_ns AS BIGINT) AS data_loading_ns,
    CAST(p.exposed_communication_ns AS BIGINT) AS exposed_communication_ns, CAST(p.other_ns AS BIGINT) AS other_ns,
    CAST(p.window_ns - p.busy_ns AS BIGINT) AS idle_ns, CAST(p.communication_ns AS BIGINT) AS communication_ns,
    CAST(COALESCE(d.data_loading_host_ns, 0) AS BIGINT) AS data_loading_host_ns,
    CAST(p.forward_kernels AS BIGINT) AS forward_kernels, CAST(p.backward_kernels AS BIGINT) AS backward_kernels,
    CAST(p.optimizer_kernels AS BIGINT) AS optimizer_kernels,
    CASE WHEN p.window_ns > 0 THEN 1 - (p.window_ns - p.busy_ns) / p.window_ns END AS busy_share
FROM per_window p
LEFT JOIN data_host d ON d.run_id = p.run_id AND d.rank = p.rank AND d.step IS NOT DISTINCT FROM p.step
ORDER BY p.run_id, p.rank, p.step NULLS FIRST;
