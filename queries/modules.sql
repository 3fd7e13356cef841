-- modules: Device and host time of each nn.Module (layer), per layer type or per layer instance, with its share of the step.
--
-- The module stack of a trace recorded with with_stack=True (or with_modules=True) holds a range per call of each
-- module's forward: 'nn.Module: Qwen2DecoderLayer_3' is the 4th Qwen2DecoderLayer instance of the model (type
-- Qwen2DecoderLayer). A call owns the device events launched from its thread while it ran (`range_launches` with
-- projection 'thread': the forward pass runs on the calling thread; backward time is not a module's, see
-- `phases`). Nested modules each count the events under them (a decoder layer holds its attention and MLP);
-- self_device_ns is the part no nested module holds. device_ns sums event durations (concurrent streams add up);
-- device_span_ns sums each call's first-start-to-last-end. step_share = device_ns / the summed device windows of
-- the run's steps (a rank without steps: its first to last device event).
--
-- Needs: the module stack: a trace recorded with with_stack=True or with_modules=True ('nn.Module: ...' ranges)
-- Parameters:
--   per = 'type'   one of type, instance: a row per module type (Qwen2DecoderLayer) or per instance (Qwen2DecoderLayer_3)
--   top = 50       integer >= 1: rows per run, by device time
-- Columns:
--   run_id            VARCHAR  run
--   module            VARCHAR  the module type, or the instance ('Qwen2DecoderLayer_3') when per = 'instance'
--   module_type       VARCHAR  the module's type (class name)
--   module_depth      INTEGER  modules enclosing its calls (0 = the outermost model), the least over its calls
--   instances         BIGINT   distinct instances (1 per instance row)
--   calls             BIGINT   calls (module ranges), all ranks
--   ranks             BIGINT   ranks on which it ran
--   host_ns           BIGINT   summed host duration of the calls
--   host_mean_ns      DOUBLE   host_ns / calls
--   kernels           BIGINT   device events launched inside the calls
--   device_ns         BIGINT   summed duration of those device events
--   device_mean_ns    DOUBLE   device_ns / calls: one call's device time
--   self_device_ns    BIGINT   the part of device_ns no nested module holds
--   device_span_ns    BIGINT   summed first-start-to-last-end of each call's device events
--   step_share        DOUBLE   device_ns / the run's summed step device windows
WITH calls AS (
    -- module depth: module calls open on the thread when this one starts (at one instant ends sort before starts,
    -- and a longer call before a shorter one)
    SELECT run_id, rank, slice_id, name, dur, is_start,
        sum(edge) OVER (PARTITION BY run_id, rank, pid, tid ORDER BY t, edge, dur DESC
                       ROWS UNBOUNDED PRECEDING) - 1 AS module_depth
    FROM (
        SELECT r.run_id, r.rank, r.pid, r.tid, r.slice_id, r.name, r.dur, e.edge, e.edge = 1 AS is_start,
            CASE WHEN e.edge = 1 THEN r.ts ELSE r.te END AS t
        FROM host_ranges(ranges := 'modules') r CROSS JOIN (VALUES (1), (-1)) e(edge)
    )
), projected AS (
    SELECT run_id, rank, slice_id, count(*) AS kernels, sum(dur) AS device_ns,
        sum(CASE WHEN innermost THEN dur ELSE 0 END) AS self_device_ns, max(ts + dur) - min(ts) AS device_span_ns
    FROM range_launches(ranges := 'modules', projection := 'thread')
    GROUP BY run_id, rank, slice_id
), per_call AS (
    SELECT c.run_id, c.rank, c.dur, c.module_depth, substr(c.name, 12) AS instance,
        regexp_replace(substr(c.name, 12), '_[0-9]+$', '') AS module_type,
        COALESCE(p.kernels, 0) AS kernels, COALESCE(p.device_ns, 0) AS device_ns,
        COALESCE(p.self_device_ns, 0) AS self_device_ns, COALESCE(p.device_span_ns, 0) AS device_span_ns
    FROM calls c
    LEFT JOIN projected p ON p.run_id = c.run_id AND p.rank = c.rank AND p.slice_id = c.slice_id
    WHERE c.is_start
), per_module AS (
    SELECT run_id, CASE WHEN COALESCE(getvariable('per'), 'type') = 'instance' THEN instance ELSE module_type END
            AS module,
        any_value(module_type) AS module_type, CAST(min(module_depth) AS INTEGER) AS module_depth,
        count(DISTINCT instance) AS instances, count(*) AS calls, count(DISTINCT rank) AS ranks,
        CAST(sum(dur) AS BIGINT) AS host_ns, sum(dur) / count(*) AS host_mean_ns,
        CAST(sum(kernels) AS BIGINT) AS kernels, CAST(sum(device_ns) AS BIGINT) AS device_ns,
        sum(device_ns) / count(*) AS device_mean_ns, CAST(sum(self_device_ns) AS BIGINT) AS self_device_ns,
        CAST(sum(device_span_ns) AS BIGINT) AS device_span_ns
    FROM per_call
    GROUP BY 1, 2
), windows AS (
    SELECT run_id, sum(window_ns) AS window_ns
    FROM (
        SELECT run_id, device_dur AS window_ns FROM steps
        UNION ALL
        SELECT s.run_id, max(s.ts + s.dur) - min(s.ts)
        FROM slices s LEFT JOIN (SELECT DISTINCT run_id, rank FROM steps) st ON st.run_id = s.run_id AND st.rank = s.rank
        WHERE s.kind IN ('kernel', 'memcpy', 'memset') AND st.rank IS NULL
        GROUP BY s.run_id, s.rank
    )
    GROUP BY run_id
)
SELECT m.*, m.device_ns / w.window_ns AS step_share
FROM per_module m LEFT JOIN windows w ON w.run_id = m.run_id
QUALIFY row_number() OVER (PARTITION BY m.run_id ORDER BY m.device_ns DESC, m.module) <= COALESCE(getvariable('top'), 50)
ORDER BY m.run_id, m.device_ns DESC, m.module;
