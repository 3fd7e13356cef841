-- Host ranges (annotations, nn.Module ranges, backward ops) and the device work launched inside them.

-- The host ranges that range_launches projects and the phases query sweeps: ranges = 'annotations' (user
-- annotations, ProfilerStep#N left to `steps`), 'modules' (the module stack: 'nn.Module: Name_N' ranges of
-- with_stack / with_modules traces) or 'phases' (the ranges that say which training phase runs: annotations, the
-- module stack, the autograd engine's 'autograd::engine::evaluate_function: ...' ops, which run one backward node
-- each, and the backward ops linked to their forward op, ops.fwd_op_id).
CREATE OR REPLACE MACRO host_ranges(ranges := 'annotations') AS TABLE
-- annotations and modules: a branch per kind, each with `kind = '...'`, which DuckDB filters while it reads the
-- file (an OR of kinds it filters after reading every row's name: 2-4x the CPU); phases, whose ranges are of three
-- kinds: one read (the branches that `ranges` leaves no row are dropped when planned)
SELECT run_id, rank, slice_id, name, pid, tid, depth, ts, ts + dur AS te, dur
FROM slices
WHERE kind = 'user_annotation' AND ranges IN ('annotations', 'modules')
  AND ((ranges = 'annotations' AND NOT starts_with(name, 'ProfilerStep#'))
       OR (ranges = 'modules' AND starts_with(name, 'nn.Module: ')))
UNION ALL
SELECT run_id, rank, slice_id, name, pid, tid, depth, ts, ts + dur, dur
FROM slices
WHERE kind = 'python_function' AND ranges = 'modules' AND starts_with(name, 'nn.Module: ')
UNION ALL
SELECT s.run_id, s.rank, s.slice_id, s.name, s.pid, s.tid, s.depth, s.ts, s.ts + s.dur, s.dur
FROM slices s
LEFT JOIN (SELECT run_id, rank, op_id FROM ops WHERE fwd_op_id IS NOT NULL) b
  ON b.run_id = s.run_id AND b.rank = s.rank AND b.op_id = s.slice_id
WHERE ranges = 'phases'
  AND ((s.kind = 'user_annotation' AND NOT starts_with(s.name, 'ProfilerStep#'))
       OR (s.kind IN ('python_function', 'user_annotation') AND starts_with(s.name, 'nn.Module: '))
       OR (s.kind = 'cpu_op' AND (starts_with(s.name, 'autograd::engine::evaluate_function: ') OR b.op_id IS NOT NULL)));

-- The names of data-loading ranges and ops (a regular expression, any case): range_phase's 'data_loading', the
-- findings rule data_loader's what-if.
CREATE OR REPLACE MACRO data_loading_pattern() AS
    '(?i)dataloader|data_load|data load|fetch_batch|get_batch|next_batch';

-- The training phase a host range's name says it runs ('## backward ##', 'Optimizer.step#AdamW.step',
-- 'enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__', 'DistributedDataParallel.forward', an
-- 'nn.Module: Linear_0' call, ...), or NULL. Checked in this order: backward, optimizer, data_loading, forward.
CREATE OR REPLACE MACRO range_phase(name) AS (
    CASE WHEN starts_with(name, 'autograd::engine::evaluate_function: ') OR regexp_matches(lower(name), 'backward')
              THEN 'backward'
         WHEN regexp_matches(lower(name), 'optimi[sz]er|zero_grad') THEN 'optimizer'
         WHEN regexp_matches(name, data_loading_pattern()) THEN 'data_loading'
         WHEN regexp_matches(lower(name), 'forward') OR starts_with(name, 'nn.Module: ') THEN 'forward' END
);

-- One row per (host range, device event launched inside it): the kernels, copies and memsets whose launching
-- host call (slices.launch_id) started in [range start, range end).
-- projection 'process': launches from any thread of the range's process count (PyTorch runs backward on an
-- autograd thread, so '## backward ##' on the main thread holds the kernels the autograd thread launched while
-- it was open); 'thread': only launches from the range's own thread (the NVTX-style rule).
-- Ranges of one thread nest, so at each nesting depth a launch has at most one enclosing range: the latest one
-- of that depth to start before it (of two starting together, the longer), if it has not ended. Each launch is
-- matched against every (thread, depth) of its process's ranges ('thread': of its own thread's) by one sorted
-- stream of range starts and launches, ordered by (thread, depth, time): the running count of range starts
-- up to a launch is the number (in that order) of the range it looks up (an ASOF lookup written as a window,
-- which Spark runs too; one unpartitioned running sum, as DuckDB's partitioned running windows are several
-- times slower when one partition is much larger than the others): no range join.
-- name: the range's. innermost: no deeper range of the same thread holds the launch (its time is the range's self time; else it
-- is its child ranges' too). own_thread: the launch came from the range's thread.
CREATE OR REPLACE MACRO range_launches(ranges := 'annotations', projection := 'process') AS TABLE
WITH hosts AS (
    SELECT * FROM host_ranges(ranges := ranges)
), keys AS (
    -- one number per (thread, depth): the stream is sorted by it, several times faster than by the run's name;
    -- and one per thread (thid), which the innermost range's lookup groups by
    SELECT run_id, rank, pid, tid, depth, row_number() OVER (ORDER BY run_id, rank, pid, tid, depth) AS kid,
        dense_rank() OVER (ORDER BY run_id, rank, pid, tid) AS thid
    FROM (SELECT DISTINCT run_id, rank, pid, tid, depth FROM hosts)
), found AS (
    SELECT k.kid, h.ts, h.te, h.slice_id, h.name, row_number() OVER (ORDER BY k.kid, h.ts, h.te, h.slice_id) AS n
    FROM hosts h
    JOIN keys k ON k.run_id = h.run_id AND k.rank = h.rank AND k.pid IS NOT DISTINCT FROM h.pid
     AND k.tid IS NOT DISTINCT FROM h.tid AND k.depth IS NOT DISTINCT FROM h.depth
), probes AS (
    -- the launches carry only numbers through the sort; their key's run, rank, thread and depth come from `keys`
    SELECT k.kid, d.launch_ts AS ts, 1 AS ord, d.slice_id AS event_id, d.launch_tid, d.ts AS event_ts,
        d.dur AS event_dur
    FROM slices d
    JOIN keys k ON k.run_id = d.run_id AND k.rank = d.rank AND k.pid = d.launch_pid
     AND (projection = 'process' OR k.tid = d.launch_tid)
    WHERE d.kind IN ('kernel', 'memcpy', 'memset') AND d.launch_id IS NOT NULL
    UNION ALL
    SELECT kid, ts, 0, NULL, NULL, NULL, NULL
    FROM found
), swept AS (
    SELECT *, CAST(sum(1 - ord) OVER (ORDER BY kid, ts, ord ROWS UNBOUNDED PRECEDING) AS BIGINT) AS n
    FROM probes
), held AS (
    SELECT k.run_id, k.rank, r.slice_id, r.name, k.tid, k.depth, p.event_id, p.event_ts AS ts, p.event_dur AS dur,
        p.ts AS launch_ts, p.launch_tid, p.launch_tid = k.tid AS own_thread, k.thid
    FROM swept p
    JOIN found r ON r.kid = p.kid AND r.n = p.n
    JOIN keys k ON k.kid = p.kid
    WHERE p.ord = 1 AND p.ts < r.te
)
SELECT h.* EXCLUDE (thid), h.depth = i.depth AS innermost
FROM held h
JOIN (SELECT thid, event_id, max(depth) AS depth FROM held GROUP BY thid, event_id) i
  ON i.thid = h.thid AND i.event_id = h.event_id;
