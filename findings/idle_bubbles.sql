-- idle_bubbles: Steps whose device sits idle waiting for the host: idle gaps inside the step that the host caused.
--
-- The gaps are the bubbles query's with scope 'device' (the intervals where nothing runs on the device, `idle_gaps`)
-- that lie inside the step, at least min_gap_ns long; a gap is the host's (HTA's host_wait) when the launch of the
-- work that ends it started after the gap began. Their host cause: the host ops and ranges whose own time lies
-- on the steps' critical paths (HTA's, the critical_path query's) during those gaps, launch, synchronising and
-- copy calls left out; the top_causes of them with the most such time over the run. Priced by the what-if replay
-- of each step with them taking no time (the what_if query's faster = their names, faster_pct = 100). A step whose
-- gaps have no host cause on the path (they wait for a synchronisation or another stream) saves 0 and its
-- evidence says so. Evidence: the gaps, their idle time and share of the step, the causes. The fix: make that
-- host work cheaper or move it off the launching thread (CUDA graphs, torch.compile, a data loader worker).
--
-- Needs: device work with its launching host calls (Kineto GPU traces with correlation ids)
-- Parameters:
--   run = 'RUN'             text: the run as the user named it, for the query column's command
--   min_saving_pct = 5      number >= 0: fires when the fix saves at least this % of the step
--   min_gap_ns = 100000     integer >= 0: shorter gaps are left out (the bubbles query's macro gaps: 100 us)
--   top_causes = 3          integer >= 1: how many host ops and ranges the what-if removes
-- Columns:
--   run_id      VARCHAR  run
--   rank        INTEGER  rank
--   step        INTEGER  step
--   finding     VARCHAR  the rule that fired (its file's name)
--   evidence    VARCHAR  what it saw, with the numbers
--   saving_ns   BIGINT   step time the what-if replay says the fix saves (0 when it saves none)
--   saving_pct  DOUBLE   saving_ns in % of the step's replayed time
--   query       VARCHAR  the tracesql command that shows the evidence
-- The gaps and their causes, worked out first and kept as a value: a what-if regex that is a subquery is compiled
-- again for every name it is matched against.
SET VARIABLE idle_bubbles_change = (
WITH gaps AS (
    SELECT w.run_id, w.rank, w.instance, g.device_id, g.ts, g.ts + g.dur AS te, g.dur, g.category
    FROM critical_path_windows() w
    JOIN idle_gaps(scope := 'device', with_step := false) g
      ON g.run_id = w.run_id AND g.rank = w.rank AND g.ts >= w.ts AND g.ts + g.dur <= w.te
    WHERE g.dur >= COALESCE(getvariable('min_gap_ns'), 100000)
), gap_buckets AS (
    -- the host's gaps, each in every millisecond of time it touches: the path's pieces are joined with the gaps
    -- of their millisecond (a join within each step compared every piece with every gap: 2 s at 24x); each
    -- overlap is counted in the millisecond it starts in
    SELECT *, unnest(range(ts // 1000000, te // 1000000 + 1)) AS bucket
    FROM gaps
    WHERE category = 'host_wait'
), pieces AS (
    SELECT run_id, rank, instance, s.event_id, s.ts, s.ts + s.dur_ns AS te
    FROM step_critical_paths()
    WHERE s.edge = 'op'
), path_buckets AS (
    -- the steps' critical paths' pieces of ops' time, likewise (most lie in one millisecond: unnested, they took
    -- 0.4 CPU-s at 24x)
    SELECT *, ts // 1000000 AS bucket FROM pieces WHERE ts // 1000000 = greatest(ts, te) // 1000000
    UNION ALL
    SELECT *, unnest(range(ts // 1000000, greatest(ts, te) // 1000000 + 1)) AS bucket
    FROM pieces WHERE ts // 1000000 <> greatest(ts, te) // 1000000
), in_gaps AS MATERIALIZED (
    -- the path's op pieces in the host's gaps (first: 0.4 M of the 2.8 M pieces at 24x are, whose op is looked up)
    SELECT p.run_id, p.rank, p.event_id, least(p.te, g.te) - greatest(p.ts, g.ts) AS in_gap_ns
    FROM path_buckets p
    JOIN gap_buckets g ON g.run_id = p.run_id AND g.rank = p.rank AND g.instance = p.instance AND g.bucket = p.bucket
     AND p.ts < g.te AND p.te > g.ts AND greatest(p.ts, g.ts) // 1000000 = p.bucket
), by_op AS MATERIALIZED (
    -- their time by op or range (first: the cause of each piece took 0.7 s at 24x)
    SELECT e.kind, e.name, sum(p.in_gap_ns) AS in_gaps_ns
    FROM in_gaps p
    JOIN slices e ON e.run_id = p.run_id AND e.rank = p.rank AND e.slice_id = p.event_id
    WHERE e.device_id IS NULL
    GROUP BY ALL
), causes AS (
    -- of them, host ops and ranges (launch, synchronising and copy calls left out)
    SELECT name, sum(in_gaps_ns) AS in_gaps_ns
    FROM by_op
    WHERE critical_path_cause(NULL, kind, name, NULL) IN ('host', 'input')
    GROUP BY name
    ORDER BY in_gaps_ns DESC, name
    LIMIT COALESCE(getvariable('top_causes'), 3)
)
SELECT {'names': (SELECT '^(' || string_agg(regexp_escape(name), '|' ORDER BY in_gaps_ns DESC, name) || ')$'
                  FROM causes),
        'listed': (SELECT string_agg(printf('%s (%.2f ms)', name, in_gaps_ns / 1e6), ', '
                                     ORDER BY in_gaps_ns DESC, name) FROM causes),
        'steps': list({'run_id': run_id, 'rank': rank, 'instance': instance, 'host_gaps': host_gaps,
                       'host_idle_ns': host_idle_ns, 'all_gaps': all_gaps, 'idle_ns': idle_ns,
                       'devices': devices, 'most_idle_ns': most_idle_ns})}
FROM (SELECT run_id, rank, instance, sum(host_gaps) AS host_gaps, sum(host_idle_ns) AS host_idle_ns,
          sum(all_gaps) AS all_gaps, sum(idle_ns) AS idle_ns, count(*) AS devices, max(idle_ns) AS most_idle_ns
      -- per device first: a rank with several devices (XLA) has gaps on each, and their sum can exceed the step
      FROM (SELECT run_id, rank, instance, device_id, count(*) FILTER (WHERE category = 'host_wait') AS host_gaps,
                COALESCE(sum(dur) FILTER (WHERE category = 'host_wait'), 0) AS host_idle_ns,
                count(*) AS all_gaps, sum(dur) AS idle_ns
            FROM gaps
            GROUP BY ALL)
      GROUP BY ALL));

WITH priced AS (
    SELECT * FROM what_if(faster := getvariable('idle_bubbles_change').names, faster_pct := 100)
), per_step AS (
    SELECT unnest(getvariable('idle_bubbles_change').steps, recursive := true)
), change AS (
    SELECT getvariable('idle_bubbles_change').names AS names, getvariable('idle_bubbles_change').listed AS listed
)
SELECT p.run_id, p.rank, p.step, 'idle_bubbles' AS finding,
    CASE WHEN g.devices = 1 THEN printf('the device sits idle %.2f ms of %.2f ms', g.idle_ns / 1e6, p.replayed_ns / 1e6)
         ELSE printf('its %d devices sit idle %.2f ms in all (the most idle %.2f ms of %.2f ms)', g.devices,
                     g.idle_ns / 1e6, g.most_idle_ns / 1e6, p.replayed_ns / 1e6) END
    || printf(' in %d gaps of %.0f us or more, %d of them (%.2f ms) waiting for the host; ', g.all_gaps,
           COALESCE(getvariable('min_gap_ns'), 100000) / 1e3, g.host_gaps, g.host_idle_ns / 1e6)
    || CASE WHEN g.host_gaps = 0 THEN 'the others wait for synchronisations, copies or other streams: no saving'
            WHEN c.names IS NULL THEN 'no host op or range of the run lies on the critical path in them: no saving'
            ELSE printf('on the critical path in the run''s host gaps the host was in %s; without them the step '
                        || 'takes %.2f ms less', c.listed, p.saving_ns / 1e6) END AS evidence,
    CASE WHEN g.host_gaps > 0 THEN p.saving_ns ELSE 0 END AS saving_ns,
    CASE WHEN g.host_gaps > 0 THEN p.saving_pct ELSE 0 END AS saving_pct,
    printf('tracesql query what_if %s%s -p rank=%d -p instance=%d', COALESCE(getvariable('run'), 'RUN'),
           CASE WHEN c.names IS NOT NULL THEN printf(' -p ''faster=%s'' -p faster_pct=100', c.names) ELSE '' END,
           p.rank, p.instance) AS query
FROM priced p
JOIN per_step g ON g.run_id = p.run_id AND g.rank = p.rank AND g.instance = p.instance
CROSS JOIN change c
WHERE (CASE WHEN g.host_gaps > 0 THEN p.saving_pct ELSE 0 END) >= COALESCE(getvariable('min_saving_pct'), 5);
