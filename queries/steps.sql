-- steps: Each step on each rank: host (CPU) and device duration, how it compares across steps, and the slowest rank.
--
-- A step is a `steps` row: a ProfilerStep#N range, or an inference iteration (vLLM, SGLang, --step-pattern; see
-- `iterations` for their phases and tokens). cpu_ns = the host range's duration; device_ns = the step's
-- device window (`steps.device_dur`): from its first device event to the next step's first (the last step: to
-- its last event), so windows of consecutive steps never overlap (docs/concepts/steps.md); NULL when the step
-- has no device work. Per rank, across its steps: mean, p50, p90 of both. Per step, across ranks:
-- slowest_rank (longest device_ns, else cpu_ns) and skew_ns = longest − shortest duration among the ranks.
--
-- Needs: step ranges: ProfilerStep (profiler schedule / prof.step()), vLLM / SGLang iterations, or --step-pattern
-- Columns:
--   run_id          VARCHAR  run
--   step            INTEGER  step number
--   rank            INTEGER  rank
--   cpu_ns          BIGINT   host duration of the step
--   device_ns       BIGINT   device duration of the step (NULL without device events)
--   kernel_count    BIGINT   device events launched in the step
--   cpu_mean_ns     DOUBLE   this rank's mean cpu_ns over its steps
--   cpu_p50_ns      DOUBLE   median
--   cpu_p90_ns      DOUBLE   90th percentile
--   device_mean_ns  DOUBLE   this rank's mean device_ns over its steps
--   device_p50_ns   DOUBLE   median
--   device_p90_ns   DOUBLE   90th percentile
--   slowest_rank    INTEGER  the rank with the longest step (device_ns, else cpu_ns) in this step (ties: the lowest rank)
--   skew_ns         BIGINT   longest − shortest step duration among the ranks in this step
WITH per_step AS (
    SELECT run_id, step, rank, dur AS cpu_ns, device_dur AS device_ns, kernel_count,
        COALESCE(device_dur, dur) AS step_ns
    FROM steps
)
SELECT run_id, step, rank, cpu_ns, device_ns, kernel_count,
    avg(cpu_ns) OVER by_rank AS cpu_mean_ns,
    quantile_cont(cpu_ns, 0.5) OVER by_rank AS cpu_p50_ns,
    quantile_cont(cpu_ns, 0.9) OVER by_rank AS cpu_p90_ns,
    avg(device_ns) OVER by_rank AS device_mean_ns,
    quantile_cont(device_ns, 0.5) OVER by_rank AS device_p50_ns,
    quantile_cont(device_ns, 0.9) OVER by_rank AS device_p90_ns,
    arg_max(rank, (step_ns, -rank)) OVER by_step AS slowest_rank,
    max(step_ns) OVER by_step - min(step_ns) OVER by_step AS skew_ns
FROM per_step
WINDOW by_rank AS (PARTITION BY run_id, rank), by_step AS (PARTITION BY run_id, step)
ORDER BY run_id, step, rank;
