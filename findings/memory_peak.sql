-- memory_peak: Devices whose memory peak comes close to their capacity: no room for a larger batch, and a risk of running out.
--
-- The peak of each device's allocations over the run (the memory table's peak_allocated_bytes, else its
-- total_allocated_bytes: XLA's allocator on TPU and GPU, the CUDA caching allocator) against the device's
-- capacity as the trace recorded it (devices.total_memory_bytes; a TPU's XPlane records none: not rated). A
-- memory peak costs no step time, so the saving is 0 and the evidence says so; it is listed because it limits
-- what the other fixes may do (a larger batch, less rematerialization, fewer offloaded copies). One row per
-- device over the run (step NULL).
--
-- Needs: memory events of the device's allocator and the device's capacity (XPlane GPU profiles, Kineto with
-- profile_memory)
-- Parameters:
--   run = 'RUN'             text: the run as the user named it, for the query column's command
--   min_peak_pct = 90       number > 0: fires when the peak reaches this % of the device's capacity
-- Columns:
--   run_id      VARCHAR  run
--   rank        INTEGER  rank
--   step        INTEGER  step
--   finding     VARCHAR  the rule that fired (its file's name)
--   evidence    VARCHAR  what it saw, with the numbers
--   saving_ns   BIGINT   step time the what-if replay says the fix saves (0 when it saves none)
--   saving_pct  DOUBLE   saving_ns in % of the step's replayed time
--   query       VARCHAR  the tracesql command that shows the evidence
WITH peaks AS (
    SELECT m.run_id, m.rank, m.device_id, max(greatest(m.peak_allocated_bytes, m.total_allocated_bytes)) AS peak_bytes,
        any_value(d.total_memory_bytes) AS capacity_bytes, any_value(d.name) AS device
    FROM memory m
    JOIN devices d ON d.run_id = m.run_id AND d.rank = m.rank AND d.device_id = m.device_id
    WHERE d.total_memory_bytes > 0
    GROUP BY m.run_id, m.rank, m.device_id
)
SELECT run_id, rank, NULL::INTEGER AS step, 'memory_peak' AS finding,
    printf('device %d (%s): peak %.2f GiB of %.2f GiB (%.1f %%); a memory peak costs no step time: saving 0',
           device_id, COALESCE(device, 'unnamed'), peak_bytes / 2 ^ 30, capacity_bytes / 2 ^ 30,
           100 * peak_bytes / capacity_bytes) AS evidence,
    CAST(0 AS BIGINT) AS saving_ns, CAST(0 AS DOUBLE) AS saving_pct,
    printf('tracesql query memory %s', COALESCE(getvariable('run'), 'RUN')) AS query
FROM peaks
WHERE 100 * peak_bytes / capacity_bytes >= COALESCE(getvariable('min_peak_pct'), 90);
