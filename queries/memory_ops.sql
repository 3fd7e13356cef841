-- memory_ops: The ops that allocated the most memory on each device, and what they held at the peak.
--
-- Every allocation (an allocator event with Bytes > 0) is charged to the op running on its thread
-- (`memory.op_id`: the innermost op, often aten::empty; else the op the event names, `memory.op_name`: torch_npu's
-- operator_memory.csv, XLA's tf_op) or, with op_level = 'top', to that op's top-level op
-- (the model-level call that caused it, e.g. aten::linear or an autograd backward node). live_at_peak_bytes is
-- what the op's allocations still held at the device's allocated peak (the first event reaching it, as in
-- `memory`): allocated at or before it and freed after it, or never within the trace. A block's free is the next
-- event on the same address; memory allocated before the profiler started is not charged to any op, so the
-- live bytes of all ops add up to at most the peak.
--
-- Needs: allocator events (profile_memory=True: PyTorch's [memory] events, torch_npu's memory_record.csv)
-- Parameters:
--   top = 10           integer >= 1: ops per device
--   op_level = 'self'  one of self, top: 'self' (the allocating op) or 'top' (its top-level op)
-- Columns:
--   run_id              VARCHAR  run
--   rank                INTEGER  rank
--   device_type         VARCHAR  'cpu', 'gpu', 'tpu', 'npu' or 'other'
--   device_id           INTEGER  device index (-1: host memory)
--   rank_in_device      BIGINT   1 = allocated the most
--   op_name             VARCHAR  op name (NULL: allocations outside any op)
--   allocations         BIGINT   allocations made
--   allocated_bytes     BIGINT   bytes allocated, summed
--   largest_bytes       BIGINT   largest single allocation
--   live_at_peak_bytes  BIGINT   bytes of its allocations live at the allocated peak (NULL: blocks without address)
WITH RECURSIVE ancestors AS (
    -- walk up from each allocating op to its top-level op (only when asked for)
    SELECT DISTINCT run_id, rank, op_id, op_id AS ancestor_id
    FROM memory WHERE op_id IS NOT NULL AND COALESCE(getvariable('op_level'), 'self') = 'top'
    UNION ALL
    SELECT a.run_id, a.rank, a.op_id, o.parent_op_id
    FROM ancestors a JOIN ops o ON o.run_id = a.run_id AND o.rank = a.rank AND o.op_id = a.ancestor_id
    WHERE o.parent_op_id IS NOT NULL
), top_ops AS (
    SELECT a.run_id, a.rank, a.op_id, o.name AS top_name
    FROM ancestors a JOIN ops o ON o.run_id = a.run_id AND o.rank = a.rank AND o.op_id = a.ancestor_id
    WHERE o.parent_op_id IS NULL
), peaks AS (
    -- each allocator's allocated peak: the first event (by ts, memory_id) with the highest Total Allocated, as in
    -- `memory` (an aggregate: a row_number window sorted every event); '' keys a NULL allocator in the joins
    SELECT p.run_id, p.rank, p.device_type, p.device_id, p.allocator_key, m.ts AS peak_ts, p.peak_id
    FROM (
        SELECT run_id, rank, device_type, device_id, COALESCE(allocator, '') AS allocator_key,
            arg_min(memory_id, (total_allocated_bytes IS NULL, -COALESCE(total_allocated_bytes, 0), ts, memory_id))
                AS peak_id
        FROM memory
        GROUP BY ALL
    ) p
    JOIN memory m ON m.run_id = p.run_id AND m.rank = p.rank AND m.memory_id = p.peak_id
), events AS (
    SELECT m.*, p.peak_ts, p.peak_id
    FROM (SELECT *, COALESCE(allocator, '') AS allocator_key FROM memory) m
    JOIN peaks p USING (run_id, rank, device_type, device_id, allocator_key)
), last_at_peak AS (
    -- a block allocated at or before the peak is live there when no later event on its address comes at or before
    -- the peak (its free is after the peak, or never): it is its address's last event up to the peak, in the
    -- order (ts, memory_id). An aggregate per address, not a lead window over every event
    SELECT run_id, rank, arg_max(memory_id, (ts, memory_id)) AS memory_id
    FROM events
    WHERE addr IS NOT NULL AND (ts < peak_ts OR (ts = peak_ts AND memory_id <= peak_id))
    GROUP BY run_id, rank, device_type, device_id, allocator_key, addr
), allocations AS (
    SELECT e.run_id, e.rank, e.device_type, e.device_id, e.op_id, e.op_name, e.bytes,
        -- a block with no address (torch_npu's memory files) cannot be followed to its free: not known
        CASE WHEN e.addr IS NOT NULL THEN l.memory_id IS NOT NULL END AS live_at_peak
    FROM events e
    LEFT JOIN last_at_peak l ON l.run_id = e.run_id AND l.rank = e.rank AND l.memory_id = e.memory_id
    WHERE e.bytes > 0
), named AS (
    -- one branch per op_level, so that the constant level leaves out the other's join (and the ancestors' walk)
    SELECT a.* EXCLUDE (op_name), COALESCE(o.name, a.op_name) AS op_name
    FROM allocations a LEFT JOIN ops o ON o.run_id = a.run_id AND o.rank = a.rank AND o.op_id = a.op_id
    WHERE COALESCE(getvariable('op_level'), 'self') = 'self'
    UNION ALL
    SELECT a.* EXCLUDE (op_name), t.top_name
    FROM allocations a LEFT JOIN top_ops t ON t.run_id = a.run_id AND t.rank = a.rank AND t.op_id = a.op_id
    WHERE COALESCE(getvariable('op_level'), 'self') = 'top'
), per_op AS (
    SELECT run_id, rank, device_type, device_id, op_name, count(*) AS allocations,
        CAST(sum(bytes) AS BIGINT) AS allocated_bytes, max(bytes) AS largest_bytes,
        CASE WHEN count(live_at_peak) > 0
             THEN CAST(COALESCE(sum(bytes) FILTER (WHERE live_at_peak), 0) AS BIGINT) END AS live_at_peak_bytes
    FROM named
    GROUP BY run_id, rank, device_type, device_id, op_name
), ranked AS (
    SELECT *, row_number() OVER (PARTITION BY run_id, rank, device_type, device_id
                                 ORDER BY allocated_bytes DESC, op_name NULLS LAST) AS rank_in_device
    FROM per_op
)
SELECT run_id, rank, device_type, device_id, rank_in_device, op_name, allocations, allocated_bytes, largest_bytes,
    live_at_peak_bytes
FROM ranked
WHERE rank_in_device <= COALESCE(getvariable('top'), 10)
ORDER BY run_id, rank, device_type, device_id, rank_in_device;
