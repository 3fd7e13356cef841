-- Communication: bus-bandwidth factors of the collectives.
-- Only scalar macros here: a table macro binds its tables when created, and this file is also loaded during
-- ingest, before the `collectives` table exists.

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
