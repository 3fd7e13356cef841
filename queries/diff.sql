-- diff: What changed between two runs, kernel by kernel and op by op: added, removed, count and time deltas by impact.
--
-- Run on a session that holds both runs (a fleet, or `tracesql diff BEFORE AFTER`). Names are normalized so that
-- runs from other formats, devices or library versions line up: kernels by kernel_family(name) (template
-- arguments, argument lists, tile shapes and instance numbers folded; copies and memsets keep their names), ops by
-- name. Counts and times are per rank (the run's total / its ranks), so runs with different rank counts compare.
-- Time is device time when both runs have device events: a kernel's duration, an op's `ops.device_self_ns` (the
-- kernels it launched itself, so nested ops are not counted twice); otherwise (CPU-only traces) host time: ops'
-- `self_dur`, and no kernel rows. status: added (only after), removed (only before), changed (count or time
-- differ), same. share_of_change = delta_ns / the level's total delta (all names, not only the rows shown): the
-- part of the run's change in that level a row explains. Rows are ranked by |delta_ns| (impact).
--
-- Needs: two runs with kernels or ops (either may be the other with more or fewer ranks, or from another format)
-- Parameters:
--   before = NULL   text: run_id of the earlier run; NULL = the run whose trace starts first
--   after = NULL    text: run_id of the later run; NULL = the run whose trace starts last
--   top = 50        integer >= 1: rows per level, by impact
-- Columns:
--   before_run       VARCHAR  run_id of the earlier run
--   after_run        VARCHAR  run_id of the later run
--   level            VARCHAR  'kernel' or 'op'
--   rank_in_level    BIGINT   1 = the largest |delta_ns|
--   name             VARCHAR  kernel family or op name
--   status           VARCHAR  added, removed, changed or same
--   time_basis       VARCHAR  'device' or 'host': the time compared
--   before_count     DOUBLE   executions or calls per rank in the earlier run
--   after_count      DOUBLE   per rank in the later run
--   count_delta      DOUBLE   after_count − before_count
--   before_ns        DOUBLE   time per rank in the earlier run
--   after_ns         DOUBLE   time per rank in the later run
--   delta_ns         DOUBLE   after_ns − before_ns
--   delta_pct        DOUBLE   delta_ns / before_ns · 100 (NULL when added)
--   share_of_change  DOUBLE   delta_ns / the level's total delta_ns (NULL when the total did not change)
--   level_delta_ns   DOUBLE   the level's total delta_ns, over all its names (not only the rows shown)
--   variants         BIGINT   distinct raw names folded into the row (both runs)
WITH starts AS (
    SELECT run_id, min(trace_start_ns) AS start_ns, count(DISTINCT rank) AS ranks FROM ranks GROUP BY run_id
), pair AS (
    SELECT coalesce(CAST(COALESCE(getvariable('before'), NULL) AS VARCHAR), arg_min(run_id, (start_ns, run_id))) AS before_run,
        coalesce(CAST(COALESCE(getvariable('after'), NULL) AS VARCHAR), arg_max(run_id, (start_ns, run_id))) AS after_run
    FROM starts
), sides AS (
    SELECT 'before' AS side, p.before_run AS run_id FROM pair p
    UNION ALL
    SELECT 'after', p.after_run FROM pair p
), side_ranks AS (
    SELECT s.side, s.run_id, st.ranks FROM sides s JOIN starts st USING (run_id)
), kernels AS (
    -- the device events of both runs counted and summed per name, in one read of `slices` (a run compared with
    -- itself is read once): the levels below work on names, not events
    SELECT run_id, name, count(*) AS n, sum(dur) AS ns
    FROM slices
    WHERE kind IN ('kernel', 'memcpy', 'memset') AND run_id IN (SELECT run_id FROM sides)
    GROUP BY run_id, name
), basis AS (
    -- device time only when both runs have device events; a CPU-only run is compared on host time
    SELECT CASE WHEN count(DISTINCT run_id) = 2 OR (SELECT before_run = after_run FROM pair) AND count(*) > 0
                THEN 'device' ELSE 'host' END AS time_basis
    FROM kernels
), items AS (
    -- per side and raw name: n executions or calls, ns their time; kernel_family's regular expressions once per
    -- distinct name
    SELECT s.side, 'kernel' AS level, kernel_family(k.name) AS name, k.name AS variant, k.n, k.ns
    FROM kernels k JOIN side_ranks s ON s.run_id = k.run_id
    WHERE (SELECT time_basis FROM basis) = 'device'
    UNION ALL
    SELECT s.side, 'op', o.name, o.name, o.n, o.ns
    FROM (SELECT run_id, name, count(*) AS n,
              sum(CASE (SELECT time_basis FROM basis) WHEN 'device' THEN device_self_ns ELSE self_dur END) AS ns
          FROM ops WHERE run_id IN (SELECT run_id FROM sides) GROUP BY run_id, name) o
    JOIN side_ranks s ON s.run_id = o.run_id
), per_side AS (
    SELECT i.level, i.name,
        coalesce(sum(i.n) FILTER (WHERE i.side = 'before'), 0) / any_value(b.ranks) AS before_count,
        coalesce(sum(i.n) FILTER (WHERE i.side = 'after'), 0) / any_value(a.ranks) AS after_count,
        coalesce(sum(i.ns) FILTER (WHERE i.side = 'before'), 0) / any_value(b.ranks) AS before_ns,
        coalesce(sum(i.ns) FILTER (WHERE i.side = 'after'), 0) / any_value(a.ranks) AS after_ns,
        count(DISTINCT i.variant) AS variants
    FROM items i
    CROSS JOIN (SELECT ranks FROM side_ranks WHERE side = 'before') b
    CROSS JOIN (SELECT ranks FROM side_ranks WHERE side = 'after') a
    GROUP BY i.level, i.name
), ranked AS (
    SELECT *,
        after_count - before_count AS count_delta,
        after_ns - before_ns AS delta_ns,
        sum(after_ns - before_ns) OVER (PARTITION BY level) AS level_delta_ns,
        row_number() OVER (PARTITION BY level ORDER BY abs(after_ns - before_ns) DESC,
                           abs(after_count - before_count) DESC, name) AS rank_in_level
    FROM per_side
)
SELECT p.before_run, p.after_run, r.level, r.rank_in_level, r.name,
    CASE WHEN r.before_count = 0 THEN 'added'
         WHEN r.after_count = 0 THEN 'removed'
         WHEN r.count_delta = 0 AND r.delta_ns = 0 THEN 'same'
         ELSE 'changed' END AS status,
    (SELECT time_basis FROM basis) AS time_basis,
    CAST(r.before_count AS DOUBLE) AS before_count, CAST(r.after_count AS DOUBLE) AS after_count,
    CAST(r.count_delta AS DOUBLE) AS count_delta,
    CAST(r.before_ns AS DOUBLE) AS before_ns, CAST(r.after_ns AS DOUBLE) AS after_ns,
    CAST(r.delta_ns AS DOUBLE) AS delta_ns,
    CAST(CASE WHEN r.before_ns > 0 THEN r.delta_ns / r.before_ns * 100 END AS DOUBLE) AS delta_pct,
    CAST(r.delta_ns / nullif(r.level_delta_ns, 0) AS DOUBLE) AS share_of_change,
    CAST(r.level_delta_ns AS DOUBLE) AS level_delta_ns,
    r.variants
FROM ranked r CROSS JOIN pair p
WHERE r.rank_in_level <= COALESCE(getvariable('top'), 50)
ORDER BY r.level, r.rank_in_level;
