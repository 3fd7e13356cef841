-- pipeline: Pipeline-parallel stages per step: compute, idle time decomposed, the schedule's ideal bubble, the limiting stage.
--
-- A pipeline is the ranks linked by point-to-point calls with a known peer (collectives.peer) on one process group.
-- A rank's stage is the order of its first send in the step (the first stage needs no input and sends first; each
-- later one sends after its first input arrives). The step's window is the pipeline's: from the first member's
-- step start to the last member's step end (so a stage that starts late or ends early is idle there; ranks' clocks
-- must agree: on several hosts see clock_offsets). A stage computes when its device runs non-communication work
-- (device_activity), or, on a rank without device work (CPU stages), when its host runs an op other than a
-- communication call (c10d::*, record_param_comms). idle_ns = window − compute, split two ways that each add up:
--   by position: warmup_ns (idle before the stage's first input arrives: its first recv ends; the first stage: its
--   first compute), cooldown_ns (idle after its last send or recv ends), p2p_blocked_ns (between those, idle
--   during a send or recv call of the rank, its kernels, or a receive's transfer annotation such as gloo:recv:
--   the stage waits for input; a send's annotation lasts until the peer takes it, while the stage goes on, and
--   is left out), other_idle_ns (the rest: host overhead, waiting for a core, a send the stage waits on);
--   against the schedule: with the limiting stage's compute C (the stage that computes longest: limiting = true),
--   the ideal schedule lasts T = C · (v·m + p − 1) / (v·m), so schedule_ns = T − C (the formula's bubble),
--   imbalance_ns = C − compute_ns (waiting for the slower stage) and overhead_ns = window − T (communication,
--   contention, skew: what the formula leaves out).
-- ideal_bubble_pct = 100 · (p − 1) / (v·m + p − 1) (pipeline_bubble_fraction: GPipe and 1F1B with v = 1,
-- interleaved 1F1B with v chunks per rank); zero_bubble_pct = ZB-H1's (Qi et al. 2024, equal forward, input-
-- and weight-gradient times: a third of 1F1B's bubble time) = 100 · (p − 1) / (3m + p − 1). p = the stages seen;
-- m and v = the microbatches and chunks parameters, else read from the ranges torch.distributed.pipelining records
-- in the step (GPipe: "Forward <microbatch>"; the runtime schedules, interleaved and zero-bubble:
-- "PP:<stage>F<microbatch>", v = the stages one rank runs), else v = 1 and m inferred from the first stage's sends
-- to the second in the step (one tensor per microbatch and chunk: v·m, plus (v − 1)·m gradients when p = 2;
-- 1F1B records no ranges).
--
-- Needs: point-to-point calls with their peers (send/recv of a pipeline-parallel job)
-- Parameters:
--   microbatches = NULL        integer >= 1: microbatches per step (NULL = from the schedule's ranges, else the sends)
--   chunks = NULL              integer >= 1: model chunks (virtual stages) per rank, > 1 for interleaved 1F1B (NULL = from the ranges, else 1)
-- Columns:
--   run_id            VARCHAR  run
--   pipeline          VARCHAR  process group of the stages' send/recv calls ('' when not recorded)
--   step              INTEGER  step
--   stage             BIGINT   stage, 0 = first (order of first sends)
--   rank              INTEGER  rank running the stage
--   timing            VARCHAR  'device' (compute from device work) or 'host' (from host ops: CPU stages)
--   stages            BIGINT   p: stages (ranks) in the pipeline
--   microbatches      BIGINT   m: given or inferred
--   microbatches_from VARCHAR  'parameter', 'trace' (the schedule's ranges) or 'sends' (counted on the first link)
--   chunks            BIGINT   v: model chunks per rank
--   window_ns         BIGINT   the pipeline's step window
--   compute_ns        BIGINT   time the stage computed in its step
--   idle_ns           BIGINT   window_ns − compute_ns
--   warmup_ns         BIGINT   idle before the first input arrived
--   p2p_blocked_ns    BIGINT   idle with a send or recv in flight (after warm-up, before cool-down)
--   cooldown_ns       BIGINT   idle after the last send or recv ended
--   other_idle_ns     BIGINT   the rest of idle_ns
--   bubble_pct        DOUBLE   100 · idle_ns / window_ns
--   ideal_bubble_pct  DOUBLE   100 · (p − 1) / (v·m + p − 1)
--   zero_bubble_pct   DOUBLE   ZB-H1's ideal: 100 · (p − 1) / (3m + p − 1)
--   schedule_ns       BIGINT   the schedule's own bubble at the limiting stage's compute: T − C
--   imbalance_ns      BIGINT   C − compute_ns: waiting for the limiting stage
--   overhead_ns       BIGINT   window_ns − T: beyond the formula (communication, contention, skew)
--   limiting          BOOLEAN  the stage that computes longest (limits the pipeline)
WITH p2p AS (
    SELECT run_id, rank, COALESCE(pg_name, '') AS pipeline, collective, peer, step,
        COALESCE(cpu_ts, device_ts) AS ts,
        greatest(COALESCE(cpu_ts + cpu_dur, device_ts + device_dur),
                 COALESCE(device_ts + device_dur, cpu_ts + cpu_dur)) AS end_ts
    FROM collectives WHERE collective IN ('send', 'recv') AND peer IS NOT NULL AND step IS NOT NULL
), members AS (
    SELECT DISTINCT run_id, pipeline, rank FROM p2p
), own_steps AS (  -- each member's own step range
    SELECT m.run_id, m.pipeline, s.step, m.rank, s.ts AS own_start, s.ts + s.dur AS own_end
    FROM members m JOIN steps s ON s.run_id = m.run_id AND s.rank = m.rank
), windows AS (
    SELECT run_id, pipeline, step, min(own_start) AS w_start, max(own_end) AS w_end, count(*) AS stages
    FROM own_steps GROUP BY run_id, pipeline, step
), firsts AS (
    SELECT run_id, pipeline, step, rank, min(ts) FILTER (WHERE collective = 'send') AS first_send,
        min(end_ts) FILTER (WHERE collective = 'recv') AS first_input, max(end_ts) AS last_p2p
    FROM p2p GROUP BY run_id, pipeline, step, rank
), stages AS (
    SELECT o.*, w.w_start, w.w_end, w.stages, f.first_input, f.last_p2p,
        row_number() OVER (PARTITION BY o.run_id, o.pipeline, o.step ORDER BY f.first_send NULLS LAST, o.rank) - 1
            AS stage
    FROM own_steps o JOIN windows w USING (run_id, pipeline, step)
    JOIN firsts f USING (run_id, pipeline, step, rank)
), device_work AS (
    SELECT run_id, rank, ts, ts + dur AS end_ts FROM device_activity() WHERE class <> 'communication'
), device_ranks AS (
    SELECT DISTINCT run_id, rank FROM device_work
), work AS (
    SELECT run_id, rank, ts, end_ts, 'device' AS timing FROM device_work
    UNION ALL
    SELECT s.run_id, s.rank, s.ts, s.ts + s.dur, 'host' FROM slices s
    JOIN members m ON m.run_id = s.run_id AND m.rank = s.rank
    ANTI JOIN device_ranks d ON d.run_id = s.run_id AND d.rank = s.rank
    WHERE s.kind = 'cpu_op' AND s.dur > 0 AND NOT starts_with(s.name, 'c10d::') AND s.name <> 'record_param_comms'
), clipped AS (  -- each stage's work inside its own step
    SELECT st.run_id, st.pipeline, st.step, st.rank, w.timing,
        greatest(w.ts, st.own_start) AS ts, least(w.end_ts, st.own_end) AS end_ts
    FROM stages st JOIN work w ON w.run_id = st.run_id AND w.rank = st.rank
     AND w.end_ts > st.own_start AND w.ts < st.own_end
), busy AS (  -- union of the work: islands of overlapping intervals
    SELECT run_id, pipeline, step, rank, any_value(timing) AS timing, min(ts) AS ts, max(end_ts) AS end_ts
    FROM (SELECT *, sum(CASE WHEN prev_end IS NULL OR ts > prev_end THEN 1 ELSE 0 END)
                        OVER (PARTITION BY run_id, pipeline, step, rank ORDER BY ts, end_ts) AS island
          FROM (SELECT *, max(end_ts) OVER (PARTITION BY run_id, pipeline, step, rank ORDER BY ts, end_ts
                                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
                FROM clipped))
    GROUP BY run_id, pipeline, step, rank, island
), in_flight AS (  -- the rank's send and recv calls and kernels, its receives in flight (gloo:recv)
    SELECT p.run_id, p.pipeline, st.step, p.rank, p.ts, p.end_ts
    FROM p2p p JOIN stages st ON st.run_id = p.run_id AND st.pipeline = p.pipeline AND st.rank = p.rank
    UNION ALL
    SELECT st.run_id, st.pipeline, st.step, st.rank, s.ts, s.ts + s.dur
    FROM slices s JOIN stages st ON st.run_id = s.run_id AND st.rank = s.rank
    WHERE s.kind = 'user_annotation' AND collective_kind(s.name) = 'recv'
), blocked_span AS (  -- in flight, cut to between the first input and the last send or recv
    SELECT i.run_id, i.pipeline, i.step, i.rank,
        greatest(i.ts, COALESCE(st.first_input, st.w_start), st.w_start) AS ts, least(i.end_ts, st.last_p2p) AS end_ts
    FROM in_flight i JOIN stages st USING (run_id, pipeline, step, rank)
), blocked AS (  -- union of it
    SELECT run_id, pipeline, step, rank, min(ts) AS ts, max(end_ts) AS end_ts
    FROM (SELECT *, sum(CASE WHEN prev_end IS NULL OR ts > prev_end THEN 1 ELSE 0 END)
                        OVER (PARTITION BY run_id, pipeline, step, rank ORDER BY ts, end_ts) AS island
          FROM (SELECT *, max(end_ts) OVER (PARTITION BY run_id, pipeline, step, rank ORDER BY ts, end_ts
                                            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
                FROM blocked_span WHERE end_ts > ts))
    GROUP BY run_id, pipeline, step, rank, island
), blocked_busy AS (  -- of which the stage computed (both unions are disjoint: overlaps add up)
    SELECT b.run_id, b.pipeline, b.step, b.rank,
        CAST(sum(greatest(0, least(w.end_ts, b.end_ts) - greatest(w.ts, b.ts))) AS BIGINT) AS computing_ns
    FROM blocked b JOIN busy w ON w.run_id = b.run_id AND w.pipeline = b.pipeline AND w.step = b.step
     AND w.rank = b.rank AND w.end_ts > b.ts AND w.ts < b.end_ts
    GROUP BY b.run_id, b.pipeline, b.step, b.rank
), blocked_total AS (
    SELECT run_id, pipeline, step, rank, CAST(sum(end_ts - ts) AS BIGINT) AS blocked_ns FROM blocked
    GROUP BY run_id, pipeline, step, rank
), first_busy AS (
    SELECT run_id, pipeline, step, rank, min(ts) AS ts FROM busy GROUP BY run_id, pipeline, step, rank
), anchored AS (  -- when the stage's first input arrived: its first recv's end; the first stage: its first compute
    SELECT st.*, COALESCE(st.first_input, f.ts, st.w_start) AS input_at
    FROM stages st LEFT JOIN first_busy f USING (run_id, pipeline, step, rank)
), per_stage AS (
    SELECT st.run_id, st.pipeline, st.step, st.stage, st.rank, st.stages,
        COALESCE(any_value(b.timing), 'host') AS timing,
        st.w_end - st.w_start AS window_ns,
        CAST(COALESCE(sum(b.end_ts - b.ts), 0) AS BIGINT) AS compute_ns,
        CAST(st.input_at - st.w_start - COALESCE(sum(greatest(0, least(b.end_ts, st.input_at) - b.ts)), 0) AS BIGINT)
            AS warmup_ns,
        CAST(st.w_end - st.last_p2p - COALESCE(sum(greatest(0, b.end_ts - greatest(b.ts, st.last_p2p))), 0) AS BIGINT)
            AS cooldown_ns
    FROM anchored st LEFT JOIN busy b USING (run_id, pipeline, step, rank)
    GROUP BY st.run_id, st.pipeline, st.step, st.stage, st.rank, st.stages, st.w_start, st.w_end, st.input_at,
        st.last_p2p
), first_link AS (  -- sends from the first stage to the second, per step: the microbatches
    SELECT p.run_id, p.pipeline, p.step, count(*) AS sends
    FROM p2p p
    JOIN per_stage s0 ON s0.run_id = p.run_id AND s0.pipeline = p.pipeline AND s0.step = p.step
     AND s0.rank = p.rank AND s0.stage = 0
    JOIN per_stage s1 ON s1.run_id = p.run_id AND s1.pipeline = p.pipeline AND s1.step = p.step
     AND s1.rank = p.peer AND s1.stage = 1
    WHERE p.collective = 'send'
    GROUP BY p.run_id, p.pipeline, p.step
), actions AS (  -- the schedule's own ranges: GPipe's "Forward <mb>", the runtime schedules' "PP:<stage>F<mb>"
    SELECT st.run_id, st.pipeline, st.step, st.rank,
        regexp_extract(s.name, '^PP:(\d+)F\d+$', 1) AS chunk,
        COALESCE(NULLIF(regexp_extract(s.name, '^Forward (\d+)$', 1), ''),
                 regexp_extract(s.name, '^PP:\d+F(\d+)$', 1)) AS microbatch
    FROM stages st JOIN slices s ON s.run_id = st.run_id AND s.rank = st.rank AND s.step = st.step
    WHERE s.kind = 'user_annotation' AND regexp_matches(s.name, '^(Forward \d+|PP:\d+F\d+)$')
), traced AS (  -- per step: the most microbatches and chunks any stage ran
    SELECT run_id, pipeline, step, max(microbatches) AS traced_microbatches, max(chunks) AS traced_chunks
    FROM (SELECT run_id, pipeline, step, rank, count(DISTINCT microbatch) AS microbatches,
                 greatest(count(DISTINCT NULLIF(chunk, '')), 1) AS chunks
          FROM actions GROUP BY run_id, pipeline, step, rank)
    GROUP BY run_id, pipeline, step
), shape AS (
    SELECT s.*, COALESCE(bt.blocked_ns, 0) - COALESCE(bb.computing_ns, 0) AS p2p_blocked_ns,
        CAST(COALESCE(COALESCE(getvariable('chunks'), NULL), t.traced_chunks, 1) AS BIGINT) AS chunks,
        CASE WHEN COALESCE(getvariable('microbatches'), NULL) IS NOT NULL THEN 'parameter'
             WHEN t.traced_microbatches IS NOT NULL THEN 'trace' ELSE 'sends' END AS microbatches_from,
        CAST(COALESCE(COALESCE(getvariable('microbatches'), NULL), t.traced_microbatches,
                      round(f.sends / (chunks + CASE WHEN s.stages = 2 THEN chunks - 1 ELSE 0 END))) AS BIGINT)
            AS microbatches,
        max(s.compute_ns) OVER (PARTITION BY s.run_id, s.pipeline, s.step) AS limit_compute_ns
    FROM per_stage s
    LEFT JOIN blocked_total bt USING (run_id, pipeline, step, rank)
    LEFT JOIN blocked_busy bb USING (run_id, pipeline, step, rank)
    LEFT JOIN first_link f USING (run_id, pipeline, step)
    LEFT JOIN traced t USING (run_id, pipeline, step)
)
SELECT run_id, pipeline, step, stage, rank, timing, stages, microbatches, microbatches_from, chunks, window_ns, compute_ns,
    window_ns - compute_ns AS idle_ns, warmup_ns, p2p_blocked_ns, cooldown_ns,
    idle_ns - warmup_ns - p2p_blocked_ns - cooldown_ns AS other_idle_ns,
    100.0 * idle_ns / NULLIF(window_ns, 0) AS bubble_pct,
    100 * pipeline_bubble_fraction(stages, microbatches, chunks) AS ideal_bubble_pct,
    100 * pipeline_bubble_fraction(stages, 3 * microbatches) AS zero_bubble_pct,
    CAST(round(limit_compute_ns * (stages - 1.0) / (chunks * microbatches)) AS BIGINT) AS schedule_ns,
    limit_compute_ns - compute_ns AS imbalance_ns,
    idle_ns - schedule_ns - imbalance_ns AS overhead_ns,
    compute_ns = limit_compute_ns AS limiting
FROM shape
ORDER BY run_id, pipeline, step, stage;
