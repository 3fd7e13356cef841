-- memory: Peak allocated and reserved memory of each device, and when it was reached.
--
-- From the allocator's running totals on every `[memory]` event (profile_memory=True): `Total Allocated` is what
-- live tensors hold, `Total Reserved` what the caching allocator holds from the device (allocated + cached free
-- blocks). A figure the trace does not give is NULL, and so is its time (reserved on the CPU, which has no
-- caching allocator; allocated for torch_npu's APP component). The totals include memory allocated before the profiler
-- started, so the peak is the device's real peak within the profiled window, not only what the window allocated.
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
WITH ordered AS (
    -- the op: the framework op on the allocating thread, else the op the allocator event names (XLA's tf_op)
    SELECT m.* EXCLUDE (op_name), COALESCE(o.name, m.op_name) AS op_name,
        row_number() OVER (device ORDER BY m.total_allocated_bytes DESC, m.ts, m.memory_id) AS allocated_order,
        row_number() OVER (device ORDER BY m.total_reserved_bytes DESC, m.ts, m.memory_id) AS reserved_order,
        row_number() OVER (device ORDER BY m.ts DESC, m.memory_id DESC) AS from_last
    FROM memory m
    LEFT JOIN ops o ON o.run_id = m.run_id AND o.rank = m.rank AND o.op_id = m.op_id
    WINDOW device AS (PARTITION BY m.run_id, m.rank, m.device_type, m.device_id, m.allocator)
)
SELECT run_id, rank, device_type, device_id, allocator, count(*) AS events, min(ts) AS first_ts, max(ts) AS last_ts,
    max(total_allocated_bytes) AS peak_allocated_bytes,
    any_value(ts) FILTER (WHERE allocated_order = 1 AND total_allocated_bytes IS NOT NULL) AS peak_allocated_ts,
    any_value(op_name) FILTER (WHERE allocated_order = 1 AND total_allocated_bytes IS NOT NULL) AS peak_op,
    max(total_reserved_bytes) AS peak_reserved_bytes,
    any_value(ts) FILTER (WHERE reserved_order = 1 AND total_reserved_bytes IS NOT NULL) AS peak_reserved_ts,
    any_value(total_allocated_bytes) FILTER (WHERE from_last = 1) AS final_allocated_bytes,
    any_value(total_reserved_bytes) FILTER (WHERE from_last = 1) AS final_reserved_bytes
FROM ordered
GROUP BY run_id, rank, device_type, device_id, allocator
ORDER BY run_id, rank, device_type, device_id, allocator;
