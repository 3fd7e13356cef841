-- bubbles_largest: The longest idle gaps of each rank, with the kernels before and after them and why they happened.
--
-- Gaps and their categories as in `bubbles` (the `idle_gaps` macro): on one stream (scope 'stream') or on the
-- whole device (scope 'device'), from the end of the last event before (prev_kernel, the one that ended last)
-- to the start of the next (next_kernel). launch_lag_ns = next kernel's launching host call − gap start: positive
-- for host_wait (the CPU enqueued the next kernel only that long after the device ran dry).
--
-- Needs: device kernels (a GPU/accelerator trace)
-- Parameters:
--   top = 10                   integer >= 1: gaps per rank
--   scope = 'device'           one of stream, device: 'device' (gaps of the busy set: the device was idle) or 'stream'
--   kernel_wait_ns = 30000     integer >= 0: shorter gaps not caused by the host are kernel_wait (HTA: 30 µs)
--   class_scheme = 'default'   one of default, hta: kernel class rules from kernel_classes
--   analysis_window = 'all'    one of all, hta: 'all' device work, or 'hta' (launched before the last ProfilerStep began)
--   time_unit_ns = 1           integer >= 1: 1 = exact ns; 1000 = HTA's whole µs (start rounded up, end down)
-- Columns:
--   run_id          VARCHAR  run
--   rank            INTEGER  rank
--   rank_in_rank    BIGINT   1 = the longest gap of the rank
--   device_id       INTEGER  device
--   stream          BIGINT   stream (NULL with scope 'device')
--   step            INTEGER  step whose device window holds the gap's start (step_windows)
--   ts              BIGINT   gap start, ns
--   dur             BIGINT   gap length, ns
--   category        VARCHAR  host_wait, kernel_wait or other
--   launch_lag_ns   BIGINT   next kernel's launch call start − gap start (NULL if its launch is unknown)
--   prev_kernel     VARCHAR  the event that ended last before the gap
--   next_kernel     VARCHAR  the event that ends the gap
--   prev_slice_id   BIGINT   its slice_id
--   next_slice_id   BIGINT   its slice_id
WITH gaps AS MATERIALIZED (
    SELECT run_id, rank, device_id, stream, step, ts, dur, category, next_launch_ts, prev_slice_id, next_slice_id,
        floor(log2(dur)) AS octave
    FROM idle_gaps(
        scope := COALESCE(getvariable('scope'), 'device'),
        class_scheme := COALESCE(getvariable('class_scheme'), 'default'),
        analysis_window := COALESCE(getvariable('analysis_window'), 'all'),
        time_unit_ns := COALESCE(getvariable('time_unit_ns'), 1),
        kernel_wait_ns := COALESCE(getvariable('kernel_wait_ns'), 30000))
), shortest AS (
    -- each rank's gaps counted per octave of duration ([2^k, 2^(k+1)) ns): the longest octaves that hold `top`
    -- gaps hold the top longest, so only their gaps are ranked (all of them where the rank has fewer), in the
    -- same order as among all gaps; sorting every gap took 0.45 of 1.2 CPU-s on 3.6 M slices
    SELECT run_id, rank, max(octave) FILTER (WHERE longer >= COALESCE(getvariable('top'), 10)) AS octave
    FROM (SELECT run_id, rank, octave,
              sum(gaps) OVER (PARTITION BY run_id, rank ORDER BY octave DESC) AS longer
          FROM (SELECT run_id, rank, octave, count(*) AS gaps FROM gaps GROUP BY run_id, rank, octave))
    GROUP BY run_id, rank
), top AS (
    -- the gaps ranked by ids and times alone; the kernels' names are looked up for the kept ones only (ranking
    -- with the names, and picking the previous kernel's name for every gap, took most of the time)
    SELECT g.run_id, g.rank,
        row_number() OVER (PARTITION BY g.run_id, g.rank ORDER BY g.dur DESC, g.ts, g.device_id, g.stream NULLS FIRST,
                                                    g.next_slice_id) AS rank_in_rank,
        g.device_id, g.stream, g.step, g.ts, g.dur, g.category, g.next_launch_ts - g.ts AS launch_lag_ns,
        g.prev_slice_id, g.next_slice_id
    FROM gaps g JOIN shortest s ON s.run_id = g.run_id AND s.rank = g.rank
    WHERE g.octave >= s.octave OR s.octave IS NULL
    QUALIFY rank_in_rank <= COALESCE(getvariable('top'), 10)
), names AS (
    -- the kept gaps' kernels only: joined to all of `slices`, the few kept gaps were the probe side and every
    -- slice went into the join's table (their count is misestimated by orders of magnitude)
    SELECT run_id, rank, slice_id, name FROM slices
    WHERE slice_id IN (SELECT prev_slice_id FROM top UNION ALL SELECT next_slice_id FROM top)
)
SELECT t.run_id, t.rank, t.rank_in_rank, t.device_id, t.stream, t.step, t.ts, t.dur, t.category, t.launch_lag_ns,
    p.name AS prev_kernel, n.name AS next_kernel, t.prev_slice_id, t.next_slice_id
FROM top t
LEFT JOIN names p ON p.run_id = t.run_id AND p.rank = t.rank AND p.slice_id = t.prev_slice_id
LEFT JOIN names n ON n.run_id = t.run_id AND n.rank = t.rank AND n.slice_id = t.next_slice_id
ORDER BY t.run_id, t.rank, t.rank_in_rank;
