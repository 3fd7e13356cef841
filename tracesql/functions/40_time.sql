-- Time-side helpers: idle gaps (bubbles), step-clipped timelines, kernel name families.
-- They read only `slices`, `steps` and the macros of 20_activity.sql, because the ingester installs every macro
-- on a connection that has just those two tables (a table macro binds its tables when it is created).

-- The innermost template argument lists dropped: 'a<b<c>, d>' -> 'a<b, d>' (kernel_family applies it 4 times).
CREATE OR REPLACE MACRO drop_innermost_templates(name) AS (regexp_replace(name, '<[^<>]*>', '', 'g'));

-- A kernel's family: its name without what varies between instances of the same code, so that equal kernels
-- group. Drops a leading 'void ', template arguments (up to 4 nesting levels), the argument list, tile/launch
-- shapes such as '_128x64' or '_32x6', a trailing operand layout ('_nn', '_tn'), Triton's argument-spec suffix
-- ('__0d1d2d...') and instance numbers ('_0'; XLA's 'fusion.3', 'copy-start.4'), and ROCm's '.kd' suffix. Copies and
-- memsets keep their names ('Memcpy HtoD (Pinned -> Device)').
-- 'void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>(int, ...)'
--   -> 'at::native::vectorized_elementwise_kernel'; 'ampere_sgemm_128x64_nn' -> 'ampere_sgemm'.
CREATE OR REPLACE MACRO kernel_family(name) AS (
    regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
        drop_innermost_templates(drop_innermost_templates(drop_innermost_templates(
            drop_innermost_templates(regexp_replace(
                -- an XLA op compiled for ROCm ('input_transpose_fusion_1.kd') loses its code-object suffix;
                -- a library kernel's ('Cijk_..._WG32_8.kd': every part names a variant) keeps it
                CASE WHEN regexp_matches(name, '^[a-z][a-z0-9_.-]*\.kd$') THEN regexp_replace(name, '\.kd$', '') ELSE name END,
                '^void ', ''))))),
        '^(.*?[\w>])\(.*$', '\1'),   -- the argument list: from the first '(' right after a name (not 'x::(anon...')
        '_\d+x\d+(x\d+)*', '', 'g'),  -- tile / launch shapes
        '_[nt][nt]$', ''),               -- GEMM operand layout
        '_+(\d+d)+\d*e?$', ''),         -- Triton argument specialisation suffix
        '(_\d+)?(\.\d+)*$', '')        -- instance numbers: '_0', XLA's '.3' and '_1.2'
);

-- Each step's window on each device: from the start of the step's first device event to the start of the next
-- step's first event on that device (steps in the order of their first events, ties by step number); the last
-- step's window ends with the last device event of any step. The windows of a device are disjoint and
-- contiguous, and cover all of its work that belongs to a step, so per-step sums add up to the run's totals over
-- that span. A device event belongs to the step whose launch launched it (slices.step); work with no captured
-- launch to the step of the launched work before it on its stream (docs/concepts/steps.md).
-- A device whose steps are marked on the device itself (XPlane's 'Steps' line: steps.rule 'xplane_steps') has each
-- step's marker as its window, as XProf's per-core step breakdown does (every event inside it counts).
-- events: the step's device events in the analysis window (kernels, copies, memsets).
CREATE OR REPLACE MACRO step_windows(class_scheme := 'default', analysis_window := 'all', time_unit_ns := 1) AS TABLE
WITH markers AS (
    SELECT m.run_id, m.rank, m.device_id, st.step, m.ts, m.ts + m.dur AS te
    FROM steps st JOIN slices m ON m.run_id = st.run_id AND m.rank = st.rank AND m.name = CAST(st.step AS VARCHAR)
    WHERE st.rule = 'xplane_steps' AND m.kind = 'gpu_annotation' AND ends_with(m.track, ' / Steps')
    -- (true of every marker, but DuckDB then estimates them few and builds `marked`'s join on them: with no
    -- markers, the usual case, the device events are then not read for it)
    GROUP BY ALL HAVING count(*) > 0
), activity AS (
    -- read by both branches, so materialized: 8 % more for step_windows alone at 24x, but 15 % less for the
    -- per-step queries that join it again (a second read of device_activity there cost more than the copy)
    SELECT * FROM device_activity(class_scheme := class_scheme, analysis_window := analysis_window,
                                  time_unit_ns := time_unit_ns)
), firsts AS (
    SELECT run_id, rank, device_id, step, min(ts) AS first_ts, count(*) AS events,
        max(max(ts + dur)) OVER (PARTITION BY run_id, rank, device_id) AS device_end
    FROM activity
    WHERE step IS NOT NULL
    GROUP BY run_id, rank, device_id, step
), marked AS (
    -- each marker's events: joined with the markers as the hash table (a LEFT JOIN from the markers built it on
    -- every device event)
    SELECT m.run_id, m.rank, m.device_id, m.step, m.ts, m.te, count(*) AS events
    FROM markers m JOIN activity a ON a.run_id = m.run_id AND a.rank = m.rank AND a.device_id = m.device_id
     AND a.ts >= m.ts AND a.ts < m.te
    GROUP BY ALL
)
-- (the devices with markers left out after the GROUP BY, on its few rows, not on every device event)
SELECT run_id, rank, device_id, step, first_ts AS ts,
    COALESCE(lead(first_ts) OVER (PARTITION BY run_id, rank, device_id ORDER BY first_ts, step), device_end) AS te,
    events
FROM firsts f
WHERE NOT EXISTS (SELECT 1 FROM markers m WHERE m.run_id = f.run_id AND m.rank = f.rank AND m.device_id = f.device_id)
UNION ALL
SELECT m.run_id, m.rank, m.device_id, m.step, m.ts, m.te, COALESCE(k.events, 0)
FROM markers m
LEFT JOIN marked k ON k.run_id = m.run_id AND k.rank = m.rank AND k.device_id = m.device_id AND k.step = m.step
 AND k.ts = m.ts AND k.te = m.te;

-- The step windows (`step_windows`) cut at a common width (half the mean length of the non-empty ones), one row
-- per window and bucket of that width it touches (an empty window: the bucket of its start): the window that
-- holds an instant x of a device is found by an equi-join on (device, x // width) and a check of the one or two
-- windows of that bucket, where a range join would compare x with every window of its device (it grows with
-- rows × steps).
CREATE OR REPLACE MACRO step_window_buckets(class_scheme := 'default', analysis_window := 'all', time_unit_ns := 1) AS TABLE
SELECT w.run_id, w.rank, w.device_id, w.step, w.ts, w.te, w.width, b.bucket
FROM (
    SELECT *, CAST(greatest(sum(te - ts) OVER () // NULLIF(2 * count(CASE WHEN te > ts THEN 1 END) OVER (), 0), 1)
                   AS BIGINT) AS width
    FROM step_windows(class_scheme := class_scheme, analysis_window := analysis_window, time_unit_ns := time_unit_ns)
) w, range(w.ts // w.width, greatest(w.te - 1, w.ts) // w.width + 1) b(bucket);

-- Idle gaps between device events: one row per gap, in the chosen window.
-- scope 'stream': a gap on one stream is the time between the end of everything that ran before on that stream
-- and the start of the next event there; scope 'device': the same over all streams of the device (the gaps of
-- the device's busy set, i.e. its idle time). Gaps are > 0; back-to-back or overlapping events make none.
-- Each gap is classified HTA's way by the event that ends it (`next_*`):
--   host_wait   the host call that launched the next event started after the gap began (the device waited for
--               the CPU to enqueue work);
--   kernel_wait otherwise, when the gap is shorter than kernel_wait_ns (back-to-back launch latency, HTA: 30 µs);
--   other       otherwise (synchronization, dependencies, input).
-- The launch time is rounded like the events (time_unit_ns), so the comparison is made on HTA's whole µs.
-- with_step := false leaves `step` NULL: the step windows are then not computed (they classify every device event
-- a second time) nor joined, for readers that do not use the step.
CREATE OR REPLACE MACRO idle_gaps(scope := 'stream', class_scheme := 'default', analysis_window := 'all',
                                  time_unit_ns := 1, kernel_wait_ns := 30000, with_step := true) AS TABLE
WITH events AS (
    SELECT run_id, rank, device_id, CASE WHEN scope = 'device' THEN NULL ELSE stream END AS stream,
        slice_id, name, ts, ts + dur AS te, (launch_ts + time_unit_ns - 1) // time_unit_ns * time_unit_ns AS launch_ts
    FROM device_activity(class_scheme := class_scheme, analysis_window := analysis_window,
                         time_unit_ns := time_unit_ns)
), ordered AS (
    SELECT *,
        max(te) OVER w AS gap_start,
        -- of the events that end last, the one with the highest slice_id (a unique pick): the largest
        -- end × 10^19 + slice_id (0 <= slice_id < 10^19, and DECIMAL(38, 0) holds it for any end), as DuckDB
        -- runs a max over this frame several times faster than arg_max(slice_id, (te, slice_id))
        max(CAST(te AS DECIMAL(38, 0)) * 10000000000000000000 + slice_id) OVER w AS prev_key,
        arg_max(name, (te, slice_id)) OVER w AS prev_name
    FROM events
    WINDOW w AS (PARTITION BY run_id, rank, device_id, stream ORDER BY ts, te, slice_id
                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
), gaps AS (
    SELECT run_id, rank, device_id, stream, gap_start AS ts, ts - gap_start AS dur,
        CASE WHEN launch_ts > gap_start THEN 'host_wait'
             WHEN ts - gap_start < kernel_wait_ns THEN 'kernel_wait'
             ELSE 'other' END AS category,
        CAST(prev_key - CAST(gap_start AS DECIMAL(38, 0)) * 10000000000000000000 AS BIGINT) AS prev_slice_id,
        prev_name, slice_id AS next_slice_id, name AS next_name, launch_ts AS next_launch_ts
    FROM ordered
    WHERE ts > gap_start
), buckets AS (
    SELECT * FROM step_window_buckets(class_scheme := class_scheme, analysis_window := analysis_window,
                                      time_unit_ns := time_unit_ns)
    WHERE with_step
)
-- a gap's step: the step whose window (step_windows) holds its start (a gap of the device's busy set lies in one
-- window: windows start where an event starts), looked up by bucket (step_window_buckets)
SELECT g.run_id, g.rank, g.device_id, g.stream, g.ts, g.dur, g.category, w.step, g.prev_slice_id, g.prev_name,
    g.next_slice_id, g.next_name, g.next_launch_ts
FROM gaps g
CROSS JOIN (SELECT max(width) AS width FROM buckets) x
LEFT JOIN buckets w ON w.run_id = g.run_id AND w.rank = g.rank AND w.device_id = g.device_id
 AND w.bucket = g.ts // x.width AND g.ts >= w.ts AND g.ts < w.te;

-- The device timeline of each step: device_timeline's segments clipped to the step's window (`step_windows`).
-- Inside the window every event counts, whichever step launched it, so the segments of a step add up to its
-- window, and the steps of a device add up to its timeline over the span of its steps.
-- A device's windows are contiguous and disjoint: a segment overlaps the window that holds its start (looked up
-- by bucket, step_window_buckets) and the windows that start inside it, joined for the few segments that end
-- past the end of their window (or have none: before the first window) only.
CREATE OR REPLACE MACRO step_timeline(class_scheme := 'default', analysis_window := 'all', time_unit_ns := 1) AS TABLE
WITH buckets AS (
    SELECT * FROM step_window_buckets(class_scheme := class_scheme, analysis_window := analysis_window,
                                      time_unit_ns := time_unit_ns)
), placed AS (
    SELECT t.run_id, t.rank, t.device_id, t.ts, t.ts + t.dur AS te, t.classes, w.step, w.te AS window_te
    FROM device_timeline(class_scheme := class_scheme, analysis_window := analysis_window,
                         time_unit_ns := time_unit_ns) t
    CROSS JOIN (SELECT max(width) AS width FROM buckets) x
    LEFT JOIN buckets w ON w.run_id = t.run_id AND w.rank = t.rank AND w.device_id = t.device_id
     AND w.bucket = t.ts // x.width AND t.ts >= w.ts AND t.ts < w.te
)
SELECT run_id, rank, device_id, step, ts, least(te, window_te) - ts AS dur, classes
FROM placed WHERE window_te IS NOT NULL
UNION ALL
SELECT c.run_id, c.rank, c.device_id, w.step, w.ts, least(c.te, w.te) - w.ts, c.classes
FROM placed c
JOIN (SELECT DISTINCT run_id, rank, device_id, step, ts, te FROM buckets) w
  ON w.run_id = c.run_id AND w.rank = c.rank AND w.device_id = c.device_id AND w.ts > c.ts AND w.ts < c.te
WHERE c.window_te IS NULL OR c.te > c.window_te;

-- The timeline an analysis runs over: per = 'rank' is device_timeline (step NULL), per = 'step' is step_timeline.
CREATE OR REPLACE MACRO analysis_timeline(per := 'rank', class_scheme := 'default', analysis_window := 'all',
                                          time_unit_ns := 1) AS TABLE
SELECT *, NULL::INTEGER AS step
FROM device_timeline(class_scheme := class_scheme, analysis_window := analysis_window, time_unit_ns := time_unit_ns)
WHERE per = 'rank'
UNION ALL BY NAME
SELECT *
FROM step_timeline(class_scheme := class_scheme, analysis_window := analysis_window, time_unit_ns := time_unit_ns)
WHERE per = 'step';
