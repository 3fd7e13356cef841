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
), numbered AS (
    SELECT *,
        row_number() OVER (device ORDER BY ts, memory_id) AS n,
        row_number() OVER (device ORDER BY total_allocated_bytes DESC, ts, memory_id) AS allocated_order
    -- each allocator's own peak (torch_npu's components apart); '' keys a NULL allocator in the joins
    FROM (SELECT *, COALESCE(allocator, '') AS allocator_key FROM memory)
    WINDOW device AS (PARTITION BY run_id, rank, device_type, device_id, allocator_key)
), events AS (
    SELECT *,
        lead(n) OVER (PARTITION BY run_id, rank, device_type, device_id, allocator_key, addr ORDER BY n) AS freed_n
    FROM numbered
), peaks AS (
    SELECT run_id, rank, device_type, device_id, allocator_key, n AS peak_n FROM events WHERE allocated_order = 1
), allocations AS (
    SELECT e.run_id, e.rank, e.device_type, e.device_id, e.bytes,
        CASE COALESCE(getvariable('op_level'), 'self') WHEN 'top' THEN t.top_name ELSE COALESCE(o.name, e.op_name)
        END AS op_name,
        -- a block with no address (torch_npu's memory files) cannot be followed to its free: not known
        CASE WHEN e.addr IS NOT NULL THEN e.n <= p.peak_n AND (e.freed_n IS NULL OR e.freed_n > p.peak_n) END
            AS live_at_peak
    FROM events e
    JOIN peaks p USING (run_id, rank, device_type, device_id, allocator_key)
    LEFT JOIN ops o ON o.run_id = e.run_id AND o.rank = e.rank AND o.op_id = e.op_id
    LEFT JOIN top_ops t ON t.run_id = e.run_id AND t.rank = e.rank AND t.op_id = e.op_id
    WHERE e.bytes > 0
), per_op AS (
    SELECT run_id, rank, device_type, device_id, op_name, count(*) AS allocations,
        CAST(sum(bytes) AS BIGINT) AS allocated_bytes, max(bytes) AS largest_bytes,
        CASE WHEN count(live_at_peak) > 0
             THEN CAST(COALESCE(sum(bytes) FILTER (WHERE live_at_peak), 0) AS BIGINT) END AS live_at_peak_bytes
    FROM allocations
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
