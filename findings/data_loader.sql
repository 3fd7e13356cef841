-- data_loader: Steps that wait for their input: data loading on the step's path.
--
-- Priced by the what-if replay of each step with its data-loading ops and ranges taking no time (the what_if
-- query's faster = the names of data_loading_pattern(), e.g. PyTorch's annotation
-- enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__, whose own Python time counts; faster_pct = 100):
-- the time the step waited for its batch. Evidence: those ops and ranges in the step and their time. The fix:
-- more DataLoader workers, pinned memory, prefetching, or a faster input pipeline.
--
-- Needs: host ops named as data loading (PyTorch's DataLoader ranges) and the device work the step launched
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
    SELECT * FROM what_if(faster := data_loading_pattern(), faster_pct := 100)
), fired AS MATERIALIZED (
    -- the steps where it fires: the evidence is gathered of those only (of every step it took 0.3-1.3 s
    -- a rule at 24x, where none fires)
    SELECT * FROM priced WHERE saving_pct >= COALESCE(getvariable('min_saving_pct'), 5)
), windows AS (
    SELECT w.* FROM critical_path_windows() w
    SEMI JOIN fired f ON f.run_id = w.run_id AND f.rank = w.rank AND f.instance = w.instance
), loading AS (
    SELECT w.run_id, w.rank, w.instance, count(*) AS calls, sum(h.dur) AS total_ns, arg_max(h.name, h.dur) AS longest
    FROM windows w
    JOIN slices h ON h.run_id = w.run_id AND h.rank = w.rank AND h.ts BETWEEN w.ts AND w.te
    WHERE h.device_id IS NULL AND regexp_matches(h.name, data_loading_pattern())
    GROUP BY ALL
)
SELECT p.run_id, p.rank, p.step, 'data_loader' AS finding,
    printf('without data loading the step takes %.2f ms less of %.2f ms: %d data-loading calls take %.2f ms '
           || '(longest %s); input is %.0f %% of the critical path', p.saving_ns / 1e6, p.replayed_ns / 1e6,
           l.calls, l.total_ns / 1e6, l.longest, 100 * p.input_share) AS evidence,
    p.saving_ns, p.saving_pct,
    printf('tracesql query what_if %s -p ''faster=%s'' -p faster_pct=100 -p rank=%d -p instance=%d',
           COALESCE(getvariable('run'), 'RUN'), data_loading_pattern(), p.rank, p.instance) AS query
FROM fired p
JOIN loading l ON l.run_id = p.run_id AND l.rank = p.rank AND l.instance = p.instance;
