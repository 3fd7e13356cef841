-- Host ranges (annotations, nn.Module ranges, backward ops) and the device work launched inside them.

-- The host ranges range_launches projects: ranges = 'annotations' (user annotations, ProfilerStep#N left to
-- `steps`), 'modules' (the module stack: 'nn.Module: Name_N' ranges of with_stack / with_modules traces) or
-- 'phases' (the ranges that say which training phase runs: annotations, the module stack, the autograd engine's
-- 'autograd::engine::evaluate_function: ...' ops, which run one backward node each, and the backward ops linked to
-- their forward op, ops.fwd_op_id).
CREATE OR REPLACE MACRO host_ranges(ranges := 'annotations') AS TABLE
SELECT s.run_id, s.rank, s.slice_id, s.name, s.pid, s.tid, s.depth, s.ts, s.ts + s.dur AS te, s.dur
FROM slices s
LEFT JOIN (SELECT run_id, rank, op_id FROM ops WHERE ranges = 'phases' AND fwd_op_id IS NOT NULL) b
  ON b.run_id = s.run_id AND b.rank = s.rank AND b.op_id = s.slice_id
WHERE (ranges IN ('annotations', 'phases') AND s.kind = 'user_annotation' AND NOT starts_with(s.name, 'ProfilerStep#'))
   OR (ranges IN ('modules', 'phases') AND s.kind IN ('python_function', 'user_annotation')
       AND starts_with(s.name, 'nn.Module: '))
   OR (ranges = 'phases' AND s.kind = 'cpu_op'
       AND (starts_with(s.name, 'autograd::engine::evaluate_function: ') OR b.op_id IS NOT NULL));

-- The training phase a host range's name says it runs ('## backward ##', 'Optimizer.step#AdamW.step',
-- 'enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__', 'DistributedDataParallel.forward', an
-- 'nn.Module: Linear_0' call, ...), or NULL. Checked in this order: backward, optimizer, data_loading, forward.
CREATE OR REPLACE MACRO range_phase(name) AS (
    CASE WHEN starts_with(name, 'autograd::engine::evaluate_function: ') OR regexp_matches(lower(name), 'backward')
              THEN 'backward'
         WHEN regexp_matches(lower(name), 'optimi[sz]er|zero_grad') THEN 'optimizer'
         WHEN regexp_matches(lower(name), 'dataloader|data_load|data load|fetch_batch|get_batch|next_batch')
              THEN 'data_loading'
         WHEN regexp_matches(lower(name), 'forward') OR starts_with(name, 'nn.Module: ') THEN 'forward' END
);

-- One row per (host range, device event launched inside it): the kernels, copies and memsets whose launching
-- host call (slices.launch_id) started in [range start, range end).
-- projection 'process': launches from any thread of the range's process count (PyTorch runs backward on an
-- autograd thread, so '## backward ##' on the main thread holds the kernels the autograd thread launched while
-- it was open); 'thread': only launches from the range's own thread (the NVTX-style rule).
-- Ranges of one thread nest, so at each nesting depth a launch has at most one enclosing range: the latest one
-- of that depth to start before it, if it has not ended. Each launch is matched against every (thread, depth) of
-- its process's ranges ('thread': of its own thread's) by a running arg_max over one sorted stream of range
-- starts and launches (an ASOF lookup written as a window, which Spark runs too): no range join.
-- innermost: no deeper range of the same thread holds the launch (its time is the range's self time; else it
-- is its child ranges' too). own_thread: the launch came from the range's thread.
CREATE OR REPLACE MACRO range_launches(ranges := 'annotations', projection := 'process') AS TABLE
WITH probes AS (
    SELECT k.run_id, k.rank, k.pid, k.tid, k.depth, l.ts AS ts, 1 AS ord, NULL::BIGINT AS range_id,
        NULL::BIGINT AS range_te, d.slice_id AS event_id, l.tid AS launch_tid, d.ts AS event_ts, d.dur AS event_dur
    FROM slices d
    JOIN slices l ON l.run_id = d.run_id AND l.rank = d.rank AND l.slice_id = d.launch_id
    JOIN (SELECT DISTINCT run_id, rank, pid, tid, depth FROM host_ranges(ranges := ranges)) k
      ON k.run_id = l.run_id AND k.rank = l.rank AND k.pid = l.pid AND (projection = 'process' OR k.tid = l.tid)
    WHERE d.kind IN ('kernel', 'memcpy', 'memset')
    UNION ALL
    SELECT run_id, rank, pid, tid, depth, ts, 0, slice_id, te, NULL, NULL, NULL, NULL
    FROM host_ranges(ranges := ranges)
), swept AS (
    SELECT *,
        arg_max(range_id, CASE WHEN ord = 0 THEN ts END) OVER w AS owner,
        arg_max(range_te, CASE WHEN ord = 0 THEN ts END) OVER w AS owner_te
    FROM probes
    WINDOW w AS (PARTITION BY run_id, rank, pid, tid, depth ORDER BY ts, ord ROWS UNBOUNDED PRECEDING)
)
SELECT run_id, rank, owner AS slice_id, tid, depth, event_id, event_ts AS ts, event_dur AS dur, ts AS launch_ts,
    launch_tid, launch_tid = tid AS own_thread,
    depth = max(depth) OVER (PARTITION BY run_id, rank, event_id, tid) AS innermost
FROM swept
WHERE ord = 1 AND owner IS NOT NULL AND ts < owner_te;
