-- parallelism: Each process group's parallel dimension (TP, PP, DP, EP, CP), intra- or inter-node, and per step the communication of each dimension.
--
-- A group's dimension comes from the user's layout when given (-p parallelism=tp=8,pp=4,dp=2: sizes, the
-- first varying fastest over the global ranks, as Megatron-LM orders tp-cp-ep-dp-pp): the group is dimension
-- X when its ranks differ only in X's coordinate. Else from its name (process_groups.pg_desc, else pg_name:
-- torchtitan's and DeviceMesh's mesh_tp / mesh_dp_shard, Megatron-LM's TENSOR_MODEL_PARALLEL_GROUP, DeepSpeed's
-- and vLLM's tp/pp/dp/ep groups): tensor or tp → TP, pipeline or pp → PP, expert or ep → EP, context or cp →
-- CP, shard → DP shard (FSDP), replicate → DP replicate, data or dp → DP; a group of the whole world is 'world';
-- otherwise 'unknown'. intra_node: all the group's ranks on one host (ranks.host_name; NULL when not recorded).
-- Per step and dimension: the collective calls of its groups (every rank's; calls that record no group count
-- for the rank's only group, else 'unknown'), their bytes, the time they took (device time with kernels, else
-- the host call, summed over ranks), bus bandwidth (Σ size · busbw_factor / Σ time) and the share of the ranks'
-- step time. exposed_ns: the part of that time no compute hides: for a call with kernels, its span (first kernel
-- start to last kernel end) less the time its device's compute kernels run then (their union, as
-- device_timeline and `overlap` count it: per group and summed over steps, overlap per=process_group's comm_ns −
-- overlap_ns when a call's kernels do not overlap each other); a host call (CPU backends) counts whole: its
-- thread does nothing else.
--
-- Needs: process groups (distributedInfo) and collectives
-- Parameters:
--   parallelism = NULL         text: the job's layout as dim=size,... fastest-varying first (e.g. tp=8,pp=4,dp=2); NULL = from group names
--   per = 'step'               one of step, group: per step and dimension, or each process group with its dimension (no calls, step NULL)
-- Columns:
--   run_id        VARCHAR    run
--   step          INTEGER    step (NULL: calls outside any step)
--   dimension     VARCHAR    TP, PP, DP, DP shard, DP replicate, EP, CP, world or unknown
--   labelled_by   VARCHAR    'layout' (the parallelism parameter), 'name' (pg_desc / pg_name), 'world' or NULL
--   groups        VARCHAR[]  its process groups (pg_name) with calls in the step
--   group_size    INTEGER    ranks per group (the largest)
--   intra_node    BOOLEAN    every group on one host
--   calls         BIGINT     calls, over ranks
--   bytes         BIGINT     their message bytes (nccl-tests convention), over ranks
--   comm_ns       BIGINT     their time, summed over ranks
--   exposed_ns    BIGINT     of which no compute ran on the rank's device (host calls: all of it)
--   busbw_gbps    DOUBLE     Σ size · busbw factor / Σ time (GB/s)
--   step_share    DOUBLE     comm_ns / the ranks' summed step time
--   exposed_step_share DOUBLE exposed_ns / the ranks' summed step time
WITH layout AS (
    SELECT list_transform(string_split(COALESCE(getvariable('parallelism'), NULL), ','),
                          lambda x: {'name': upper(trim(split_part(x, '=', 1))),
                                     'size': CAST(trim(split_part(x, '=', 2)) AS INTEGER)}) AS dims
    WHERE COALESCE(getvariable('parallelism'), NULL) IS NOT NULL
), strided AS (  -- each dimension: its size and stride (the product of the sizes before it)
    SELECT k, dims[k].name AS name, dims[k].size AS size,
        CAST(COALESCE(list_product(list_transform(dims[1:k - 1], lambda d: d.size)), 1) AS BIGINT) AS stride
    FROM layout, range(1, len(dims) + 1) t(k)
), coords AS (
    SELECT list({'k': k, 'size': size, 'stride': stride}) AS dims FROM strided
), groups AS (
    SELECT run_id, pg_name, any_value(pg_desc) AS pg_desc, max(group_size) AS group_size,
        any_value(group_ranks) AS group_ranks
    FROM process_groups GROUP BY run_id, pg_name
), by_layout AS (  -- the dimension whose coordinate alone differs across the group's ranks
    SELECT g.run_id, g.pg_name, min(s.name) AS dimension
    FROM groups g CROSS JOIN strided s CROSS JOIN coords c
    WHERE len(g.group_ranks) = s.size AND s.size > 1
      AND len(list_distinct(list_transform(g.group_ranks, lambda r:
              list_transform(list_filter(c.dims, lambda d: d.k <> s.k), lambda d: (r // d.stride) % d.size)))) = 1
    GROUP BY g.run_id, g.pg_name
), hosts AS (
    SELECT g.run_id, g.pg_name, count(DISTINCT r.host_name) AS hosts, count(r.host_name) AS known
    FROM groups g JOIN ranks r ON r.run_id = g.run_id AND list_contains(g.group_ranks, r.rank)
    GROUP BY g.run_id, g.pg_name
), labelled AS (
    SELECT g.run_id, g.pg_name, g.group_size,
        CASE WHEN l.dimension IS NOT NULL THEN 'layout'
             WHEN name_dim IS NOT NULL THEN 'name'
             WHEN g.group_size = w.world_size THEN 'world' END AS labelled_by,
        COALESCE(l.dimension, name_dim, CASE WHEN g.group_size = w.world_size THEN 'world' END, 'unknown')
            AS dimension,
        CASE WHEN h.known = len(g.group_ranks) AND h.known > 0 THEN h.hosts = 1 END AS intra_node
    FROM (SELECT *, lower(COALESCE(NULLIF(pg_desc, 'undefined'), pg_name, '')) AS label,
                 CASE WHEN label = 'default_pg' THEN NULL
                      WHEN regexp_matches(label, 'shard') THEN 'DP shard'
                      WHEN regexp_matches(label, 'replicate') THEN 'DP replicate'
                      WHEN regexp_matches(label, 'tensor|(^|[^a-z])tp($|[^a-z])') THEN 'TP'
                      WHEN regexp_matches(label, 'pipeline|(^|[^a-z])pp($|[^a-z])') THEN 'PP'
                      WHEN regexp_matches(label, 'expert|(^|[^a-z])ep($|[^a-z])') THEN 'EP'
                      WHEN regexp_matches(label, 'context|(^|[^a-z])cp($|[^a-z])') THEN 'CP'
                      WHEN regexp_matches(label, 'data|(^|[^a-z])dp($|[^a-z])') THEN 'DP'
                 END AS name_dim
          FROM groups) g
    LEFT JOIN by_layout l ON l.run_id = g.run_id AND l.pg_name = g.pg_name
    LEFT JOIN hosts h ON h.run_id = g.run_id AND h.pg_name = g.pg_name
    LEFT JOIN (SELECT run_id, max(world_size) AS world_size FROM ranks GROUP BY run_id) w ON w.run_id = g.run_id
), compute_before AS (
    -- each device call's start and end with its device's compute time before then (the union of its compute
    -- kernels, as device_timeline counts it), over one stream of the device's compute kernels and the calls'
    -- edges sorted by time (edges first at equal times): the union of the kernels started before an edge, less
    -- its part past the edge (the kernels still running cover it from the edge to the latest end, `reach`). The
    -- union up to a kernel is a running sum of what each adds past the latest end before it. Sorts the compute
    -- kernels and the edges, not every edge of every device event (the timeline)
    SELECT run_id, rank, collective_id, edge,
        COALESCE(union_ns, 0) - greatest(COALESCE(reach, t) - t, 0) AS compute_ns
    FROM (
        SELECT *, sum(greatest(te - greatest(t, COALESCE(reach, t)), 0)) OVER (
                PARTITION BY run_id, rank, device_id ORDER BY t, ord ROWS UNBOUNDED PRECEDING) AS union_ns
        FROM (
            SELECT *, max(te) OVER (PARTITION BY run_id, rank, device_id ORDER BY t, ord
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
            FROM (SELECT run_id, rank, device_id, ts AS t, ts + dur AS te, 1 AS ord,
                      CAST(NULL AS BIGINT) AS collective_id, CAST(NULL AS VARCHAR) AS edge
                  FROM device_activity() WHERE class = 'compute'
                  UNION ALL
                  SELECT run_id, rank, device_id, device_ts, NULL, 0, collective_id, 'start' FROM collectives
                  WHERE device_ts IS NOT NULL
                  UNION ALL
                  SELECT run_id, rank, device_id, device_ts + device_dur, NULL, 0, collective_id, 'end'
                  FROM collectives WHERE device_ts IS NOT NULL)))
    WHERE ord = 0
), calls AS (
    SELECT c.run_id, c.step, c.pg_name, COALESCE(l.dimension, 'unknown') AS dimension, l.labelled_by,
        l.group_size, l.intra_node, c.size_bytes,
        CASE WHEN c.device_ts IS NOT NULL THEN c.device_dur ELSE c.cpu_dur END AS duration_ns,
        -- compute time up to the call's end minus up to its start: the part of the call compute hides
        duration_ns - CASE WHEN c.device_ts IS NOT NULL THEN e.compute_ns - s.compute_ns ELSE 0 END AS exposed_ns,
        c.size_bytes * busbw_factor(c.collective, COALESCE(c.group_size, l.group_size)) AS bus_bytes
    FROM collectives c LEFT JOIN labelled l ON l.run_id = c.run_id AND l.pg_name = c.pg_name
    LEFT JOIN compute_before s ON s.run_id = c.run_id AND s.rank = c.rank AND s.collective_id = c.collective_id
     AND s.edge = 'start'
    LEFT JOIN compute_before e ON e.run_id = c.run_id AND e.rank = c.rank AND e.collective_id = c.collective_id
     AND e.edge = 'end'
    WHERE c.collective <> 'wait'
), step_time AS (
    SELECT run_id, step, sum(dur) AS step_ns FROM steps GROUP BY run_id, step
)
SELECT c.run_id, c.step, c.dimension, any_value(c.labelled_by) AS labelled_by,
    list_sort(list_filter(list_distinct(list(c.pg_name)), lambda g: g IS NOT NULL)) AS groups, max(c.group_size) AS group_size,
    bool_and(c.intra_node) AS intra_node, count(c.duration_ns) AS calls, CAST(sum(c.size_bytes) AS BIGINT) AS bytes,
    CAST(sum(c.duration_ns) AS BIGINT) AS comm_ns, CAST(sum(c.exposed_ns) AS BIGINT) AS exposed_ns,
    sum(c.bus_bytes) / NULLIF(sum(c.duration_ns) FILTER (WHERE c.bus_bytes IS NOT NULL), 0) AS busbw_gbps,
    comm_ns / any_value(s.step_ns) AS step_share, sum(c.exposed_ns) / any_value(s.step_ns) AS exposed_step_share
FROM (SELECT * FROM calls WHERE COALESCE(getvariable('per'), 'step') = 'step'
      UNION ALL BY NAME  -- per group: each process group, with no calls
      SELECT run_id, pg_name, dimension, labelled_by, group_size, intra_node FROM labelled
      WHERE COALESCE(getvariable('per'), 'step') = 'group') c
LEFT JOIN step_time s ON s.run_id = c.run_id AND s.step IS NOT DISTINCT FROM c.step
GROUP BY c.run_id, c.step, c.dimension, CASE WHEN COALESCE(getvariable('per'), 'step') = 'group' THEN c.pg_name END
ORDER BY c.run_id, c.step NULLS LAST, c.dimension, groups;
