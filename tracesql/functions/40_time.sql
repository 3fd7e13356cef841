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
CREATE OR REPLACE MACRO idle_gaps(scope := 'stream', class_scheme := 'default', analysis_window := 'all',
                                  time_unit_ns := 1, kernel_wait_ns := 30000) AS TABLE
WITH events AS (
    SELECT run_id, rank, device_id, CASE WHEN scope = 'device' THEN NULL ELSE stream END AS stream,
        slice_id, name, ts, ts + dur AS te, step,
        (launch_ts + time_unit_ns - 1) // time_unit_ns * time_unit_ns AS launch_ts
    FROM device_activity(class_scheme := class_scheme, analysis_window := analysis_window,
                         time_unit_ns := time_unit_ns)
), ordered AS (
    SELECT *,
        max(te) OVER w AS gap_start,
        arg_max(slice_id, te) OVER w AS prev_slice_id,
        arg_max(name, te) OVER w AS prev_name
    FROM events
    WINDOW w AS (PARTITION BY run_id, rank, device_id, stream ORDER BY ts, te, slice_id
                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
)
SELECT run_id, rank, device_id, stream, gap_start AS ts, ts - gap_start AS dur,
    CASE WHEN launch_ts > gap_start THEN 'host_wait'
         WHEN ts - gap_start < kernel_wait_ns THEN 'kernel_wait'
         ELSE 'other' END AS category,
    step, prev_slice_id, prev_name, slice_id AS next_slice_id, name AS next_name, launch_ts AS next_launch_ts
FROM ordered
WHERE ts > gap_start;

-- The device timeline of each step: device_timeline's segments clipped to the step's device window, which runs
-- from the first to the last activity (in the analysis window) of the device events the step launched
-- (slices.step; with analysis_window 'all' it is steps.device_ts/device_dur). Inside the window every event counts,
-- whichever step launched it, so the segments of a step add up to its window. Windows of consecutive steps can
-- overlap when a step's last kernels run after the next step's first ones: that time is in both steps.
CREATE OR REPLACE MACRO step_timeline(class_scheme := 'default', analysis_window := 'all', time_unit_ns := 1) AS TABLE
WITH windows AS (
    SELECT run_id, rank, device_id, step, min(ts) AS ts, max(ts + dur) AS te
    FROM device_activity(class_scheme := class_scheme, analysis_window := analysis_window,
                         time_unit_ns := time_unit_ns)
    WHERE step IS NOT NULL
    GROUP BY ALL
)
SELECT t.run_id, t.rank, t.device_id, w.step, greatest(t.ts, w.ts) AS ts,
    least(t.ts + t.dur, w.te) - greatest(t.ts, w.ts) AS dur, t.classes
FROM device_timeline(class_scheme := class_scheme, analysis_window := analysis_window,
                     time_unit_ns := time_unit_ns) t
JOIN windows w ON w.run_id = t.run_id AND w.rank = t.rank AND w.device_id = t.device_id
 AND t.ts < w.te AND t.ts + t.dur > w.ts;

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
