-- launch_overhead: Steps bound by kernel launches: many small kernels, each waiting for the host to launch it.
--
-- Priced by the what-if replay of each step with launch delays and the gaps between kernels taking no time (the
-- what_if query's no_launch_overhead = 1): the time the device spent waiting for launches. Evidence: the kernels
-- the step launched, how many are shorter than tiny_kernel_ns, their median length, how many were launched onto
-- an idle stream (stream starvation: the stream's earlier work had all ended when the launch call began, so the
-- device waited for the host; the queue_length query shows the queues over time), and the host and launch share
-- of the step's critical path. The fix: fewer, larger kernels (fusion, torch.compile, CUDA graphs), launched
-- ahead of the device.
--
-- Needs: host ops and the device work they launched (Kineto GPU traces with correlation ids)
-- Parameters:
--   run = 'RUN'             text: the run as the user named it, for the query column's command
--   min_saving_pct = 5      number >= 0: fires when the fix saves at least this % of the step
--   tiny_kernel_ns = 10000  integer >= 0: a kernel shorter than this counts as tiny in the evidence
-- Columns:
--   run_id      VARCHAR  run
--   rank        INTEGER  rank
--   step        INTEGER  step
--   finding     VARCHAR  the rule that fired (its file's name)
--   evidence    VARCHAR  what it saw, with the numbers
--   saving_ns   BIGINT   step time the what-if replay says the fix saves (0 when it saves none)
--   saving_pct  DOUBLE   saving_ns in % of the step's replayed time
--   query       VARCHAR  the tracesql command that shows the evidence
WITH priced AS (
    SELECT * FROM what_if(no_launch_overhead := 1)
), fired AS MATERIALIZED (
    -- the steps where it fires: the evidence is gathered of those only (of every step it took 0.3-1.3 s
    -- a rule at 24x, where none fires)
    SELECT * FROM priced WHERE saving_pct >= COALESCE(getvariable('min_saving_pct'), 5)
), windows AS (
    SELECT w.* FROM critical_path_windows() w
    SEMI JOIN fired f ON f.run_id = w.run_id AND f.rank = w.rank AND f.instance = w.instance
), kernels AS (
    SELECT d.run_id, d.rank, w.instance, count(*) AS kernels,
        count(*) FILTER (WHERE d.dur < COALESCE(getvariable('tiny_kernel_ns'), 10000)) AS tiny,
        median(d.dur) AS median_ns,
        count(*) FILTER (WHERE d.stream_free_ts <= d.launch_ts) AS starved
    FROM (SELECT *, max(ts + dur) OVER (PARTITION BY run_id, rank, device_id, stream ORDER BY ts, slice_id
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS stream_free_ts
          FROM device_activity()
          -- (of the ranks where it fires: the window's partitions are whole, its values unchanged)
          WHERE (run_id, rank) IN (SELECT (run_id, rank) FROM fired)) d
    -- (by the launch's start stored on the device event: joined to its launch first, DuckDB paired every device
    -- event with every window of its rank before it matched the launches, 4.2 GB and 16 CPU-s on the 24x tile)
    JOIN windows w ON w.run_id = d.run_id AND w.rank = d.rank AND d.launch_ts BETWEEN w.ts AND w.te
    GROUP BY ALL
)
SELECT p.run_id, p.rank, p.step, 'launch_overhead' AS finding,
    printf('without launch overhead the step takes %.2f ms less of %.2f ms: %d kernels, %d of them shorter than '
           || '%.0f us, median %.1f us; %d launched onto an idle stream (starved: it waited for the '
           || 'host); host and launches are %.0f %% of the critical path', p.saving_ns / 1e6, p.replayed_ns / 1e6,
           k.kernels, k.tiny, COALESCE(getvariable('tiny_kernel_ns'), 10000) / 1e3, k.median_ns / 1e3, k.starved,
           100 * p.host_launch_share) AS evidence,
    p.saving_ns, p.saving_pct,
    printf('tracesql query what_if %s -p no_launch_overhead=1 -p rank=%d -p instance=%d',
           COALESCE(getvariable('run'), 'RUN'), p.rank, p.instance) AS query
FROM fired p
JOIN kernels k ON k.run_id = p.run_id AND k.rank = p.rank AND k.instance = p.instance;
