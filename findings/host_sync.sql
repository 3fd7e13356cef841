-- host_sync: Steps whose host waits for the device: synchronisations and device-to-host copies (.item()).
--
-- Priced by the what-if replay of each step without its stream, device and event synchronisations (the what_if
-- query's remove_syncs = 1): the time the host waited for the device and could otherwise have launched ahead.
-- Evidence: the step's synchronising calls and their host time, and its device-to-host copies (a .item(),
-- .cpu() or print of a device tensor copies and synchronises). The fix: keep values on the device, read them
-- once every N steps, or copy asynchronously to pinned memory.
--
-- Needs: Kineto GPU traces with cuda_sync events (PyTorch 2.1+) for the synchronisations
-- Parameters:
--   run = 'RUN'             text: the run as the user named it, for the query column's command
--   min_saving_pct = 5      number >= 0: fires when the fix saves at least this % of the step
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
    SELECT * FROM what_if(remove_syncs := 1)
), fired AS MATERIALIZED (
    -- the steps where it fires: the evidence is gathered of those only (of every step it took 0.3-1.3 s
    -- a rule at 24x, where none fires)
    SELECT * FROM priced WHERE saving_pct >= COALESCE(getvariable('min_saving_pct'), 5)
), windows AS (
    SELECT w.* FROM critical_path_windows() w
    SEMI JOIN fired f ON f.run_id = w.run_id AND f.rank = w.rank AND f.instance = w.instance
), calls AS (
    SELECT w.run_id, w.rank, w.instance,
        count(*) FILTER (WHERE is_sync_call(h.kind, h.name)) AS syncs,
        COALESCE(sum(h.dur) FILTER (WHERE is_sync_call(h.kind, h.name)), 0) AS sync_ns,
        count(*) FILTER (WHERE h.kind = 'memcpy' AND contains(h.name, 'DtoH')) AS copies_to_host
    FROM windows w
    JOIN slices l ON l.run_id = w.run_id AND l.rank = w.rank AND l.ts BETWEEN w.ts AND w.te AND l.device_id IS NULL
    -- the host call itself, and the copies it launched: two equality joins (an OR of the two keys made DuckDB
    -- compare every host call with every slice of its rank: 20 s on HTA's trace_diff control trace)
    -- (of them the synchronising calls and device-to-host copies only, first: joining every host call of the
    -- steps took 1.2 s at 24x)
    JOIN (SELECT run_id, rank, slice_id AS host_id, kind, name, dur FROM slices
          UNION ALL
          SELECT run_id, rank, launch_id, kind, name, dur FROM slices
          WHERE kind = 'memcpy' AND launch_id <> slice_id) h
      ON h.run_id = l.run_id AND h.rank = l.rank AND h.host_id = l.slice_id
     AND (is_sync_call(h.kind, h.name) OR h.kind = 'memcpy' AND contains(h.name, 'DtoH'))
    GROUP BY ALL
)
SELECT p.run_id, p.rank, p.step, 'host_sync' AS finding,
    printf('without synchronisation the step takes %.2f ms less of %.2f ms: %d synchronising calls (%.2f ms on '
           || 'the host), %d device-to-host copies; waiting is %.0f %% of the critical path', p.saving_ns / 1e6,
           p.replayed_ns / 1e6, c.syncs, c.sync_ns / 1e6, c.copies_to_host, 100 * p.sync_share) AS evidence,
    p.saving_ns, p.saving_pct,
    printf('tracesql query what_if %s -p remove_syncs=1 -p rank=%d -p instance=%d',
           COALESCE(getvariable('run'), 'RUN'), p.rank, p.instance) AS query
FROM fired p
JOIN calls c ON c.run_id = p.run_id AND c.rank = p.rank AND c.instance = p.instance
WHERE c.syncs + c.copies_to_host > 0;
