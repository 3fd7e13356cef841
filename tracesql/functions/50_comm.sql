-- Communication: bus-bandwidth factors of the collectives, and how calls are matched across ranks.
-- The scalar macros are also loaded during ingest, before the `collectives` table exists; collective_calls (a
-- table macro binds its tables when created) is created only where its name is used: in query sessions.

-- nccl-tests' bus-bandwidth factor: busbw = algbw × factor, the bandwidth each rank's link must sustain, which
-- compares with the hardware's peak independently of the group size n. all_reduce 2(n−1)/n; all_gather,
-- reduce_scatter, all_to_all (n−1)/n; broadcast, reduce, send, recv, send_recv 1 (whatever n, even unknown).
-- NULL for collectives without a defined factor (barrier, gather, scatter, ...) and when n is unknown or < 1.
CREATE OR REPLACE MACRO busbw_factor(collective, group_size) AS (
    CASE
        WHEN collective IN ('broadcast', 'reduce', 'send', 'recv', 'send_recv') THEN 1.0
        WHEN group_size IS NULL OR group_size < 1 THEN NULL
        WHEN collective = 'all_reduce' THEN 2.0 * (group_size - 1) / group_size
        WHEN collective IN ('all_gather', 'reduce_scatter', 'all_to_all') THEN 1.0 * (group_size - 1) / group_size
        ELSE NULL
    END
);

-- The time of a collective as engineers work it out on paper, from its size, kind, group size and the link
-- bandwidth (bytes/s per direction per rank, e.g. NVLink 4: 450e9): each rank's link must carry
-- size · busbw_factor(kind, n) bytes (nccl-tests' bus bandwidth model, ring algorithms), so the time is
-- size · factor / link, in ns. size is the message as metrics.md defines it: the input (all-reduce, reduce-scatter,
-- all-to-all, broadcast, reduce, send/recv), the gathered output for all-gather. Latency is left out: a lower
-- bound, which large messages approach. NULL for kinds without a factor or an unknown group size.
CREATE OR REPLACE MACRO collective_time_ns(size_bytes, kind, group_size, link_bytes_per_s) AS (
    size_bytes * busbw_factor(kind, group_size) / link_bytes_per_s * 1e9
);

-- The ideal bubble fraction of a pipeline schedule: the share of the schedule's time each of p stages is idle,
-- with m microbatches per step and v model chunks per stage (interleaved 1F1B, Megatron-LM; v = 1 for GPipe and
-- 1F1B): (p − 1) / (v · m + p − 1). The Megatron-LM paper states the bubble relative to the ideal compute time,
-- (p − 1) / (v · m); this is the same bubble as a fraction of the whole (ratio / (1 + ratio)). NULL unless
-- p, m, v >= 1.
CREATE OR REPLACE MACRO pipeline_bubble_fraction(p, m, v := 1) AS (
    CASE WHEN p >= 1 AND m >= 1 AND v >= 1 THEN (p - 1.0) / (v * m + p - 1.0) END
);

-- A host op that is a communication call (PyTorch's c10d:: ops and their record_param_comms), not compute.
CREATE OR REPLACE MACRO is_communication_call(name) AS (starts_with(name, 'c10d::') OR name = 'record_param_comms');

-- The pipeline query's rows (queries/pipeline.sql documents the method and the columns): each pipeline-parallel
-- stage's compute and idle time per step against the schedule's ideal; given_microbatches and given_chunks are
-- its microbatches and chunks parameters (NULL: from the trace). A table macro so that the pipeline_bubbles
-- rule (findings/) reads the same rows.
CREATE OR REPLACE MACRO pipeline_stages(given_microbatches := NULL, given_chunks := NULL) AS TABLE
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
    WHERE s.kind = 'cpu_op' AND s.dur > 0 AND NOT is_communication_call(s.name)
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
        CAST(COALESCE(given_chunks, t.traced_chunks, 1) AS BIGINT) AS chunks,
        CASE WHEN given_microbatches IS NOT NULL THEN 'parameter'
             WHEN t.traced_microbatches IS NOT NULL THEN 'trace' ELSE 'sends' END AS microbatches_from,
        CAST(COALESCE(given_microbatches, t.traced_microbatches,
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
FROM shape;

-- Each communication call of `collectives` (`wait` records left out: they move no data) with the key that
-- matches it across ranks into one instance: collective_match_key (group, class, seq); for a send or recv whose
-- peer is known, p2p_match_key instead: the n-th transfer from src_rank to dst_rank in the group, n counted by
-- each of the two ranks in time order (pair_seq), so that a send meets its peer's recv and nothing else. Times as
-- each rank's clock recorded them (collective_calls(aligned := true): on the reference rank's clock).
CREATE OR REPLACE MACRO recorded_collective_calls() AS TABLE
WITH calls AS (
    SELECT *, p2p_src_rank(collective, rank, peer) AS src_rank, p2p_dst_rank(collective, rank, peer) AS dst_rank
    FROM collectives WHERE collective <> 'wait'
)
SELECT *, CASE WHEN src_rank IS NULL THEN collective_match_key(pg_name, collective, seq)
               ELSE p2p_match_key(pg_name, src_rank, dst_rank, pair_seq) END AS match_key
FROM (
    -- (numbered among the sends and recvs alone: a window over every call sorted all of them, a fifth of one
    -- step's critical-path inputs at 24x)
    SELECT *, row_number() OVER (PARTITION BY run_id, rank, pg_name, src_rank, dst_rank
                                 ORDER BY COALESCE(cpu_ts, device_ts), collective_id) - 1 AS pair_seq
    FROM calls WHERE src_rank IS NOT NULL
    UNION ALL
    SELECT *, NULL FROM calls WHERE src_rank IS NULL
);

-- Each rank's clock offset from the lowest linked rank's (the `clock_offsets` query says how): offset_ns = the
-- rank's clock − the reference's, uncertainty_ns, evidence (send/recv pairs used), via_rank; shift_ns = the offset
-- where it exceeds its uncertainty, else 0: what aligning subtracts from the rank's times. Ranks linked by no
-- send/recv pairs in both directions have no row (their clocks stay as recorded).
CREATE OR REPLACE MACRO rank_clock_offsets() AS TABLE
WITH RECURSIVE calls AS (
    SELECT * FROM recorded_collective_calls() WHERE src_rank IS NOT NULL
), transfer_ends AS (  -- host recv calls: the end of the transfer annotation that starts inside the call
    SELECT c.run_id, c.rank, c.collective_id, max(s.ts + s.dur) AS done
    FROM calls c JOIN slices s ON s.run_id = c.run_id AND s.rank = c.rank AND s.kind = 'user_annotation'
     AND collective_kind(s.name) = 'recv' AND s.ts >= c.cpu_ts AND s.ts <= c.cpu_ts + c.cpu_dur
    WHERE c.collective = 'recv' AND c.device_ts IS NULL
    GROUP BY c.run_id, c.rank, c.collective_id
), pairs AS (
    SELECT s.run_id, s.rank AS src, r.rank AS dst,
        COALESCE(r.device_ts + r.device_dur, e.done, r.cpu_ts + r.cpu_dur) - COALESCE(s.device_ts, s.cpu_ts)
            AS bound_ns  -- dst clock − src clock <= bound_ns
    FROM calls s JOIN calls r ON r.run_id = s.run_id AND r.match_key = s.match_key AND r.collective = 'recv'
    LEFT JOIN transfer_ends e ON e.run_id = r.run_id AND e.rank = r.rank AND e.collective_id = r.collective_id
    WHERE s.collective = 'send'
), links AS (  -- per rank pair (lo < hi): bounds on hi's clock − lo's clock
    SELECT run_id, least(src, dst) AS lo, greatest(src, dst) AS hi,
        min(bound_ns) FILTER (WHERE dst > src) AS upper_ns, -min(bound_ns) FILTER (WHERE dst < src) AS lower_ns,
        count(*) AS evidence
    FROM pairs GROUP BY run_id, lo, hi
    HAVING upper_ns IS NOT NULL AND lower_ns IS NOT NULL
), parents AS (  -- each rank's lowest linked rank below it
    SELECT run_id, hi AS rank, arg_min(lo, lo) AS via_rank, arg_min((upper_ns + lower_ns) / 2, lo) AS diff_ns,
        arg_min((upper_ns - lower_ns) / 2, lo) AS half_ns, arg_min(evidence, lo) AS evidence
    FROM links GROUP BY run_id, hi
), chained AS (
    SELECT run_id, rank, CAST(NULL AS INTEGER) AS via_rank, 0::DOUBLE AS offset_ns, 0::DOUBLE AS uncertainty_ns,
        0::BIGINT AS evidence
    FROM (SELECT run_id, min(lo) AS rank FROM links GROUP BY run_id)
    UNION ALL
    SELECT p.run_id, p.rank, p.via_rank, c.offset_ns + p.diff_ns, c.uncertainty_ns + p.half_ns,
        c.evidence + p.evidence
    FROM chained c JOIN parents p ON p.run_id = c.run_id AND p.via_rank = c.rank
)
SELECT run_id, rank, via_rank, offset_ns, uncertainty_ns, evidence,
    CASE WHEN abs(offset_ns) > uncertainty_ns THEN CAST(round(offset_ns) AS BIGINT) ELSE 0 END AS shift_ns
FROM chained;

-- recorded_collective_calls, with aligned := true each rank's times (cpu_ts, device_ts) moved onto the reference
-- rank's clock: minus rank_clock_offsets' shift_ns.
CREATE OR REPLACE MACRO collective_calls(aligned := false) AS TABLE
SELECT c.* REPLACE (c.cpu_ts - COALESCE(o.shift_ns, 0) AS cpu_ts, c.device_ts - COALESCE(o.shift_ns, 0) AS device_ts)
FROM recorded_collective_calls() c
LEFT JOIN (SELECT run_id, rank, shift_ns FROM rank_clock_offsets() WHERE aligned) o
  ON o.run_id = c.run_id AND o.rank = c.rank;
