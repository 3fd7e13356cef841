-- straggler: Steps that wait for a slower rank: the rank whose device work held everyone up at the collectives.
--
-- Priced by the what-if replay of each step on every rank together (the what_if query's straggler_to_median = 1):
-- the straggler, the rank whose device work other than communication took the longest in the step, does it as
-- fast as the median of the other ranks; every rank's collectives complete when the last rank arrives, so what
-- that saves on each rank is the time it waited for the straggler (and, on the straggler, its own extra time).
-- One row per rank whose step it shortens. Evidence: the straggler, its device work against the others' median,
-- how often it arrived last at the step's collectives (matched across ranks as in `collectives`) and how late.
-- A rank slow on the host (Python, data loading) is no straggler here: its device work is the median's.
--
-- Needs: several ranks with host ops, the device work they launched and their collectives (Kineto GPU traces)
-- Parameters:
--   run = 'RUN'             text: the run as the user named it, for the query column's command
--   min_saving_pct = 5      number >= 0: fires when the fix saves at least this % of the step
-- Columns:
--   run_id      VARCHAR  run
--   rank        INTEGER  rank
--   step        INTEGER  step
--   finding     VARCHAR  the rule that fired (its file's name)
--   evidence    VARCHAR  what it saw, with the numbers
--   saving_ns   BIGINT   step time the what-if replay says the fix saves (0 when it saves none)
--   saving_pct  DOUBLE   saving_ns in % of the step's replayed time
--   query       VARCHAR  the tracesql command that shows the evidence
WITH priced AS (
    SELECT * FROM what_if(straggler_to_median := 1)
), windows AS (
    SELECT * FROM window_buckets()
), device_time AS (
    SELECT w.run_id, w.window_name, COALESCE(w.step, w.instance) AS joint, d.rank, sum(d.dur) AS busy_ns
    FROM (SELECT d.*, d.launch_ts // x.width AS bucket
          FROM device_activity() d
          JOIN (SELECT DISTINCT run_id, rank, width FROM windows) x ON x.run_id = d.run_id AND x.rank = d.rank
          WHERE d.class <> 'communication') d
    -- (by the launch's start stored on the device event, as launch_overhead.sql does; in its time bucket first:
    -- window_buckets)
    JOIN windows w ON w.run_id = d.run_id AND w.rank = d.rank AND w.bucket = d.bucket
     AND d.launch_ts BETWEEN w.ts AND w.te
    GROUP BY ALL
), straggler AS (
    -- as critical_path_events picks it: the most device work, ties the lower rank
    SELECT s.run_id, s.window_name, s.joint, s.rank, s.busy_ns, median(o.busy_ns) AS median_ns
    FROM (SELECT *, row_number() OVER (PARTITION BY run_id, window_name, joint ORDER BY busy_ns DESC, rank) AS n
          FROM device_time) s
    JOIN device_time o ON o.run_id = s.run_id AND o.window_name = s.window_name AND o.joint = s.joint
     AND o.rank <> s.rank
    WHERE s.n = 1
    GROUP BY s.run_id, s.window_name, s.joint, s.rank, s.busy_ns
), arrivals AS (
    -- the step's matched collectives (device-timed, on two ranks or more): who arrived last, how late
    SELECT run_id, step, rank, start_ns - min(start_ns) OVER instance AS lateness_ns,
        row_number() OVER (instance ORDER BY start_ns DESC, rank DESC) = 1 AS is_last
    FROM (SELECT *, device_ts AS start_ns, count(*) OVER (PARTITION BY run_id, match_key) AS ranks_seen
          FROM collective_calls() WHERE device_ts IS NOT NULL)
    WHERE ranks_seen >= 2
    WINDOW instance AS (PARTITION BY run_id, match_key)
), lateness AS (
    SELECT run_id, step, rank, count(*) AS collectives, count(*) FILTER (WHERE is_last) AS times_last,
        avg(lateness_ns) AS mean_lateness_ns
    FROM arrivals
    GROUP BY ALL
)
SELECT p.run_id, p.rank, p.step, 'straggler' AS finding,
    printf('rank %d is the step''s straggler: its device work took %.2f ms, the other ranks'' median %.2f ms (+%.0f %%); '
           || 'it arrived last at %d of %d collectives (%.2f ms late on average); at the median this rank''s '
           || 'step saves %.2f ms of %.2f ms', s.rank, s.busy_ns / 1e6, s.median_ns / 1e6,
           100 * (s.busy_ns / s.median_ns - 1), COALESCE(l.times_last, 0), COALESCE(l.collectives, 0),
           COALESCE(l.mean_lateness_ns, 0) / 1e6, p.saving_ns / 1e6, p.replayed_ns / 1e6) AS evidence,
    p.saving_ns, p.saving_pct,
    printf('tracesql query what_if %s -p straggler_to_median=1 -p rank=%d -p instance=%d',
           COALESCE(getvariable('run'), 'RUN'), p.rank, p.instance) AS query
FROM priced p
JOIN straggler s ON s.run_id = p.run_id AND s.window_name = p.window_name AND s.joint = COALESCE(p.step, p.instance)
LEFT JOIN lateness l ON l.run_id = p.run_id AND l.step = p.step AND l.rank = s.rank
WHERE p.saving_pct >= COALESCE(getvariable('min_saving_pct'), 5);
