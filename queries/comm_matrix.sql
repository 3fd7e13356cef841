-- comm_matrix: Bytes and time between each pair of ranks: send/recv pairs, and collectives whose algorithm fixes who sends to whom; the slowest link.
--
-- Instances are matched and timed as in `collectives` (recorded by at least two ranks). Point-to-point: each
-- send/recv pair (src_rank → dst_rank) moves its size_bytes in its duration_ns. Collectives, on the ring algorithms nccl-tests' bus bandwidth assumes: in an all_reduce each rank
-- sends 2(n − 1)/n · size to the next rank of its group (group_ranks order, the last to the first),
-- in an all_gather or reduce_scatter (n − 1)/n · size; in an all_to_all each rank sends size / n to every other
-- rank; each over the instance's duration_ns. Other kinds (broadcast, barrier, ...) and calls whose group's ranks
-- are not recorded (default group: 0 … n − 1 of the world) are left out of the matrix. gbps = bytes / time of
-- the link (time summed over its transfers; concurrent transfers on one link are counted apart); slowest = the
-- link with the lowest gbps among those that moved at least min_bytes.
--
-- Needs: send/recv pairs or collectives with sizes recorded by every rank of the group
-- Parameters:
--   min_bytes = 1              integer >= 0: links that moved fewer bytes are not candidates for the slowest
-- Columns:
--   run_id             VARCHAR  run
--   src_rank           INTEGER  sending rank
--   dst_rank           INTEGER  receiving rank
--   transfers          BIGINT   pairs and collective instances on the link
--   p2p_bytes          BIGINT   bytes sent by send/recv pairs
--   collective_bytes   BIGINT   bytes the ring algorithms send on the link
--   bytes              BIGINT   p2p_bytes + collective_bytes
--   time_ns            BIGINT   summed durations of those transfers
--   gbps               DOUBLE   bytes / time_ns (GB/s)
--   slowest            BOOLEAN  the run's link with the lowest gbps (among those with at least min_bytes)
WITH instances AS (  -- matched and timed as in `collectives` (collective_calls; duration: the shortest rank's)
    SELECT c.run_id, any_value(c.pg_name) AS pg_name, any_value(c.src_rank) AS src_rank,
        any_value(c.dst_rank) AS dst_rank, min(c.collective) AS collective,
        max(COALESCE(c.group_size, r.world_size)) AS group_size, max(c.size_bytes) AS size_bytes,
        min(CASE WHEN c.device_ts IS NOT NULL THEN c.device_dur ELSE c.cpu_dur END) AS duration_ns
    FROM collective_calls() c LEFT JOIN ranks r ON r.run_id = c.run_id AND r.rank = c.rank
    GROUP BY c.run_id, c.match_key
    HAVING count(*) >= 2
), p2p AS (
    SELECT run_id, src_rank, dst_rank, size_bytes AS p2p_bytes, 0 AS collective_bytes, duration_ns
    FROM instances WHERE src_rank IS NOT NULL
), groups AS (  -- each collective instance with its group's ranks in ring order
    SELECT i.*, COALESCE(g.group_ranks, CAST(range(0, i.group_size) AS INTEGER[])) AS ring
    FROM instances i
    LEFT JOIN (SELECT DISTINCT run_id, pg_name, group_ranks FROM collectives WHERE group_ranks IS NOT NULL) g
      ON g.run_id = i.run_id AND g.pg_name IS NOT DISTINCT FROM i.pg_name
    WHERE i.src_rank IS NULL AND i.size_bytes IS NOT NULL AND i.group_size > 1
      AND i.collective IN ('all_reduce', 'all_gather', 'reduce_scatter', 'all_to_all')
), ring_links AS (
    SELECT run_id, ring[k] AS src_rank, ring[k % len(ring) + 1] AS dst_rank, 0 AS p2p_bytes,
        CAST(round(size_bytes * busbw_factor(collective, len(ring))) AS BIGINT) AS collective_bytes, duration_ns
    FROM groups, range(1, len(ring) + 1) t(k)
    WHERE collective <> 'all_to_all'
), all_to_all_links AS (
    SELECT run_id, ring[a] AS src_rank, ring[b] AS dst_rank, 0 AS p2p_bytes,
        CAST(round(size_bytes / len(ring)) AS BIGINT) AS collective_bytes, duration_ns
    FROM groups, range(1, len(ring) + 1) s(a), range(1, len(ring) + 1) d(b)
    WHERE collective = 'all_to_all' AND a <> b
), links AS (
    SELECT run_id, src_rank, dst_rank, count(*) AS transfers, CAST(sum(p2p_bytes) AS BIGINT) AS p2p_bytes,
        CAST(sum(collective_bytes) AS BIGINT) AS collective_bytes, CAST(sum(duration_ns) AS BIGINT) AS time_ns
    FROM (SELECT * FROM p2p UNION ALL SELECT * FROM ring_links UNION ALL SELECT * FROM all_to_all_links)
    GROUP BY run_id, src_rank, dst_rank
), rated AS (
    SELECT *, p2p_bytes + collective_bytes AS bytes, bytes / NULLIF(time_ns, 0) AS gbps FROM links
)
SELECT run_id, src_rank, dst_rank, transfers, p2p_bytes, collective_bytes, bytes, time_ns, gbps,
    COALESCE(row_number() OVER (PARTITION BY run_id, bytes >= COALESCE(getvariable('min_bytes'), 1)
                                     AND gbps IS NOT NULL ORDER BY gbps, src_rank, dst_rank) = 1
             AND bytes >= COALESCE(getvariable('min_bytes'), 1) AND gbps IS NOT NULL, false) AS slowest
FROM rated
ORDER BY run_id, src_rank, dst_rank;
