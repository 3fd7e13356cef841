-- xla_async_wait: Steps that wait at XLA's async done ops: a collective or copy started early and still not finished when its result is needed.
--
-- XLA splits a collective or a copy into a start op and a done op (all-gather-start / all-gather-done,
-- copy-start / copy-done: xla_ops.async_start names the start); the work runs between them, overlapped with the
-- ops scheduled there, and the done op lasts as long as the device waits for it to finish (on TPU and CPU the
-- done op is on the device's op line; XLA on GPU runs them as stream waits, no device event). Priced by the
-- what-if replay of each step (an XLA profile without steps: its profiled range) with every done op taking no
-- time (faster = their names, 100 %): the transfer fully hidden. Evidence: the step's done ops, their time, the
-- longest and what started it. The fix: more independent work between start and done (XLA's latency-hiding
-- scheduler, a larger overlap window), a smaller transfer (sharding, dtype), or host offloading moved off the
-- critical path.
--
-- Needs: XLA ops with HLO (a JAX / TensorFlow XPlane profile with its programs)
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
-- The run's change, kept as a value (a what-if regex given as a subquery is compiled for every name it matches)
SET VARIABLE xla_async_wait_change = (
    SELECT '^(' || string_agg(DISTINCT regexp_escape(event_name), '|' ORDER BY regexp_escape(event_name)) || ')$'
    FROM xla_window_ops() WHERE async_start IS NOT NULL AND dur > 0);

WITH priced AS (
    SELECT * FROM what_if(faster := getvariable('xla_async_wait_change'), faster_pct := 100)
    -- (no such op in the run: no replay)
    WHERE getvariable('xla_async_wait_change') IS NOT NULL
), waits AS (
    SELECT run_id, rank, instance, count(*) AS ops, count(DISTINCT device_id) AS devices, sum(dur) AS total_ns,
        arg_max(name, dur) AS longest, arg_max(async_start, dur) AS started_by, max(dur) AS longest_ns
    FROM xla_window_ops() WHERE async_start IS NOT NULL
    GROUP BY ALL
)
SELECT p.run_id, p.rank, p.step, 'xla_async_wait' AS finding,
    printf('%d async done ops on %d devices wait %.2f ms in all; without the waits the step takes %.2f ms less '
           || 'of %.2f ms; longest %s (%.2f ms, started by %s)', w.ops, w.devices, w.total_ns / 1e6,
           p.saving_ns / 1e6, p.replayed_ns / 1e6, w.longest, w.longest_ns / 1e6, w.started_by) AS evidence,
    p.saving_ns, p.saving_pct,
    printf('tracesql query what_if %s -p ''faster=%s'' -p faster_pct=100 -p rank=%d -p instance=%d',
           COALESCE(getvariable('run'), 'RUN'), getvariable('xla_async_wait_change'), p.rank, p.instance) AS query
FROM priced p
JOIN waits w ON w.run_id = p.run_id AND w.rank = p.rank AND w.instance = p.instance
WHERE p.saving_pct >= COALESCE(getvariable('min_saving_pct'), 5);
