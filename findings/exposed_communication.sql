-- exposed_communication: Steps that wait for communication: collectives not hidden under compute.
--
-- Priced by the what-if replay of each step with communication kernels taking no time (the what_if query's
-- hide_communication = 1): what that saves is the communication the step waited for. Evidence: the step's
-- communication kernels (those its host ops launched), their time, the longest one and its share of the step's
-- critical path. The replay sees one rank's trace: a collective that waits for a slower rank lasts the wait, so a
-- straggler shows here on the ranks that wait for it (`tracesql query collectives` names the last to arrive).
--
-- On an XLA profile of TPU or CPU (no launches) the step's collectives are the communication ops its devices ran:
-- on the CPU they run one at a time between the matmuls, never overlapped.
--
-- Needs: host ops and the communication kernels they launched (Kineto GPU traces with correlation ids), or an XLA
-- profile's device ops
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
    SELECT * FROM what_if(hide_communication := 1)
), fired AS MATERIALIZED (
    -- the steps where it fires: the evidence is gathered of those only (of every step it took 0.3-1.3 s
    -- a rule at 24x, where none fires)
    SELECT * FROM priced WHERE saving_pct >= COALESCE(getvariable('min_saving_pct'), 5)
), windows AS (
    SELECT w.* FROM critical_path_windows() w
    SEMI JOIN fired f ON f.run_id = w.run_id AND f.rank = w.rank AND f.instance = w.instance
), communication AS (
    SELECT d.run_id, d.rank, w.instance, count(*) AS kernels, sum(d.dur) AS total_ns,
        arg_max(d.name, d.dur) AS longest, max(d.dur) AS longest_ns
    FROM device_activity() d
    LEFT JOIN device_only_ranks() o ON o.run_id = d.run_id AND o.rank = d.rank
    -- (by their launch's start; on a rank without launches, XLA's: those that start in the window)
    JOIN windows w ON w.run_id = d.run_id AND w.rank = d.rank
     AND CASE WHEN o.rank IS NULL THEN d.launch_ts ELSE d.ts END BETWEEN w.ts AND w.te
    WHERE d.class = 'communication'
    GROUP BY ALL
)
SELECT p.run_id, p.rank, p.step, 'exposed_communication' AS finding,
    printf('hiding communication saves %.2f ms of %.2f ms: %d communication kernels, %.2f ms in all, %.0f %% of '
           || 'the critical path; longest %s (%.2f ms)', p.saving_ns / 1e6, p.replayed_ns / 1e6, c.kernels,
           c.total_ns / 1e6, 100 * p.communication_share, c.longest, c.longest_ns / 1e6) AS evidence,
    p.saving_ns, p.saving_pct,
    printf('tracesql query what_if %s -p hide_communication=1 -p rank=%d -p instance=%d',
           COALESCE(getvariable('run'), 'RUN'), p.rank, p.instance) AS query
FROM fired p
JOIN communication c ON c.run_id = p.run_id AND c.rank = p.rank AND c.instance = p.instance;
