-- kernel_sequences: The kernel sequences an operator launches, grouped into patterns and ranked by how often they repeat (HTA's frequent CUDA kernel sequences; fusion candidates).
--
-- Roots are the host events whose name contains `operator` (HTA's rule; '' = every host event), at the
-- shallowest nesting depth any of them has, that launched at least min_pattern_len device events (kernels,
-- copies, memsets) from inside them on their thread. A root's pattern is its name followed by the names of the
-- device events it launched, in the order they ran on the device. Patterns that repeat many times with many short
-- kernels are candidates for fusion (torch.compile, a fused kernel) or CUDA graphs. Sorted by occurrences, then
-- pattern, as HTA sorts them; equal to HTA 0.5's get_frequent_cuda_kernel_sequences on HTA's test traces where
-- HTA's call graph keeps each kernel under the op that launched it (see docs/guides/hta.md for the traces where
-- it does not).
--
-- Needs: host operators with the device work they launched (correlation ids)
-- Parameters:
--   operator = ''            text: a part of the launching events' names (e.g. aten::linear); '' = any
--   min_pattern_len = 3      integer >= 1: roots launching fewer device events are left out
--   top = 0                  integer >= 0: patterns per rank, most frequent first (0 = all)
--   analysis_window = 'all'  one of all, hta: 'all' device work, or 'hta' (launched before the last ProfilerStep began)
-- Columns:
--   run_id         VARCHAR    run
--   rank           INTEGER    rank
--   pattern_rank   BIGINT     1 = the most frequent pattern of the rank
--   root           VARCHAR    name of the launching event
--   occurrences    BIGINT     how many roots launched exactly this sequence
--   kernels        BIGINT     device events in the sequence
--   kernel_ns      BIGINT     summed duration of the sequence's device events over its occurrences
--   root_ns        BIGINT     summed duration of the roots over its occurrences
--   pattern        VARCHAR    root and device event names joined with '|' (HTA's pattern string)
--   kernel_names   VARCHAR[]  the sequence's device event names, in order
WITH cutoff AS (
    -- analysis_window 'hta': HTA keeps the host events that start before the last ProfilerStep began, and the
    -- device work they launched (when the trace names at least two steps)
    SELECT run_id, rank, max(ts) AS last_start FROM steps
    WHERE COALESCE(getvariable('analysis_window'), 'all') = 'hta' AND rule = 'profiler_step'
    GROUP BY run_id, rank HAVING count(*) >= 2
), candidates AS NOT MATERIALIZED (
    -- read twice, not materialized: first a few columns of every host event for the shallowest depth (no name
    -- when operator is '', no start when analysis_window is 'all'), then the roots' other columns, for the rows
    -- of that depth only (DuckDB filters the scan by the depth the join found)
    SELECT s.run_id, s.rank, s.slice_id, s.name, s.ts, s.dur, s.pid, s.tid, s.depth, c.last_start
    FROM slices s LEFT JOIN cutoff c ON c.run_id = s.run_id AND c.rank = s.rank
    WHERE s.device_id IS NULL AND s.dur > 0
      AND (COALESCE(getvariable('operator'), '') = '' OR contains(s.name, COALESCE(getvariable('operator'), '')))
      AND (COALESCE(getvariable('analysis_window'), 'all') <> 'hta' OR c.last_start IS NULL OR s.ts < c.last_start)
), shallowest AS (
    -- the roots: the candidates at the shallowest depth any of them has
    SELECT c.* FROM candidates c
    JOIN (SELECT run_id, rank, min(depth) AS depth FROM candidates GROUP BY run_id, rank) s
      ON s.run_id = c.run_id AND s.rank = c.rank AND s.depth = c.depth
), buckets AS (
    -- each root once per time bucket it touches (width: the roots' mean length), so that a launch finds the roots
    -- that hold it by an equi-join on (thread, bucket) and a check of the few roots of its bucket, where a range
    -- join compared it with every root of its thread. (unnest in the select list: range() as a lateral table
    -- costs DuckDB a join of the buckets back onto the roots)
    SELECT *, unnest(range(ts // width, (ts + dur) // width + 1)) AS bucket
    FROM (SELECT *, CAST(greatest(avg(dur) OVER (), 1) AS BIGINT) AS width FROM shallowest)
), launched AS (
    -- each root with the device events launched from inside it on its thread (kernels, copies, memsets and the
    -- device side of stream waits; slices.launch_*: their launching runtime or driver call's start and thread)
    SELECT c.run_id, c.rank, c.slice_id AS root_id, c.name AS root, c.dur AS root_dur,
           d.name AS kernel, d.ts AS kernel_ts, d.slice_id AS kernel_id, d.dur AS kernel_dur
    FROM (SELECT d.*, d.launch_ts // x.width AS bucket
          FROM slices d CROSS JOIN (SELECT max(width) AS width FROM buckets) x
          WHERE d.device_id IS NOT NULL AND d.launch_ts IS NOT NULL) d
    JOIN buckets c ON c.run_id = d.run_id AND c.rank = d.rank AND c.pid = d.launch_pid AND c.tid = d.launch_tid
                  AND c.bucket = d.bucket AND d.launch_ts >= c.ts AND d.launch_ts <= c.ts + c.dur
                  AND (c.last_start IS NULL OR d.launch_ts < c.last_start)
), dictionary AS (
    -- the launched device events' names by their hashes: the roots' sequences are lists of these hashes (listing,
    -- grouping and ranking the names themselves cost more than half of the query), and the names are put back
    -- once per distinct sequence (a map fails on two names of one hash)
    SELECT map(list(hash(name)), list(name)) AS names
    FROM (SELECT DISTINCT name FROM slices WHERE device_id IS NOT NULL AND launch_ts IS NOT NULL)
), roots AS (
    SELECT run_id, rank, root_id, any_value(root) AS root, any_value(root_dur) AS root_dur,
           list(hash(kernel) ORDER BY kernel_ts, kernel_id) AS sequence, sum(kernel_dur) AS kernel_dur
    FROM launched
    GROUP BY run_id, rank, root_id
    HAVING count(*) >= COALESCE(getvariable('min_pattern_len'), 3)
), patterns AS (
    SELECT run_id, rank, root, sequence, count(*) AS occurrences, len(sequence) AS kernels,
           CAST(sum(kernel_dur) AS BIGINT) AS kernel_ns, CAST(sum(root_dur) AS BIGINT) AS root_ns
    FROM roots GROUP BY run_id, rank, root, sequence
), sequences AS (
    -- each distinct sequence's names once (many patterns share one: every ProfilerStep#N launches the same
    -- kernels), as a list and joined with '|'
    SELECT sequence, kernel_names, joined, left(joined, 200) AS lead
    FROM (SELECT *, array_to_string(kernel_names, '|') AS joined
          FROM (SELECT s.sequence, list_transform(s.sequence, lambda h: d.names[h]) AS kernel_names
                FROM (SELECT DISTINCT sequence FROM patterns) s CROSS JOIN dictionary d))
), ranked AS (
    -- by occurrences, then pattern: patterns of different heads (a pattern's first 200 characters) are in their
    -- heads' order, and the whole pattern string is made only for those of equal heads (q joins only them: the
    -- wide strings, 47 MB at df_index_resolver x24, are not sorted)
    SELECT t.run_id, t.rank, t.root, t.sequence, t.occurrences, t.kernels, t.kernel_ns, t.root_ns,
           row_number() OVER (PARTITION BY t.run_id, t.rank
                              ORDER BY t.occurrences DESC, t.head, t.root || '|' || q.joined) AS pattern_rank
    FROM (SELECT *, count(*) OVER (PARTITION BY run_id, rank, occurrences, head) AS ties
          FROM (SELECT p.*, left(p.root || '|' || q.lead, 200) AS head
                FROM patterns p JOIN sequences q ON q.sequence = p.sequence)) t
    LEFT JOIN sequences q ON t.ties > 1 AND q.sequence = t.sequence
)
SELECT r.run_id, r.rank, r.pattern_rank, r.root, r.occurrences, r.kernels, r.kernel_ns, r.root_ns,
       r.root || '|' || q.joined AS pattern, q.kernel_names
FROM ranked r JOIN sequences q ON q.sequence = r.sequence
WHERE COALESCE(getvariable('top'), 0) = 0 OR r.pattern_rank <= COALESCE(getvariable('top'), 0)
ORDER BY r.run_id, r.rank, r.pattern_rank
