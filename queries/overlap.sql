-- overlap: How much communication is hidden under computation, per rank and device (or per step, or per process group).
--
-- overlap_ratio = |union(comm) ∩ union(compute)| / |union(comm)|: the share of communication time during which
-- some compute kernel also runs (HTA's comp_comm_overlap_pctg). exposed_comm_ns = |union(comm)| − overlap_ns is
-- the communication time nothing hides. Unions are taken over all streams of the device, so concurrent kernels
-- are counted once. NULL ratio when the device ran no communication.
-- per = 'step': over each step's device window (as temporal_breakdown per step: `step_timeline`).
-- per = 'process_group': comm_ns is the time covered by the communication kernels of that group, overlap_ns the
-- part of it with compute running (any compute); groups that run at the same time each count that time.
-- A kernel's group is that of its collective call (`collectives`: the host call that encloses its launch, via
-- slices.op_id or the op's own enclosing op, else the kernel's own row); 'unknown' when the trace names none.
-- With class_scheme = 'hta' and analysis_window = 'hta' the numbers are HTA 0.5's (see README).
--
-- Needs: device kernels (a GPU/accelerator trace)
-- Parameters:
--   per = 'rank'               one of rank, step, process_group: one row per device ('rank'), per step and device, or per process group
--   class_scheme = 'default'   one of default, hta: kernel class rules from kernel_classes
--   analysis_window = 'all'    one of all, hta: 'all' device work, or 'hta' (launched before the last ProfilerStep began)
--   time_unit_ns = 1           integer >= 1: 1 = exact ns; 1000 = HTA's whole µs (start rounded up, end down)
-- Columns:
--   run_id            VARCHAR  run
--   rank              INTEGER  rank
--   device_id         INTEGER  device
--   step              INTEGER  step (per = 'step'; NULL otherwise)
--   process_group     VARCHAR  process group name (per = 'process_group'; NULL otherwise)
--   comm_ns           BIGINT   time with communication running (union over streams)
--   compute_ns        BIGINT   time with compute running (union over streams; NULL per process group)
--   overlap_ns        BIGINT   time with both running
--   exposed_comm_ns   BIGINT   communication time not overlapped by compute
--   overlap_ratio     DOUBLE   overlap_ns / comm_ns (NULL without communication)
--   overlap_pct       DOUBLE   overlap_ratio in percent, rounded to 2 decimals
WITH timeline AS (
    SELECT * FROM device_timeline(
        class_scheme := COALESCE(getvariable('class_scheme'), 'default'),
        analysis_window := COALESCE(getvariable('analysis_window'), 'all'),
        time_unit_ns := COALESCE(getvariable('time_unit_ns'), 1))
), comm_kernels AS (
    SELECT k.run_id, k.rank, k.device_id, k.ts, k.ts + k.dur AS te,
        COALESCE(arg_min(c.pg_name, c.collective_id), 'unknown') AS process_group
    FROM device_activity(
        class_scheme := COALESCE(getvariable('class_scheme'), 'default'),
        analysis_window := COALESCE(getvariable('analysis_window'), 'all'),
        time_unit_ns := COALESCE(getvariable('time_unit_ns'), 1)) k
    LEFT JOIN ops op ON op.run_id = k.run_id AND op.rank = k.rank AND op.op_id = k.op_id
    -- the three candidate ids, each joined on equality (an IN list would join every kernel with every collective)
    CROSS JOIN (VALUES (1), (2), (3)) candidate(n)
    LEFT JOIN collectives c ON c.run_id = k.run_id AND c.rank = k.rank
     AND c.collective_id = CASE candidate.n WHEN 1 THEN k.op_id WHEN 2 THEN op.parent_op_id ELSE k.slice_id END
    WHERE k.class = 'communication' AND COALESCE(getvariable('per'), 'rank') = 'process_group'
    GROUP BY ALL
), groups AS (
    -- one number per (device, process group): the sweep below sorts by it, faster than by the names
    SELECT run_id, rank, device_id, process_group,
        row_number() OVER (ORDER BY run_id, rank, device_id, process_group) AS gid
    FROM (SELECT DISTINCT run_id, rank, device_id, process_group FROM comm_kernels)
), covered AS (
    -- each communication segment of the timeline once per group whose kernels cover it. Segments are cut at every
    -- event's edges, so a kernel covers a segment entirely or not at all, and a group covers it when more of the
    -- group's kernels started than ended by the segment's start: a running sum over one sorted stream of the
    -- group's kernel edges and the segments (edges first at equal times), not a join of segments with kernels.
    -- One running sum over all groups in order: a group's edges sum to 0
    SELECT gid, ts, dur, classes
    FROM (
        SELECT *, sum(delta) OVER (ORDER BY gid, ts, ord ROWS UNBOUNDED PRECEDING) AS running
        FROM (
            SELECT g.gid, t.ts, t.dur, t.classes, 1 AS ord, 0 AS delta
            FROM timeline t
            JOIN groups g ON g.run_id = t.run_id AND g.rank = t.rank AND g.device_id = t.device_id
            -- (the per test here too: without it the whole timeline is built for a join with an empty side)
            WHERE t.classes & 2 = 2 AND COALESCE(getvariable('per'), 'rank') = 'process_group'
            UNION ALL
            SELECT g.gid, CASE e.edge WHEN 1 THEN k.ts ELSE k.te END, NULL, NULL, 0, e.edge
            FROM comm_kernels k
            JOIN groups g ON g.run_id = k.run_id AND g.rank = k.rank AND g.device_id IS NOT DISTINCT FROM k.device_id
             AND g.process_group = k.process_group
            CROSS JOIN (VALUES (1), (-1)) e(edge)
            WHERE k.te > k.ts
        )
    )
    WHERE ord = 1 AND running > 0
), keyed AS (
    SELECT *, NULL::VARCHAR AS process_group
    FROM analysis_timeline(
        per := COALESCE(getvariable('per'), 'rank'),
        class_scheme := COALESCE(getvariable('class_scheme'), 'default'),
        analysis_window := COALESCE(getvariable('analysis_window'), 'all'),
        time_unit_ns := COALESCE(getvariable('time_unit_ns'), 1))
    UNION ALL BY NAME
    SELECT g.run_id, g.rank, g.device_id, c.ts, c.dur, c.classes, NULL::INTEGER AS step, g.process_group
    FROM covered c JOIN groups g ON g.gid = c.gid
)
SELECT
    run_id, rank, device_id, step, process_group,
    CAST(COALESCE(sum(dur) FILTER (WHERE classes & 2 = 2), 0) AS BIGINT) AS comm_ns,
    CASE WHEN process_group IS NULL
         THEN CAST(COALESCE(sum(dur) FILTER (WHERE classes & 1 = 1), 0) AS BIGINT) END AS compute_ns,
    CAST(COALESCE(sum(dur) FILTER (WHERE classes & 3 = 3), 0) AS BIGINT) AS overlap_ns,
    comm_ns - overlap_ns AS exposed_comm_ns,
    CAST(overlap_ns AS DOUBLE) / NULLIF(comm_ns, 0) AS overlap_ratio,
    round(100 * overlap_ratio, 2) AS overlap_pct
FROM keyed
GROUP BY run_id, rank, device_id, step, process_group
ORDER BY run_id, rank, device_id, step, process_group;
