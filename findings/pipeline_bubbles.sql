-- pipeline_bubbles: Pipeline-parallel steps whose stages idle more than the schedule's ideal bubble.
--
-- The stages are the pipeline query's (its rows, `pipeline_stages`: per step and stage, the idle time split into
-- warm-up, cool-down, blocked on a send or recv and other, and against the schedule: the formula's own bubble
-- schedule_ns, imbalance_ns = waiting for the limiting stage, overhead_ns = the rest). Fires when the step's
-- bubble (idle time over the stages' windows) exceeds the schedule's ideal ((p − 1) / (v·m + p − 1)) by
-- min_excess_pct points; one row per pipeline and step, on the limiting stage's rank (the stage that computes
-- longest). Priced by the what-if replay with the limiting stage as fast as the median of the other stages (the
-- what_if query's straggler_to_median = 1: the rank with the most device work, or on CPU stages the most own time
-- in host ops other than communication calls, scaled to the others' median): what the limiting rank's step then
-- saves. The replay cannot price the rest, and the evidence says so: the overhead (transfers, contention, skew:
-- the replay has no change that removes it), nor, where the stages are linked only by host calls (gloo on CPU:
-- no communication kernels to match across ranks), the other stages' waits for the limiting one, so the saving is
-- the limiting rank's own and a lower bound of the pipeline's. The fix: rebalance the stages (move layers off the
-- limiting one), more microbatches, an interleaved or zero-bubble schedule.
--
-- Needs: point-to-point calls with their peers (send/recv of a pipeline-parallel job)
-- Parameters:
--   run = 'RUN'             text: the run as the user named it, for the query column's command
--   min_excess_pct = 10     number >= 0: fires when the step's bubble exceeds the ideal by this many points of %
--   min_saving_pct = 5      number >= 0: ... and the fix saves at least this % of the limiting stage's step
--   microbatches = NULL     integer >= 1: microbatches per step (NULL = from the trace, as the pipeline query)
--   chunks = NULL           integer >= 1: model chunks per rank (NULL = from the trace, as the pipeline query)
-- Columns:
--   run_id      VARCHAR  run
--   rank        INTEGER  rank
--   step        INTEGER  step
--   finding     VARCHAR  the rule that fired (its file's name)
--   evidence    VARCHAR  what it saw, with the numbers
--   saving_ns   BIGINT   step time the what-if replay says the fix saves (0 when it saves none)
--   saving_pct  DOUBLE   saving_ns in % of the step's replayed time
--   query       VARCHAR  the tracesql command that shows the evidence
-- The steps that fire, worked out first and kept as a value (NULL: none): without one, no replay is run.
SET VARIABLE pipeline_bubbles_fired = (
WITH stages AS (
    SELECT * FROM pipeline_stages(given_microbatches := COALESCE(getvariable('microbatches'), NULL),
        given_chunks := COALESCE(getvariable('chunks'), NULL))
), steps_seen AS (
    SELECT run_id, pipeline, step, any_value(stages) AS stages, any_value(microbatches) AS microbatches,
        any_value(microbatches_from) AS microbatches_from, any_value(chunks) AS chunks,
        any_value(window_ns) AS window_ns, any_value(ideal_bubble_pct) AS ideal_bubble_pct,
        any_value(schedule_ns) AS schedule_ns, bool_and(timing = 'host') AS on_host,
        100.0 * sum(idle_ns) / sum(window_ns) AS bubble_pct,
        avg(warmup_ns) AS warmup_ns, avg(p2p_blocked_ns) AS p2p_blocked_ns, avg(cooldown_ns) AS cooldown_ns,
        avg(other_idle_ns) AS other_idle_ns, avg(imbalance_ns) AS imbalance_ns, avg(overhead_ns) AS overhead_ns,
        arg_max(stage, compute_ns) AS limiting_stage, arg_max(rank, compute_ns) AS limiting_rank,
        max(compute_ns) AS limiting_compute_ns, quantile_disc(compute_ns, 0.5) AS median_compute_ns
    FROM stages
    GROUP BY run_id, pipeline, step
)
SELECT list(s) FROM steps_seen s
WHERE bubble_pct - ideal_bubble_pct >= COALESCE(getvariable('min_excess_pct'), 10));

WITH fired AS (
    SELECT unnest(getvariable('pipeline_bubbles_fired'), recursive := true)
), priced AS (
    SELECT * FROM what_if(straggler_to_median := 1)
    -- (no step fired: no replay)
    WHERE getvariable('pipeline_bubbles_fired') IS NOT NULL
)
SELECT f.run_id, CAST(f.limiting_rank AS INTEGER) AS rank, f.step, 'pipeline_bubbles' AS finding,
    printf('pipeline%s step %d: its %d stages idle %.1f %% of the %.2f ms window, the schedule''s ideal %.1f %% '
           || '(p = %d, m = %d from the %s, v = %d); idle per stage (mean): warm-up %.2f ms, blocked on send/recv '
           || '%.2f ms, cool-down %.2f ms, other %.2f ms; against the schedule (mean): its formula''s %.2f ms, waiting '
           || 'for the limiting stage %d (rank %d, computes %.2f ms, the median stage %.2f ms) %.2f ms, overhead '
           || '(transfers, contention, skew) %.2f ms. At the median the limiting stage''s step saves %.2f ms of %.2f ms; %s',
           CASE WHEN f.pipeline = '' THEN '' ELSE ' ' || f.pipeline END, f.step, f.stages, f.bubble_pct,
           f.window_ns / 1e6, f.ideal_bubble_pct, f.stages, f.microbatches, f.microbatches_from, f.chunks,
           f.warmup_ns / 1e6, f.p2p_blocked_ns / 1e6, f.cooldown_ns / 1e6, f.other_idle_ns / 1e6,
           f.schedule_ns / 1e6, f.limiting_stage, f.limiting_rank, f.limiting_compute_ns / 1e6,
           f.median_compute_ns / 1e6, f.imbalance_ns / 1e6, f.overhead_ns / 1e6,
           COALESCE(p.saving_ns, 0) / 1e6, COALESCE(p.replayed_ns, f.window_ns) / 1e6,
           CASE WHEN f.on_host THEN 'the replay prices neither the overhead nor the other stages'' waits for the '
                    || 'limiting one (CPU stages, linked by host calls only: a lower bound)'
                ELSE 'the replay does not price the overhead' END) AS evidence,
    COALESCE(p.saving_ns, 0) AS saving_ns, COALESCE(p.saving_pct, 0) AS saving_pct,
    printf('tracesql query pipeline %s', COALESCE(getvariable('run'), 'RUN')) AS query
FROM fired f
LEFT JOIN priced p ON p.run_id = f.run_id AND p.rank = f.limiting_rank AND p.step = f.step
WHERE COALESCE(p.saving_pct, 0) >= COALESCE(getvariable('min_saving_pct'), 5);
