-- Device activity, its classes, and the timeline of which classes are busy when.
-- Used by the curated queries and available in every session on a run.

-- The class of each distinct (kind, name, category) of the device events (kernels, copies, memsets) of each rank,
-- by the rules of scheme class_scheme: the rule of lowest priority that matches; names no rule matches have no
-- row. The shipped schemes (default, hta) are those of kernel_classes.csv, compiled into shipped_kernel_class;
-- a scheme of the user's own is read from the table `kernel_classes`. A name is known by its 64-bit hash
-- (name_hash: join on hash(name)), and its class is found on one event that bears it, so that no step holds every
-- distinct name: a trace of a million distinct 8 kB kernel names is classified within a 256 MB limit. The
-- ingester stores the 'default' scheme's class in slices.class; device_activity classifies with this macro the
-- other scheme and the events of runs written before that column (schema < 9).
CREATE OR REPLACE MACRO device_classes(class_scheme := 'default') AS TABLE
-- (firsts MATERIALIZED: its few rows are then the semi-join's build side, and their slice_ids bound the read of
-- `named` to the row groups that hold them; inlined, DuckDB built the join on every device event's name: 3x slower)
WITH firsts AS MATERIALIZED (
    SELECT run_id, rank, kind, category, hash(name) AS name_hash, min(slice_id) AS slice_id
    FROM slices WHERE kind IN ('kernel', 'memcpy', 'memset')
    GROUP BY run_id, rank, kind, category, name_hash
), named AS (
    -- the first event of each name, streamed past the first events' ids (a semi-join: the names are never a
    -- join's build side)
    SELECT run_id, rank, kind, category, name FROM slices
    WHERE kind IN ('kernel', 'memcpy', 'memset') AND (run_id, rank, slice_id) IN (SELECT run_id, rank, slice_id FROM firsts)
)
SELECT * FROM (
    SELECT run_id, rank, kind, category, hash(name) AS name_hash,
        shipped_kernel_class(class_scheme, kind, name, category) AS class
    FROM named WHERE shipped_class_scheme(class_scheme)
) WHERE class IS NOT NULL
UNION ALL
SELECT n.run_id, n.rank, n.kind, n.category, hash(n.name) AS name_hash, arg_min(r.class, r.priority) AS class
FROM named n
-- a LEFT JOIN, which DuckDB does not reorder: as an inner join it matched the rules against every device event
-- before the semi-join kept the first ones (75 s instead of 0.4 s on 535 k kernels of 51 names)
LEFT JOIN kernel_classes r
  ON r.scheme = class_scheme AND (r.kind IS NULL OR r.kind = n.kind)
 AND (r.name_regex IS NULL OR regexp_matches(n.name, r.name_regex))
 AND (r.category_regex IS NULL OR regexp_matches(n.category, r.category_regex))
WHERE NOT shipped_class_scheme(class_scheme)
GROUP BY n.run_id, n.rank, n.kind, n.category, name_hash
HAVING arg_min(r.class, r.priority) IS NOT NULL;

-- Kernels, copies and memsets, each with its class (compute / communication / memory / infeed_outfeed) from
-- `kernel_classes`, whose rules match the kind, the name and the category (XLA ops: their HLO category).
-- class_scheme: 'default' (tracesql's rules) or 'hta' (Holistic Trace Analysis' name rules).
-- analysis_window: 'all' (every device event) or 'hta' (HTA 0.5's window, Trace._filter_irrelevant_gpu_kernels,
-- followed exactly): when the run's traces name fewer than two ProfilerSteps, every device event; else, per rank,
-- the events whose launch (a host runtime call with their correlation id) started before the rank's last
-- ProfilerStep began, and the events with no correlation id whose own start is before it (HTA counts those among
-- the host events it filters by start); events with a correlation id but no recorded launch are dropped. In
-- both cases MTIA DMA requests whose event has no stream argument are left out (HTA analyses only events on a
-- stream).
-- time_unit_ns: 1 keeps nanoseconds; 1000 shrinks every event to whole microseconds (start rounded up, end rounded
-- down), as HTA does with fractional-microsecond Kineto timestamps: up to 1 µs less busy time per event.
CREATE OR REPLACE MACRO device_activity(class_scheme := 'default', analysis_window := 'all', time_unit_ns := 1) AS TABLE
WITH classified AS (
    -- the default scheme's class as stored at ingest (slices.class) when every run of the session stored it
    -- (tracesql.connect sets the variable tracesql_classes_stored then); else, and for the other scheme, the
    -- classes by the rules (each event's, or each distinct name's: device_classes), so that a run of either
    -- version and either scheme gives the same rows. An event no rule matches is left out (its stored class is NULL)
    SELECT * FROM slices
    WHERE class_scheme = 'default' AND COALESCE(getvariable('tracesql_classes_stored'), false)
      AND kind IN ('kernel', 'memcpy', 'memset') AND class IS NOT NULL
    UNION ALL
    -- a shipped scheme of few rules (HTA's) matched on each event: cheaper than device_classes' two reads.
    -- (Where the classes are stored, every device event has one, and only device events: `class IS NOT NULL` is
    -- then a filter DuckDB applies while it reads, where it reads every row's columns for the kind IN list)
    SELECT * FROM (
        SELECT * REPLACE (shipped_kernel_class(class_scheme, kind, name, category) AS class)
        FROM slices
        WHERE kind IN ('kernel', 'memcpy', 'memset') AND shipped_class_per_event(class_scheme)
          AND (class IS NOT NULL OR NOT COALESCE(getvariable('tracesql_classes_stored'), false)))
    WHERE class IS NOT NULL
    UNION ALL
    SELECT s.* REPLACE (c.class AS class)
    FROM slices s
    JOIN device_classes(class_scheme := class_scheme) c
      ON c.run_id = s.run_id AND c.rank = s.rank AND c.kind = s.kind AND c.name_hash = hash(s.name)
     AND c.category IS NOT DISTINCT FROM s.category
    -- (the kinds device_classes has, filtered while reading: the join alone hashed every slice's name)
    WHERE s.kind IN ('kernel', 'memcpy', 'memset') AND NOT shipped_class_per_event(class_scheme)
      AND (class_scheme <> 'default' OR NOT COALESCE(getvariable('tracesql_classes_stored'), false))
), filtered_runs AS (
    -- HTA's rule: a run whose traces name at least two steps (all ranks together) is filtered ...
    -- (HTA knows ProfilerStep ranges only, not inference iterations)
    SELECT run_id FROM steps WHERE analysis_window = 'hta' AND (rule IS NULL OR rule = 'profiler_step')
    GROUP BY run_id HAVING count(DISTINCT name) >= 2
), step_bounds AS (
    -- ... by each rank's last step start (a rank with no step keeps nothing, as in HTA)
    SELECT run_id, rank, max(ts) AS last_start FROM steps
    WHERE analysis_window = 'hta' AND (rule IS NULL OR rule = 'profiler_step')
    GROUP BY run_id, rank
), early_calls AS (
    -- HTA keeps device work if any host call with its correlation id started before the rank's last step. Its
    -- recorded launch (slices.launch_ts: one of those calls) answers for most; the others are looked up only for
    -- the few events whose launch started later or was not recorded (grouping every host call by correlation
    -- id took a third of the query)
    SELECT h.run_id, h.rank, h.correlation
    FROM slices h JOIN step_bounds b ON b.run_id = h.run_id AND b.rank = h.rank
    WHERE analysis_window = 'hta' AND h.kind IN ('runtime', 'driver') AND h.correlation IS NOT NULL
      AND h.ts < b.last_start
      AND (h.run_id, h.rank, h.correlation) IN (
          SELECT d.run_id, d.rank, d.correlation
          FROM slices d JOIN step_bounds b ON b.run_id = d.run_id AND b.rank = d.rank
          WHERE d.kind IN ('kernel', 'memcpy', 'memset') AND d.correlation IS NOT NULL
            AND (d.class IS NOT NULL OR NOT COALESCE(getvariable('tracesql_classes_stored'), false))
            AND (d.launch_ts IS NULL OR d.launch_ts >= b.last_start))
), streamless AS (
    -- MTIA DMA requests whose event names no stream (the reader gives them their thread as stream; HTA gives -1
    -- and analyses only events on a stream): looked for among that category's rows, so that `args` is read
    -- for them alone, not for every device event
    SELECT run_id, rank, slice_id FROM slices
    WHERE analysis_window = 'hta' AND category = 'mtia_ccp_events' AND json_extract_string(args, '$.stream') IS NULL
), kept AS (
    -- two branches, one per window: the constant `analysis_window` empties one, so that the 'all' window neither
    -- reads the columns of HTA's joins (slice_id, correlation) nor runs them
    SELECT * FROM classified
    WHERE analysis_window = 'all'
    UNION ALL
    SELECT s.*
    FROM classified s
    LEFT JOIN filtered_runs f ON f.run_id = s.run_id
    LEFT JOIN step_bounds b ON b.run_id = s.run_id AND b.rank = s.rank
    LEFT JOIN streamless x ON x.run_id = s.run_id AND x.rank = s.rank AND x.slice_id = s.slice_id
    WHERE analysis_window = 'hta' AND x.slice_id IS NULL AND (
          f.run_id IS NULL  -- fewer than two step names: no filter
       OR (s.correlation IS NULL AND s.ts < b.last_start)
       OR (s.correlation IS NOT NULL AND s.launch_ts < b.last_start)
       -- (a semi-join: early_calls, of a few rows, is its build side)
       OR (s.run_id, s.rank, s.correlation) IN (SELECT run_id, rank, correlation FROM early_calls))
)
SELECT * REPLACE (
        CASE WHEN time_unit_ns = 1 THEN ts ELSE (ts + time_unit_ns - 1) // time_unit_ns * time_unit_ns END AS ts,
        greatest((ts + dur) // time_unit_ns * time_unit_ns
                 - (ts + time_unit_ns - 1) // time_unit_ns * time_unit_ns, 0) AS dur)
FROM kept;

-- The busy timeline of each device: consecutive segments from its first to its last activity, each with the set
-- of classes running then as bits (1 compute, 2 communication, 4 memory; 0 = idle). Summing `dur` over segments
-- gives unions and intersections of intervals exactly, however many streams overlap.
CREATE OR REPLACE MACRO device_timeline(class_scheme := 'default', analysis_window := 'all', time_unit_ns := 1) AS TABLE
WITH events AS (
    -- an event adds one to its class's count of running events; the three counts share one integer, 21 bits each
    -- (compute + communication * 2^21 + memory * 2^42), so that one running sum keeps all three (exact while fewer
    -- than 2^21 events of a class run at once on a device)
    SELECT * FROM (
        SELECT run_id, rank, device_id, ts, ts + dur AS te,
            -- infeed/outfeed (XLA) moves data between host and device: memory traffic on the timeline
            CASE class WHEN 'compute' THEN 1 WHEN 'communication' THEN 2097152
                       WHEN 'memory' THEN 4398046511104 WHEN 'infeed_outfeed' THEN 4398046511104 END AS delta
        FROM device_activity(class_scheme := class_scheme, analysis_window := analysis_window,
                             time_unit_ns := time_unit_ns))
    WHERE delta IS NOT NULL
), devices AS (
    -- one number per device (dev): the sweep below sorts by it, faster than by the run's name (run_id, rank and
    -- device_id ride along unsorted). (HAVING holds for every device, but with it DuckDB estimates the devices
    -- fewer than the events, and joins them with the devices, not the events, as its hash table)
    SELECT run_id, rank, device_id, row_number() OVER (ORDER BY run_id, rank, device_id) AS dev
    FROM (SELECT run_id, rank, device_id FROM events GROUP BY ALL HAVING count(*) > 0)
), keyed AS (
    SELECT d.dev, e.run_id, e.rank, e.device_id, e.ts, e.te, e.delta
    FROM events e
    LEFT JOIN devices d ON d.run_id = e.run_id AND d.rank = e.rank AND d.device_id IS NOT DISTINCT FROM e.device_id
), states AS (
    -- the counts after each edge, in the order of (device, instant): of the edges at one instant, the last in the
    -- sweep's order has them all summed (whatever their order among themselves), and it alone is followed by a
    -- later instant. `lead` has a window of its own, as Spark takes no frame for it; it has the sum's order, so
    -- both engines compute the two over one sort. One sweep over all devices rather than a partition each: a
    -- device's edges sum to 0, so each device starts from zero all the same.
    SELECT run_id, rank, device_id, dev, t, sum(delta) OVER (w ROWS UNBOUNDED PRECEDING) AS running,
        lead(t) OVER w AS t_next, lead(dev) OVER w AS next_dev
    FROM (SELECT dev, run_id, rank, device_id, ts AS t, delta FROM keyed
          UNION ALL
          SELECT dev, run_id, rank, device_id, te AS t, -delta AS delta FROM keyed)
    WINDOW w AS (ORDER BY dev, t)
)
-- a segment runs to the device's next instant; a class's bit is set while any of its events runs, so identical or
-- nested events on several streams count once
SELECT run_id, rank, device_id, t AS ts, t_next - t AS dur,
    CAST(CASE WHEN running & 2097151 > 0 THEN 1 ELSE 0 END + CASE WHEN (running >> 21) & 2097151 > 0 THEN 2 ELSE 0 END
         + CASE WHEN running >> 42 > 0 THEN 4 ELSE 0 END AS INTEGER) AS classes
FROM states
WHERE t_next > t AND next_dev = dev;
