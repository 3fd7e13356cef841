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
-- each of the two ranks in time order (pair_seq), so that a send meets its peer's recv and nothing else.
CREATE OR REPLACE MACRO collective_calls() AS TABLE
SELECT *, CASE WHEN src_rank IS NULL THEN collective_match_key(pg_name, collective, seq)
               ELSE p2p_match_key(pg_name, src_rank, dst_rank, pair_seq) END AS match_key
FROM (
    SELECT *, CASE WHEN src_rank IS NOT NULL
                   THEN row_number() OVER (PARTITION BY run_id, rank, pg_name, src_rank, dst_rank
                                           ORDER BY COALESCE(cpu_ts, device_ts), collective_id) - 1 END AS pair_seq
    FROM (SELECT *, p2p_src_rank(collective, rank, peer) AS src_rank, p2p_dst_rank(collective, rank, peer) AS dst_rank
          FROM collectives WHERE collective <> 'wait')
);
