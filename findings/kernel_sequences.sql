-- kernel_sequences: Steps that repeat a kernel sequence: a fusion candidate, priced as one kernel per occurrence.
--
-- A sequence is what one top-level host op (an op inside no other op) launched, in the order it ran on the
-- device: the op's name and its kernels' names, as the kernel_sequences query groups them (its pattern). Per
-- rank, the sequence of at least min_kernels kernels that recurs at least min_occurrences times in the run and
-- would save the most launches fused (occurrences x (kernels - 1)) is the candidate. Priced by the what-if replay
-- (critical_path_walk, the what_if query's) of each step with each occurrence fused: its kernels are one kernel
-- from the first's start, lasting their summed time, so that the launch delays and gaps inside it take no time,
-- and the host calls that launched the others take none either. Only occurrences whose kernels ran on one
-- stream with nothing else between them are fused. Evidence: the sequence, its occurrences in the step, their
-- kernel time, the gaps inside them and the launch calls fusing removes. The fix: fuse the sequence
-- (torch.compile, a fused kernel: e.g. an optimizer's foreach or fused variant, a fused norm) or capture it in a
-- CUDA graph.
--
-- Needs: host ops and the device work they launched (Kineto GPU traces with correlation ids)
-- Parameters:
--   run = 'RUN'             text: the run as the user named it, for the query column's command
--   min_saving_pct = 5      number >= 0: fires when the fix saves at least this % of the step
--   min_kernels = 3         integer >= 2: sequences of fewer kernels are not candidates
--   min_occurrences = 10    integer >= 1: sequences that recur fewer times in the rank's steps are not candidates
-- Columns:
--   run_id      VARCHAR  run
--   rank        INTEGER  rank
--   step        INTEGER  step
--   finding     VARCHAR  the rule that fired (its file's name)
--   evidence    VARCHAR  what it saw, with the numbers
--   saving_ns   BIGINT   step time the what-if replay says the fix saves (0 when it saves none)
--   saving_pct  DOUBLE   saving_ns in % of the step's replayed time
--   query       VARCHAR  the tracesql command that shows the evidence
WITH roots AS (
    -- the top-level ops of each step
    SELECT w.run_id, w.rank, w.instance, o.op_id AS root_id, o.name AS root, o.pid, o.tid, o.ts, o.ts + o.dur AS te
    FROM critical_path_windows() w
    JOIN ops o ON o.run_id = w.run_id AND o.rank = w.rank AND o.op_depth = 0 AND o.ts BETWEEN w.ts AND w.te
), buckets AS (
    -- each root once per time bucket it touches (width: the roots' mean length), so that a launch finds the roots
    -- that hold it by an equi-join on (thread, bucket) and a check of the few roots of its bucket: a range join
    -- compared each launch with every top-level op of its thread, quadratic in the trace's length
    SELECT *, unnest(range(ts // width, te // width + 1)) AS bucket
    FROM (SELECT *, CAST(greatest(avg(te - ts) OVER (), 1) AS BIGINT) AS width FROM roots)
), launched AS (
    -- each top-level op of a step with the device events launched from inside it on its thread (slices.launch_*:
    -- the launching runtime or driver call's start and thread)
    SELECT r.run_id, r.rank, r.instance, r.root_id, r.root, d.slice_id, d.name, d.kind, d.ts, d.dur, d.stream
    FROM (SELECT d.*, d.launch_ts // x.width AS bucket
          FROM slices d CROSS JOIN (SELECT max(width) AS width FROM buckets) x
          WHERE d.kind IN ('kernel', 'memcpy', 'memset') AND d.launch_id IS NOT NULL) d
    JOIN buckets r ON r.run_id = d.run_id AND r.rank = d.rank AND r.pid = d.launch_pid AND r.tid = d.launch_tid
     AND r.bucket = d.bucket AND d.launch_ts BETWEEN r.ts AND r.te
), sequences AS (
    SELECT * EXCLUDE (kernels), [k.name FOR k IN kernels] AS kernel_names, [k.slice_id FOR k IN kernels] AS ids
    FROM (
        -- (one list, split after: two lists in order sorted each root's kernels twice; and one stream by its
        -- least and greatest, not a count of distinct streams, a pass of its own: 1.45 -> 0.9 CPU-s at 24x. The
        -- list sorted by its (ts, slice_id, name) structs, not an ordered aggregate: its 146 k groups 0.64 -> 0.18
        -- CPU-s at 24x)
        SELECT run_id, rank, instance, root_id, any_value(root) AS root,
            list_sort(list({'ts': ts, 'slice_id': slice_id, 'name': name})) AS kernels,
            min(ts) AS first_ts, max(ts + dur) AS last_te, sum(dur) AS own_ns,
            count(stream) > 0 AND min(stream) = max(stream) AND bool_and(kind = 'kernel') AS one_stream,
            any_value(stream) AS stream
        FROM launched
        GROUP BY ALL
        HAVING count(*) >= COALESCE(getvariable('min_kernels'), 3))
), candidate AS (
    SELECT run_id, rank, root, kernel_names, count(*) AS occurrences
    FROM sequences
    GROUP BY run_id, rank, root, kernel_names
    HAVING count(*) >= COALESCE(getvariable('min_occurrences'), 10)
    QUALIFY row_number() OVER (PARTITION BY run_id, rank
                               ORDER BY count(*) * (len(kernel_names) - 1) DESC, root, kernel_names) = 1
), occurrences AS (
    SELECT s.* FROM sequences s
    JOIN candidate c ON c.run_id = s.run_id AND c.rank = s.rank AND c.root = s.root AND c.kernel_names = s.kernel_names
), fused AS (
    -- the occurrences that ran back to back on one stream: no other device work there between their first
    -- kernel's start and their last one's end
    SELECT o.run_id, o.rank, o.instance, o.root_id, any_value(o.ids) AS ids,
        any_value(o.last_te - o.first_ts) AS span_ns, any_value(o.own_ns) AS own_ns
    FROM occurrences o
    JOIN slices x ON x.run_id = o.run_id AND x.rank = o.rank AND x.stream = o.stream AND x.device_id IS NOT NULL
     AND x.ts >= o.first_ts AND x.ts < o.last_te
    WHERE o.one_stream
    GROUP BY ALL
    HAVING count(*) = len(any_value(o.ids))
), changes AS (
    -- the first kernel of each fused occurrence spans it at their summed time; the others go; the host calls
    -- that launched them take no time
    SELECT run_id, rank, instance, ids[1] AS id, span_ns AS dur, own_ns / span_ns AS scale, false AS dropped
    FROM fused
    UNION ALL
    SELECT run_id, rank, instance, unnest(ids[2:]), NULL, NULL, true FROM fused
    UNION ALL
    SELECT DISTINCT f.run_id, f.rank, f.instance, d.launch_id, NULL, 0.0, false
    FROM (SELECT run_id, rank, instance, unnest(ids[2:]) AS kernel_id FROM fused) f
    JOIN slices d ON d.run_id = f.run_id AND d.rank = f.rank AND d.slice_id = f.kernel_id
), graphs AS (
    -- (the lists of the steps fused only: critical_path_events() made every step's, 0.65 CPU-s at 24x)
    SELECT run_id, rank, instance, step, window_ts, window_te,
        critical_path_walk_events(events, NULL::DOUBLE[], NULL) AS events
    FROM critical_path_event_source()
    WHERE (run_id, rank, instance) IN (SELECT (run_id, rank, instance) FROM fused)
), changed AS (
    SELECT g.run_id, g.rank, g.instance,
        list(struct_update(g.e, dur := CAST(COALESCE(c.dur, g.e.dur) AS BIGINT),
                           scale := CAST(COALESCE(c.scale, g.e.scale) AS DOUBLE)) ORDER BY g.e.id) AS events
    FROM (SELECT run_id, rank, instance, unnest(events) AS e FROM graphs) g
    LEFT JOIN changes c ON c.run_id = g.run_id AND c.rank = g.rank AND c.instance = g.instance AND c.id = g.e.id
    WHERE NOT COALESCE(c.dropped, false)
    GROUP BY ALL
), priced AS (
    SELECT g.run_id, g.rank, g.instance, g.step,
        CAST(list_sum([s.dur_ns FOR s IN critical_path_walk(g.events, [{'rank': CAST(g.rank AS BIGINT), 'ts': g.window_ts, 'te': g.window_te}], NULL)]) AS BIGINT)
            AS replayed_ns,
        CAST(list_sum([s.dur_ns FOR s IN critical_path_walk(c.events, [{'rank': CAST(g.rank AS BIGINT), 'ts': g.window_ts, 'te': g.window_te}], 1.0)]) AS BIGINT)
            AS predicted_ns
    FROM graphs g
    JOIN changed c ON c.run_id = g.run_id AND c.rank = g.rank AND c.instance = g.instance
), in_step AS (
    SELECT o.run_id, o.rank, o.instance, any_value(o.root) AS root, any_value(len(o.kernel_names)) AS kernels,
        count(*) AS occurrences, count(f.root_id) AS fused, sum(o.own_ns) AS own_ns,
        COALESCE(sum(f.span_ns - f.own_ns), 0) AS gaps_ns
    FROM occurrences o
    LEFT JOIN fused f ON f.run_id = o.run_id AND f.rank = o.rank AND f.root_id = o.root_id
    GROUP BY ALL
), calls AS (
    SELECT c.run_id, c.rank, c.instance, count(*) AS calls, sum(l.dur) AS calls_ns
    FROM changes c
    JOIN slices l ON l.run_id = c.run_id AND l.rank = c.rank AND l.slice_id = c.id
    WHERE c.scale = 0
    GROUP BY ALL
)
SELECT p.run_id, p.rank, p.step, 'kernel_sequences' AS finding,
    printf('%s launches the same %d kernels %d times in the step (%.2f ms of kernels; %d times over the rank''s '
           || 'steps); fusing the %d that run back to back on one stream removes %.2f ms of gaps between their '
           || 'kernels and %d launch calls (%.2f ms): the step takes %.2f ms less of %.2f ms', s.root, s.kernels,
           s.occurrences, s.own_ns / 1e6, k.occurrences, s.fused, s.gaps_ns / 1e6, COALESCE(l.calls, 0),
           COALESCE(l.calls_ns, 0) / 1e6, (p.replayed_ns - p.predicted_ns) / 1e6, p.replayed_ns / 1e6) AS evidence,
    p.replayed_ns - p.predicted_ns AS saving_ns,
    round(100 * (p.replayed_ns - p.predicted_ns) / p.replayed_ns, 2) AS saving_pct,
    printf('tracesql query kernel_sequences %s -p ''operator=%s'' -p min_pattern_len=%d',
           COALESCE(getvariable('run'), 'RUN'), s.root, COALESCE(getvariable('min_kernels'), 3)) AS query
FROM priced p
JOIN in_step s ON s.run_id = p.run_id AND s.rank = p.rank AND s.instance = p.instance
JOIN candidate k ON k.run_id = p.run_id AND k.rank = p.rank
LEFT JOIN calls l ON l.run_id = p.run_id AND l.rank = p.rank AND l.instance = p.instance
WHERE 100 * (p.replayed_ns - p.predicted_ns) / p.replayed_ns >= COALESCE(getvariable('min_saving_pct'), 5);
