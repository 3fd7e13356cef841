-- tiny_kernels: Steps of many tiny kernels: kernels shorter than it takes the host to launch them.
--
-- The launch overhead is the median duration of the step's launch calls (the launch query's runtime_p50_ns: each
-- call once); a kernel shorter than it is tiny: the device runs it faster than the host can launch the next, so
-- the step runs at the pace of the launches. Fires when at least min_tiny_pct % of the step's kernels are tiny.
-- Priced by the what-if replay of each step with launches costing nothing, as when the kernels are fused or
-- replayed from a CUDA graph: the host calls that launched the run's tiny kernels take no time (the what_if
-- query's faster = their names, e.g. cudaLaunchKernel, faster_pct = 100: every launch by those calls, the what-if
-- changes calls by name) and launch delays and gaps between kernels neither (no_launch_overhead = 1). The
-- launch_overhead rule prices the device side only; on a host-bound step only this one saves. Evidence: the
-- kernels, how many are tiny, their time, the launch overhead and the launch calls' time. The fix: fewer, larger
-- kernels (torch.compile, fused ops, larger batches) or CUDA graphs.
--
-- Needs: host launch calls and the device work they launched (Kineto GPU traces with correlation ids)
-- Parameters:
--   run = 'RUN'             text: the run as the user named it, for the query column's command
--   min_saving_pct = 5      number >= 0: fires when the fix saves at least this % of the step
--   min_tiny_pct = 50       number >= 0: fires when at least this % of the step's kernels are tiny
-- Columns:
--   run_id      VARCHAR  run
--   rank        INTEGER  rank
--   step        INTEGER  step
--   finding     VARCHAR  the rule that fired (its file's name)
--   evidence    VARCHAR  what it saw, with the numbers
--   saving_ns   BIGINT   step time the what-if replay says the fix saves (0 when it saves none)
--   saving_pct  DOUBLE   saving_ns in % of the step's replayed time
--   query       VARCHAR  the tracesql command that shows the evidence
-- The steps' kernels and the launch calls to free, worked out first and kept as a value: a what-if regex that is
-- a subquery is compiled again for every name it is matched against.
SET VARIABLE tiny_kernels_change = (
WITH windows AS (
    SELECT * FROM window_buckets()
), device AS (
    -- (with its time bucket, by which it meets its window: window_buckets)
    SELECT d.*, d.launch_ts // x.width AS bucket
    FROM slices d JOIN (SELECT DISTINCT run_id, rank, width FROM windows) x ON x.run_id = d.run_id AND x.rank = d.rank
    WHERE d.kind IN ('kernel', 'memcpy', 'memset')
), launched AS (
    SELECT w.run_id, w.rank, w.instance, d.kind, d.dur, d.launch_id, d.launch_dur, l.name AS call
    FROM windows w
    JOIN device d ON d.run_id = w.run_id AND d.rank = w.rank AND d.bucket = w.bucket
     AND d.launch_ts BETWEEN w.ts AND w.te
    JOIN slices l ON l.run_id = d.run_id AND l.rank = d.rank AND l.slice_id = d.launch_id
), overhead AS (
    SELECT run_id, rank, instance, quantile_cont(launch_dur, 0.5) AS launch_p50_ns, count(*) AS calls,
        sum(launch_dur) AS calls_ns
    FROM (SELECT DISTINCT run_id, rank, instance, launch_id, launch_dur FROM launched)
    GROUP BY ALL
), kernels AS (
    SELECT k.run_id, k.rank, k.instance, o.launch_p50_ns, o.calls, o.calls_ns, count(*) AS kernels,
        count(*) FILTER (WHERE k.dur < o.launch_p50_ns) AS tiny,
        COALESCE(sum(k.dur) FILTER (WHERE k.dur < o.launch_p50_ns), 0) AS tiny_ns,
        list(DISTINCT k.call) FILTER (WHERE k.dur < o.launch_p50_ns) AS tiny_calls
    FROM launched k
    JOIN overhead o ON o.run_id = k.run_id AND o.rank = k.rank AND o.instance = k.instance
    WHERE k.kind = 'kernel'
    GROUP BY ALL
)
SELECT {'calls': (SELECT '^(' || string_agg(DISTINCT regexp_escape(call), '|' ORDER BY regexp_escape(call)) || ')$'
                  FROM (SELECT unnest(tiny_calls) AS call FROM kernels
                        WHERE 100 * tiny / kernels >= COALESCE(getvariable('min_tiny_pct'), 50))),
        'steps': list({'run_id': run_id, 'rank': rank, 'instance': instance, 'launch_p50_ns': launch_p50_ns,
                       'calls': calls, 'calls_ns': calls_ns, 'kernels': kernels, 'tiny': tiny, 'tiny_ns': tiny_ns})}
FROM kernels);

WITH kernels AS (
    SELECT unnest(getvariable('tiny_kernels_change').steps, recursive := true)
), change AS (
    SELECT getvariable('tiny_kernels_change').calls AS calls
), priced AS (
    SELECT * FROM what_if(faster := getvariable('tiny_kernels_change').calls, faster_pct := 100,
                          no_launch_overhead := 1)
)
SELECT p.run_id, p.rank, p.step, 'tiny_kernels' AS finding,
    printf('%d of %d kernels (%.0f %%) are shorter than the launch overhead (%.1f us, the median launch call), '
           || '%.2f ms in all; %d launch calls take %.2f ms; with launches costing nothing the step takes %.2f ms '
           || 'less of %.2f ms', k.tiny, k.kernels, 100 * k.tiny / k.kernels, k.launch_p50_ns / 1e3,
           k.tiny_ns / 1e6, k.calls, k.calls_ns / 1e6, p.saving_ns / 1e6, p.replayed_ns / 1e6) AS evidence,
    p.saving_ns, p.saving_pct,
    printf('tracesql query what_if %s -p ''faster=%s'' -p faster_pct=100 -p no_launch_overhead=1 -p rank=%d '
           || '-p instance=%d', COALESCE(getvariable('run'), 'RUN'), c.calls, p.rank, p.instance) AS query
FROM priced p
JOIN kernels k ON k.run_id = p.run_id AND k.rank = p.rank AND k.instance = p.instance
CROSS JOIN change c
WHERE 100 * k.tiny / k.kernels >= COALESCE(getvariable('min_tiny_pct'), 50)
  AND p.saving_pct >= COALESCE(getvariable('min_saving_pct'), 5);
