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

-- Each communication call of `collectives` (`wait` records left out: they move no data) with the key that
-- matches it across ranks into one instance: collective_match_key (group, class, seq); for a send or recv whose
-- peer is known, p2p_match_key instead: the n-th transfer from src_rank to dst_rank in the group, n counted by
-- each of the two ranks in time order (pair_seq), so that a send meets its peer's recv and nothing else. Times as
-- each rank's clock recorded them (collective_calls(aligned := true): on the reference rank's clock).
CREATE OR REPLACE MACRO recorded_collective_calls() AS TABLE
SELECT *, CASE WHEN src_rank IS NULL THEN collective_match_key(pg_name, collective, seq)
               ELSE p2p_match_key(pg_name, src_rank, dst_rank, pair_seq) END AS match_key
FROM (
    SELECT *, CASE WHEN src_rank IS NOT NULL
                   THEN row_number() OVER (PARTITION BY run_id, rank, pg_name, src_rank, dst_rank
                                           ORDER BY COALESCE(cpu_ts, device_ts), collective_id) - 1 END AS pair_seq
    FROM (SELECT *, p2p_src_rank(collective, rank, peer) AS src_rank, p2p_dst_rank(collective, rank, peer) AS dst_rank
          FROM collectives WHERE collective <> 'wait')
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
