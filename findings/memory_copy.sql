-- memory_copy: Steps that wait for memory copies: transfers not overlapped with compute, pageable or slow copies.
--
-- Priced by the what-if replay of each step with its device copies and memsets taking no time (the what_if
-- query's faster = '^Mem(cpy|set) ', faster_pct = 100): what the step waited for them, as if they were hidden
-- under compute (the upper bound of overlapping them). Evidence: the step's copies (those its host calls
-- launched), their time and bytes, the mean bandwidth, how many copied from or to pageable memory (a copy from
-- pageable memory is staged through a pinned buffer and blocks the host), and the copies' share of the
-- critical path. The fix: pin the host buffers (DataLoader pin_memory=True), copy with non_blocking=True on a
-- side stream, keep data on the device; `tracesql query copy_bandwidth` shows each kind's bandwidth.
--
-- Needs: host calls and the device copies they launched (Kineto GPU traces with correlation ids)
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
    SELECT * FROM what_if(faster := '^Mem(cpy|set) ', faster_pct := 100)
), fired AS MATERIALIZED (
    -- the steps where it fires: the evidence is gathered of those only (of every step it took 0.3-1.3 s
    -- a rule at 24x, where none fires)
    SELECT * FROM priced WHERE saving_pct >= COALESCE(getvariable('min_saving_pct'), 5)
), windows AS (
    SELECT w.* FROM critical_path_windows() w
    SEMI JOIN fired f ON f.run_id = w.run_id AND f.rank = w.rank AND f.instance = w.instance
), copies AS (
    SELECT d.run_id, d.rank, w.instance, count(*) AS copies, sum(d.dur) AS total_ns,
        COALESCE(sum(TRY_CAST(json_extract(d.args, '$.bytes') AS BIGINT)), 0) AS bytes,
        count(*) FILTER (WHERE contains(d.name, 'Pageable')) AS pageable
    FROM slices d
    -- (by the launch's start stored on the device event, as launch_overhead.sql does)
    JOIN windows w ON w.run_id = d.run_id AND w.rank = d.rank AND d.launch_ts BETWEEN w.ts AND w.te
    WHERE d.kind IN ('memcpy', 'memset') AND d.launch_id <> d.slice_id
    GROUP BY ALL
)
SELECT p.run_id, p.rank, p.step, 'memory_copy' AS finding,
    printf('without copies the step takes %.2f ms less of %.2f ms: %d copies and memsets, %.2f ms, %.1f MB '
           || '(%.1f GB/s), %d from or to pageable memory; copies are %.0f %% of the critical path',
           p.saving_ns / 1e6, p.replayed_ns / 1e6, c.copies, c.total_ns / 1e6, c.bytes / 1e6,
           c.bytes / greatest(c.total_ns, 1), c.pageable, 100 * p.memory_copy_share) AS evidence,
    p.saving_ns, p.saving_pct,
    printf('tracesql query what_if %s -p ''faster=^Mem(cpy|set) '' -p faster_pct=100 -p rank=%d -p instance=%d',
           COALESCE(getvariable('run'), 'RUN'), p.rank, p.instance) AS query
FROM fired p
JOIN copies c ON c.run_id = p.run_id AND c.rank = p.rank AND c.instance = p.instance;
