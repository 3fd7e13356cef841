-- collectives: Each collective instance matched across ranks: size, duration, algbw/busbw, start skew, last rank.
--
-- A rank's call starts and lasts as its communication kernels do (first kernel start, to the last kernel's end)
-- when it has kernels, else as its host call (timing = 'host': CPU backends such as gloo, where the host call only
-- enqueues the work, so host durations show dispatch, not the transfer). Calls are matched across ranks by
-- (pg_name, kind, seq) (collective_match_key: a send meets the recv of its peer, any other call only its own kind,
-- so a trace without process groups never pairs, say, a send with an all_reduce): one instance. Point-to-point
-- calls whose peer the trace records are paired by peer instead: the n-th send from rank a to rank b in a group
-- meets the n-th recv on b from a (p2p_match_key), one row per pair: collective 'send', src_rank → dst_rank,
-- ranks_seen 2; without a peer, they are matched as before. Its duration_ns is the minimum over ranks, since the other ranks' durations include
-- waiting for the last to arrive; algbw = size_bytes / duration_ns (bytes/ns = GB/s), busbw = algbw ×
-- busbw_factor(collective, group_size) (nccl-tests). start_skew_ns = each rank's start − the earliest start (aligned
-- with `ranks`); last_rank arrived last (ties: the higher rank). Across hosts, skews include clock offsets
-- unless align_clocks = true: then every rank's times are first moved onto the lowest rank's clock by its
-- clock_offsets offset (where that exceeds its uncertainty; ranks the offsets do not reach keep their clock).
-- size_bytes is the largest any rank recorded (they differ only for uneven all_to_all); NULL when the trace records
-- no size. Calls without group metadata (c10d ops of gloo or older PyTorch) have pg_name NULL and are taken to be on
-- the default group: group_size = world size. consistent = false when the matched calls differ in dtype or a rank
-- recorded two of them: the ranks' sequences are misaligned (e.g. traces cut at different points), so the match
-- and its skews are wrong. `wait` records (a rank blocking on a work handle) are not collectives and are left out.
-- Against the paper calculation: predicted_ns = collective_time_ns(size_bytes, collective, group_size, link), the
-- time the bus-bandwidth model gives at the link bandwidth (bytes/s per direction per rank: device_peaks'
-- link_bytes_per_s of the ranks' device, the slowest of them, or the link_bytes_per_s parameter); link_pct =
-- busbw / link · 100 = predicted / measured · 100. device_peaks' link is the device's own fabric (NVLink, Infinity
-- Fabric, ICI): for a group that spans hosts, give -p link_bytes_per_s= (the network's, per rank).
--
-- Needs: collective calls (a distributed trace); more than one rank for skews
-- Parameters:
--   device = NULL              device key: device_peaks key whose link bandwidth to use (e.g. 'H100-SXM'); NULL = matched from devices.name
--   link_bytes_per_s = NULL    number > 0: link bandwidth per rank and direction, bytes/s, instead of device_peaks'
--   align_clocks = false       one of true, false: move each rank's times onto the reference rank's clock (clock_offsets)
-- Columns:
--   run_id           VARCHAR    run
--   pg_name          VARCHAR    process group (NULL: not recorded)
--   seq              BIGINT     sequence number of the call within the group (of a pair: of the transfer from src_rank to dst_rank)
--   collective       VARCHAR    all_reduce, all_gather, ... (the smallest name if the ranks disagree); 'send' for a send/recv pair
--   src_rank         INTEGER    a send/recv pair's sending rank (NULL: a collective, or a peer not recorded)
--   dst_rank         INTEGER    a send/recv pair's receiving rank
--   step             INTEGER    earliest step any rank recorded the call in
--   timing           VARCHAR    'device' (kernels) or 'host' (host call only); the smallest if ranks differ
--   group_size       INTEGER    ranks in the group
--   ranks_seen       BIGINT     ranks in this run that recorded the call
--   consistent       BOOLEAN    one call per rank, all of the same dtype
--   size_bytes       BIGINT     message size (nccl-tests convention)
--   start_ns         BIGINT     earliest start over ranks (align_clocks: on the reference rank's clock)
--   duration_ns      BIGINT     minimum duration over ranks
--   max_duration_ns  BIGINT     maximum duration over ranks (includes waiting)
--   algbw_gbps       DOUBLE     size_bytes / duration_ns, GB/s
--   busbw_gbps       DOUBLE     algbw_gbps × busbw_factor(collective, group_size)
--   last_rank        INTEGER    rank that started last
--   max_skew_ns      BIGINT     latest start − earliest start
--   ranks            INTEGER[]  ranks that recorded the call, ascending
--   start_skew_ns    BIGINT[]   each of those ranks' start − earliest start
--   link_bytes_per_s DOUBLE     link bandwidth per rank and direction used for the prediction (NULL: unknown)
--   predicted_ns     DOUBLE     collective_time_ns: size · busbw factor / link bandwidth
--   link_pct         DOUBLE     busbw / link bandwidth · 100 (100 = at the link's peak)
--   warning          VARCHAR    when busbw exceeds the link bandwidth, that it exceeds the device's peak (peak_exceeded); NULL otherwise
WITH links AS (
    SELECT DISTINCT run_id, rank, link_bytes_per_s
    FROM rank_device_peaks(device_key := COALESCE(getvariable('device'), NULL))
), calls AS (
    SELECT c.run_id, c.rank, c.collective_id, c.pg_name, c.seq, c.collective, c.dtype, c.size_bytes, c.step,
        c.src_rank, c.dst_rank, c.pair_seq, c.match_key,
        COALESCE(c.group_size, r.world_size) AS group_size,
        CASE WHEN c.device_ts IS NOT NULL THEN 'device' ELSE 'host' END AS timing,
        COALESCE(c.device_ts, c.cpu_ts) AS start_ns,
        CASE WHEN c.device_ts IS NOT NULL THEN c.device_dur ELSE c.cpu_dur END AS duration_ns,
        CAST(coalesce(COALESCE(getvariable('link_bytes_per_s'), NULL), l.link_bytes_per_s) AS DOUBLE) AS link_bytes_per_s
    FROM collective_calls(aligned := CAST(COALESCE(getvariable('align_clocks'), false) AS BOOLEAN)) c
    LEFT JOIN ranks r ON r.run_id = c.run_id AND r.rank = c.rank
    LEFT JOIN links l ON l.run_id = c.run_id AND l.rank = c.rank
), skewed AS (
    SELECT *,
        start_ns - min(start_ns) OVER (PARTITION BY run_id, match_key) AS skew_ns,
        row_number() OVER (PARTITION BY run_id, match_key ORDER BY start_ns DESC, rank DESC,
                                                          collective_id DESC) AS arrival_from_last
    FROM calls
), instances AS (
    SELECT run_id, any_value(pg_name) AS pg_name, COALESCE(any_value(pair_seq), any_value(seq)) AS seq,
        CASE WHEN any_value(src_rank) IS NOT NULL THEN 'send' ELSE min(collective) END AS collective,
        any_value(src_rank) AS src_rank, any_value(dst_rank) AS dst_rank, min(step) AS step, min(timing) AS timing,
        max(group_size) AS group_size, count(*) AS ranks_seen,
        count(DISTINCT rank) = count(*) AND count(DISTINCT dtype) <= 1 AS consistent,
        max(size_bytes) AS size_bytes, min(start_ns) AS start_ns, min(duration_ns) AS duration_ns,
        max(duration_ns) AS max_duration_ns,
        any_value(rank) FILTER (WHERE arrival_from_last = 1) AS last_rank, max(skew_ns) AS max_skew_ns,
        list(rank ORDER BY rank, collective_id) AS ranks,
        list(skew_ns ORDER BY rank, collective_id) AS start_skew_ns,
        min(link_bytes_per_s) AS link_bytes_per_s
    FROM skewed
    GROUP BY run_id, match_key
)
SELECT run_id, pg_name, seq, collective, src_rank, dst_rank, step, timing, group_size, ranks_seen, consistent, size_bytes, start_ns,
    duration_ns, max_duration_ns,
    size_bytes / NULLIF(duration_ns, 0) AS algbw_gbps,
    algbw_gbps * busbw_factor(collective, group_size) AS busbw_gbps,
    last_rank, max_skew_ns, ranks, start_skew_ns, link_bytes_per_s,
    collective_time_ns(size_bytes, collective, group_size, link_bytes_per_s) AS predicted_ns,
    100 * busbw_gbps * 1e9 / link_bytes_per_s AS link_pct,
    peak_exceeded(busbw_gbps * 1e9, link_bytes_per_s, 'bytes/s',
                  'bus bandwidth over the link: the collective''s time is too short for its size, its group does '
                  || 'not cross the link, or the link is not this device''s') AS warning
FROM instances
ORDER BY run_id, start_ns, pg_name, seq, collective;
