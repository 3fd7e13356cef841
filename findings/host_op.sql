-- host_op: Steps bound by one host op: the CPU work the device waits for.
--
-- The host op (cpu_op) with the most own time on the critical paths of the run's steps, launch, synchronising
-- and copy calls and data loading left out (other rules price those); priced by the what-if replay of each step
-- with that op taking no time (the what_if query's faster = its name, faster_pct = 100): what the step waited
-- for it. Evidence: its calls and self time in the step, and the host share of the step's critical path. The
-- fix: make that op cheaper or move it off the step's path (another thread, the device, fewer calls).
--
-- Needs: host ops and the device work the step launched (Kineto GPU traces with correlation ids)
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
SET VARIABLE host_op_name = (
    -- the op whose own time lies most on the steps' critical paths: what the steps waited for (the largest by
    -- self time may run while the device is busy)
    -- (their time by name first, then the cause of each name: of each host op, 0.5 CPU-s at 24x)
    WITH by_name AS MATERIALIZED (
        SELECT e.name, sum(w.s.dur_ns) AS dur_ns
        FROM step_critical_paths() w
        JOIN slices e ON e.run_id = w.run_id AND e.rank = w.rank AND e.slice_id = w.s.event_id
        WHERE w.s.edge = 'op' AND e.kind = 'cpu_op'
        GROUP BY e.name)
    SELECT name
    FROM by_name
    WHERE critical_path_cause(NULL, 'cpu_op', name, NULL) = 'host'
    ORDER BY dur_ns DESC, name
    LIMIT 1);

WITH priced AS (
    SELECT * FROM what_if(faster := '^' || regexp_escape(getvariable('host_op_name')) || '$', faster_pct := 100)
), fired AS MATERIALIZED (
    -- the steps where it fires: the evidence is gathered of those only (of every step it took 0.3-1.3 s
    -- a rule at 24x, where none fires)
    SELECT * FROM priced WHERE saving_pct >= COALESCE(getvariable('min_saving_pct'), 5)
), windows AS (
    SELECT w.* FROM critical_path_windows() w
    SEMI JOIN fired f ON f.run_id = w.run_id AND f.rank = w.rank AND f.instance = w.instance
), calls AS (
    SELECT w.run_id, w.rank, w.instance, any_value(o.name) AS name, count(*) AS calls, sum(o.self_dur) AS self_ns
    FROM windows w
    JOIN ops o ON o.run_id = w.run_id AND o.rank = w.rank AND o.ts BETWEEN w.ts AND w.te
    WHERE o.name = getvariable('host_op_name')
    GROUP BY ALL
)
SELECT p.run_id, p.rank, p.step, 'host_op' AS finding,
    printf('without %s the step takes %.2f ms less of %.2f ms: %d calls, %.2f ms self time; host and launches are '
           || '%.0f %% of the critical path', c.name, p.saving_ns / 1e6, p.replayed_ns / 1e6, c.calls,
           c.self_ns / 1e6, 100 * p.host_launch_share) AS evidence,
    p.saving_ns, p.saving_pct,
    printf('tracesql query what_if %s -p ''faster=^%s$'' -p faster_pct=100 -p rank=%d -p instance=%d',
           COALESCE(getvariable('run'), 'RUN'), regexp_escape(c.name), p.rank, p.instance) AS query
FROM fired p
JOIN calls c ON c.run_id = p.run_id AND c.rank = p.rank AND c.instance = p.instance;
