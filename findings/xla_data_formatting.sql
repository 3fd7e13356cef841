-- xla_data_formatting: Steps that spend their time on XLA copies and transposes: data formatting, a layout mismatch between ops.
--
-- An XLA op that only moves data into another layout: a copy or transpose op (XProf's data formatting), or a
-- fusion whose root is one (input_transpose_fusion, loop_transpose_fusion: e.g. the NCHW <-> NHWC transposes
-- around a convolution library call). Async copies (copy-start / copy-done) are transfers, not formatting:
-- xla_async_wait's. Priced by the what-if replay of each step (an XLA profile without steps: its profiled
-- range) with those ops taking no time (faster = their device events' names, 100 %): the layouts agreeing.
-- Evidence: how many, their time and share of the step's device time, the longest. The fix: the layout the
-- consumer wants from the start (a convolution's data format, dimension order of the einsums), no transposes
-- between sharded dimensions.
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
SET VARIABLE xla_data_formatting_change = (
    SELECT '^(' || string_agg(DISTINCT regexp_escape(event_name), '|' ORDER BY regexp_escape(event_name)) || ')$'
    FROM xla_window_ops()
    WHERE (opcode IN ('copy', 'transpose') OR opcode = 'fusion' AND fused_root IN ('copy', 'transpose')) AND dur > 0);

WITH priced AS (
    SELECT * FROM what_if(faster := getvariable('xla_data_formatting_change'), faster_pct := 100)
    -- (no such op in the run: no replay)
    WHERE getvariable('xla_data_formatting_change') IS NOT NULL
), device AS (
    SELECT run_id, rank, instance, sum(dur) AS device_ns,
        count(*) FILTER (WHERE formatting) AS ops, COALESCE(sum(dur) FILTER (WHERE formatting), 0) AS total_ns,
        arg_max(name, dur) FILTER (WHERE formatting) AS longest, max(dur) FILTER (WHERE formatting) AS longest_ns
    FROM (SELECT *, opcode IN ('copy', 'transpose') OR opcode = 'fusion' AND fused_root IN ('copy', 'transpose')
                    AS formatting
          FROM xla_window_ops())
    GROUP BY ALL
)
SELECT p.run_id, p.rank, p.step, 'xla_data_formatting' AS finding,
    printf('%d copy / transpose ops take %.2f ms, %.0f %% of the step''s %.2f ms of XLA ops; without them the step '
           || 'takes %.2f ms less of %.2f ms; longest %s (%.2f ms)', d.ops, d.total_ns / 1e6,
           100 * d.total_ns / d.device_ns, d.device_ns / 1e6, p.saving_ns / 1e6, p.replayed_ns / 1e6, d.longest,
           d.longest_ns / 1e6) AS evidence,
    p.saving_ns, p.saving_pct,
    printf('tracesql query what_if %s -p ''faster=%s'' -p faster_pct=100 -p rank=%d -p instance=%d',
           COALESCE(getvariable('run'), 'RUN'), getvariable('xla_data_formatting_change'), p.rank, p.instance)
        AS query
FROM priced p
JOIN device d ON d.run_id = p.run_id AND d.rank = p.rank AND d.instance = p.instance AND d.ops > 0
WHERE p.saving_pct >= COALESCE(getvariable('min_saving_pct'), 5);
