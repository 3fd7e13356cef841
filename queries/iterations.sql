-- iterations: Each inference iteration (or step) per rank: phase, batch, tokens, host and device time, the gap before it, per-phase percentiles and how prefills interleave with decodes.
--
-- Iterations are the `steps` rows: vLLM's execute_{tokens}_context_{C}(..)_generation_{G}(..) ranges, SGLang's
-- step[DECODE bs=N] / step[EXTEND bs=N toks=T], vLLM v1's execute_new_{N}_cached_{M}, ProfilerStep#N, or the
-- --step-pattern given at ingest (`steps.rule` says which). phase = prefill, decode or mixed (a batch with both,
-- chunked prefill), from the range's name; NULL when it says none. device_ns = the iteration's device span: from
-- its first to the end of its last device event (those it launched: slices.step); window_ns = its step window
-- (`steps.device_dur`: to the next iteration's first device event, so idle time between iterations is in it);
-- iteration_ns = device_ns, else the host duration. gap_before_ns = host start − the previous
-- iteration's host end on the rank (scheduling and the engine loop between iterations); device_gap_before_ns
-- the same on the device. Per rank and phase: count and p50/p90/p99 of iteration_ns (of the decode phase: the
-- time per output token, TPOT, as the engine sees it). Interleaving: a decode or mixed iteration emits a token
-- per request; token_interval_ns = its end − the previous emitting iteration's end (end = device end, else host
-- end): the inter-token latency including the prefills that ran between, which prefills_before counts and
-- prefill_ns_before sums (their iteration_ns). itl_p50/p99 are its percentiles over the rank's emitting iterations.
--
-- Needs: step ranges: vLLM / SGLang iteration ranges, ProfilerStep, or a --step-pattern at ingest
-- Columns:
--   run_id                VARCHAR  run
--   rank                  INTEGER  rank
--   step                  INTEGER  iteration number (steps.step)
--   rule                  VARCHAR  rule that recognised the range (steps.rule)
--   phase                 VARCHAR  prefill, decode, mixed (NULL: the name does not say)
--   batch_size            INTEGER  requests in the batch (NULL: the name does not say)
--   tokens                BIGINT   tokens processed (NULL: the name does not say)
--   prefill_tokens        BIGINT   of those, prefill tokens
--   host_ns               BIGINT   host duration of the range
--   device_ns             BIGINT   device span: first to the end of the last device event of the iteration (NULL: none)
--   window_ns             BIGINT   the step's device window (steps.device_dur): up to the next iteration's first event
--   iteration_ns          BIGINT   device_ns, else host_ns
--   tokens_per_s          DOUBLE   tokens / iteration_ns
--   gap_before_ns         BIGINT   host start − previous iteration's host end (NULL for the first)
--   device_gap_before_ns  BIGINT   device start − the latest device end of the earlier iterations
--   prev_phase            VARCHAR  phase of the previous iteration on the rank
--   phase_iterations      BIGINT   iterations of this phase on the rank
--   phase_p50_ns          DOUBLE   median iteration_ns of this phase on the rank
--   phase_p90_ns          DOUBLE   90th percentile
--   phase_p99_ns          DOUBLE   99th percentile
--   prefills_before       BIGINT   emitting iterations: prefill iterations since the previous emitting one
--   prefill_ns_before     BIGINT   emitting iterations: their summed iteration_ns
--   token_interval_ns     BIGINT   emitting iterations: end − the previous emitting iteration's end
--   itl_p50_ns            DOUBLE   emitting iterations: median token_interval_ns on the rank
--   itl_p99_ns            DOUBLE   emitting iterations: 99th percentile
WITH spans AS (
    SELECT run_id, rank, step, min(ts) AS device_ts, max(ts + dur) AS device_end
    FROM slices WHERE kind IN ('kernel', 'memcpy', 'memset') AND step IS NOT NULL
    GROUP BY run_id, rank, step
), it AS (
    SELECT s.run_id, s.rank, s.step, s.rule, s.phase, s.batch_size, s.tokens, s.prefill_tokens, s.ts,
        s.dur AS host_ns, d.device_ts, d.device_end - d.device_ts AS device_ns, s.device_dur AS window_ns,
        COALESCE(d.device_end - d.device_ts, s.dur) AS iteration_ns,
        COALESCE(d.device_end, s.ts + s.dur) AS end_ns,
        COALESCE(s.phase IN ('decode', 'mixed'), false) AS emits
    FROM steps s LEFT JOIN spans d ON d.run_id = s.run_id AND d.rank = s.rank AND d.step = s.step
), ordered AS (
    SELECT *,
        ts - lag(ts + host_ns) OVER w AS gap_before_ns,
        device_ts - max(device_ts + device_ns) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)
            AS device_gap_before_ns,
        lag(phase) OVER w AS prev_phase,
        -- emitting iterations before this one: the rows since the previous emitting one share the count
        COALESCE(sum(CASE WHEN emits THEN 1 ELSE 0 END) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
            AS emitted_before,
        CASE WHEN emits THEN end_ns - lag(end_ns) OVER (PARTITION BY run_id, rank, emits ORDER BY ts, step) END
            AS token_interval_ns
    FROM it
    WINDOW w AS (PARTITION BY run_id, rank ORDER BY ts, step)
), grouped AS (
    SELECT *,
        sum(CASE WHEN phase = 'prefill' THEN 1 ELSE 0 END) OVER g AS between_count,
        sum(CASE WHEN phase = 'prefill' THEN iteration_ns ELSE 0 END) OVER g AS between_ns
    FROM ordered
    WINDOW g AS (PARTITION BY run_id, rank, emitted_before)
)
SELECT run_id, rank, step, rule, phase, batch_size, tokens, prefill_tokens, host_ns, device_ns, window_ns,
    iteration_ns,
    tokens * 1e9 / NULLIF(iteration_ns, 0) AS tokens_per_s,
    gap_before_ns, device_gap_before_ns, prev_phase,
    CAST(count(*) OVER p AS BIGINT) AS phase_iterations,
    quantile_cont(iteration_ns, 0.5) OVER p AS phase_p50_ns,
    quantile_cont(iteration_ns, 0.9) OVER p AS phase_p90_ns,
    quantile_cont(iteration_ns, 0.99) OVER p AS phase_p99_ns,
    CASE WHEN emits THEN CAST(between_count AS BIGINT) END AS prefills_before,
    CASE WHEN emits THEN CAST(between_ns AS BIGINT) END AS prefill_ns_before,
    token_interval_ns,
    CASE WHEN emits THEN quantile_cont(token_interval_ns, 0.5) OVER e END AS itl_p50_ns,
    CASE WHEN emits THEN quantile_cont(token_interval_ns, 0.99) OVER e END AS itl_p99_ns
FROM grouped
WINDOW p AS (PARTITION BY run_id, rank, phase), e AS (PARTITION BY run_id, rank, emits)
ORDER BY run_id, rank, ts, step;
