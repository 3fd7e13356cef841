-- memory: Peak allocated and reserved memory of each device, and when it was reached.
--
-- From the allocator's running totals on every `[memory]` event (profile_memory=True): `Total Allocated` is what
-- live tensors hold, `Total Reserved` what the caching allocator holds from the device (allocated + cached free
-- blocks). A figure the trace does not give is NULL, and so is its time (reserved on the CPU, which has no
-- caching allocator, and for XPlane's BFC allocators, which record no such figure; allocated for torch_npu's APP
-- component). The totals include memory allocated before the profiler started, so the peak is the device's real
-- peak within the profiled window, not only what the window allocated.
-- peak_*_ts is the first event at which the peak was reached; peak_op the op that allocated there.
-- A device with several allocators or components (XPlane's, torch_npu's PTA / GE / APP) has a row for each.
-- memory_curve gives the curves over time, memory_ops the ops that allocated most.
--
-- Needs: allocator events (profile_memory=True: PyTorch's [memory] events, torch_npu's memory_record.csv)
-- Columns:
--   run_id                VARCHAR  run
--   rank                  INTEGER  rank
--   device_type           VARCHAR  'cpu', 'gpu', 'tpu', 'npu' or 'other'
--   device_id             INTEGER  device index (-1: host memory)
--   allocator             VARCHAR  allocator or component (torch_npu: PTA, GE, APP, module <NAME>; NULL: not named)
--   events                BIGINT   allocator events (allocations and frees)
--   first_ts              BIGINT   first event, ns
--   last_ts               BIGINT   last event, ns
--   peak_allocated_bytes  BIGINT   highest Total Allocated
--   peak_allocated_ts     BIGINT   when it was first reached
--   peak_op               VARCHAR  op that made the allocation reaching the peak (NULL: outside any op)
--   peak_reserved_bytes   BIGINT   highest Total Reserved
--   peak_reserved_ts      BIGINT   when it was first reached
--   final_allocated_bytes BIGINT   Total Allocated after the last event
--   final_reserved_bytes  BIGINT   Total Reserved after the last event
WITH devices AS (
    -- the rows the peaks and the end were reached at, by id (memory_id is unique in a rank): the first in the order
    -- (total DESC NULLS LAST, ts, memory_id) for each peak, the last by (ts, memory_id) for the end (aggregates: a
    -- row_number window per order sorted every event three times)
    SELECT run_id, rank, device_type, device_id, allocator, count(*) AS events, min(ts) AS first_ts,
        max(ts) AS last_ts, max(total_allocated_bytes) AS peak_allocated_bytes,
        max(total_reserved_bytes) AS peak_reserved_bytes,
        arg_min(memory_id, (total_allocated_bytes IS NULL, -COALESCE(total_allocated_bytes, 0), ts, memory_id))
            AS allocated_id,
        arg_min(memory_id, (total_reserved_bytes IS NULL, -COALESCE(total_reserved_bytes, 0), ts, memory_id))
            AS reserved_id,
        arg_max(memory_id, (ts, memory_id)) AS last_id
    FROM memory
    GROUP BY run_id, rank, device_type, device_id, allocator
), marked AS (
    -- those rows only, with their op: the framework op on the allocating thread, else the op the allocator event
    -- names (XLA's tf_op)
    SELECT m.run_id, m.rank, m.memory_id, m.ts, m.total_allocated_bytes, m.total_reserved_bytes,
        COALESCE(o.name, m.op_name) AS op_name
    FROM memory m
    LEFT JOIN ops o ON o.run_id = m.run_id AND o.rank = m.rank AND o.op_id = m.op_id
    SEMI JOIN devices d ON d.run_id = m.run_id AND d.rank = m.rank
     AND m.memory_id IN (d.allocated_id, d.reserved_id, d.last_id)
)
SELECT d.run_id, d.rank, d.device_type, d.device_id, d.allocator, d.events, d.first_ts, d.last_ts,
    d.peak_allocated_bytes,
    -- NULL when the trace gives no such figure (then the order's first row is merely the earliest)
    CASE WHEN d.peak_allocated_bytes IS NOT NULL THEN a.ts END AS peak_allocated_ts,
    CASE WHEN d.peak_allocated_bytes IS NOT NULL THEN a.op_name END AS peak_op,
    d.peak_reserved_bytes,
    CASE WHEN d.peak_reserved_bytes IS NOT NULL THEN r.ts END AS peak_reserved_ts,
    l.total_allocated_bytes AS final_allocated_bytes, l.total_reserved_bytes AS final_reserved_bytes
FROM devices d
JOIN marked a ON a.run_id = d.run_id AND a.rank = d.rank AND a.memory_id = d.allocated_id
JOIN marked r ON r.run_id = d.run_id AND r.rank = d.rank AND r.memory_id = d.reserved_id
JOIN marked l ON l.run_id = d.run_id AND l.rank = d.rank AND l.memory_id = d.last_id
ORDER BY d.run_id, d.rank, d.device_type, d.device_id, d.allocator;
