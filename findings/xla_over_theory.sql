-- xla_over_theory: Steps whose XLA matmuls, convolutions or collectives take far longer than their HLO says they need ("actual >> theory").
--
-- What TPU engineers do by hand, op by op: each execution's expected time from its HLO (xla_ops) and the rank's
-- device (device_peaks): a matmul or convolution (opcode dot or convolution, or a fusion or library call, e.g.
-- cudnn-conv or a cuBLAS GEMM, whose name or category says conv, dot, gemm or matmul, with FLOPs) at its
-- roofline, max(FLOPs / the dense peak of its operands' dtype, bytes accessed / memory bandwidth); a collective
-- at its size over the link, collective_time_ns(elements x dtype bytes of its sharded operand, kind, replica
-- group size, link bandwidth: nccl-tests' bus-bandwidth model). An op (program and HLO name) is flagged when its
-- executions' theory over the run is at most max_theory_pct % of their measured time. Priced by the what-if replay of each step (an XLA profile without steps: its profiled
-- range) with the flagged ops' device events made faster by as much as brings them, together, to their theory
-- (faster_pct = 100 - 100 x their theory / their measured time): the op at its theoretical time. Evidence: the
-- step's flagged executions, measured and theory, the worst op. An op whose dtype or device has no peak in
-- device_peaks (CPU; an f32 matmul on a TPU, whose MXU peak is bf16's) has no theory and is not rated.
--
-- Needs: XLA ops with HLO and FLOPs or collective sizes, a device in device_peaks
-- Parameters:
--   run = 'RUN'             text: the run as the user named it, for the query column's command
--   min_saving_pct = 5      number >= 0: fires when the fix saves at least this % of the step
--   max_theory_pct = 25     number > 0: ops whose theory is at most this % of their measured time are flagged
-- Columns:
--   run_id      VARCHAR  run
--   rank        INTEGER  rank
--   step        INTEGER  step
--   finding     VARCHAR  the rule that fired (its file's name)
--   evidence    VARCHAR  what it saw, with the numbers
--   saving_ns   BIGINT   step time the what-if replay says the fix saves (0 when it saves none)
--   saving_pct  DOUBLE   saving_ns in % of the step's replayed time
--   query       VARCHAR  the tracesql command that shows the evidence
-- The run's change, worked out first and kept as a value (a what-if regex given as a subquery is compiled for
-- every name it is matched against).
SET VARIABLE xla_over_theory_change = (
WITH rated AS (
    -- each device event of a matmul, convolution or collective, with its op's expected time
    SELECT x.*,
        CASE WHEN x.collective IS NOT NULL
             THEN collective_time_ns(
                      COALESCE(CASE WHEN x.collective = 'all_gather' THEN x.collective_out_elems END,
                               x.collective_in_elems) * dtype_bytes(x.collective_dtype),
                      x.collective, x.group_size, p.link_bytes_per_s)
             ELSE roofline_time_ns(x.flops, x.bytes_accessed, p.peak_flops_per_s, p.peak_bytes_per_s) END AS theory_ns
    FROM xla_window_ops() x
    JOIN rank_device_peaks() p ON p.run_id = x.run_id AND p.rank = x.rank
     AND p.dtype = COALESCE(op_dtype(x.operand_types), 'fp32')
    WHERE x.collective IS NOT NULL
       OR x.flops > 0 AND (x.opcode IN ('dot', 'convolution')
                           OR x.opcode IN ('fusion', 'custom-call')
                              AND regexp_matches(lower(x.name || ' ' || COALESCE(x.category, '')),
                                                 'conv|dot|gemm|matmul'))
), executions AS (
    -- each op execution: its device events' time, its theory once
    SELECT run_id, rank, instance, op_id, program_id, name, collective, list(DISTINCT event_name) AS events,
        sum(dur) AS measured_ns, max(theory_ns) AS theory_ns
    FROM rated GROUP BY ALL
), flagged AS (
    SELECT e.* FROM executions e
    JOIN (SELECT run_id, rank, program_id, name FROM executions WHERE theory_ns > 0 GROUP BY ALL
          HAVING 100 * sum(theory_ns) / sum(measured_ns) <= COALESCE(getvariable('max_theory_pct'), 25)) f
      ON f.run_id = e.run_id AND f.rank = e.rank AND f.program_id = e.program_id AND f.name = e.name
)
SELECT {'events': (SELECT '^(' || string_agg(DISTINCT regexp_escape(ev), '|' ORDER BY regexp_escape(ev)) || ')$'
                   FROM (SELECT unnest(events) AS ev FROM flagged)),
        'faster_pct': round(greatest(0, 100 - 100 * sum(theory_ns) / sum(measured_ns)), 2),
        'executions': list({'run_id': run_id, 'rank': rank, 'instance': instance, 'name': name,
                            'collective': collective, 'measured_ns': measured_ns, 'theory_ns': theory_ns})}
FROM flagged);

WITH flagged AS (
    SELECT unnest(getvariable('xla_over_theory_change').executions, recursive := true)
), priced AS (
    SELECT * FROM what_if(faster := getvariable('xla_over_theory_change').events,
                          faster_pct := getvariable('xla_over_theory_change').faster_pct)
    -- (no op over its theory in the run: no replay)
    WHERE getvariable('xla_over_theory_change').events IS NOT NULL
), in_step AS (
    SELECT run_id, rank, instance, count(*) AS executions, count(DISTINCT name) AS ops,
        count(*) FILTER (WHERE collective IS NOT NULL) AS collectives, sum(measured_ns) AS measured_ns,
        sum(theory_ns) AS theory_ns, arg_max(name, measured_ns / theory_ns) AS worst,
        max(measured_ns / theory_ns) AS worst_ratio
    FROM flagged GROUP BY ALL
)
SELECT p.run_id, p.rank, p.step, 'xla_over_theory' AS finding,
    printf('%d executions of %d ops (%d collectives) take %.2f ms where their HLO shapes need %.2f ms (%.1fx); at '
           || 'their theory (%.2f %% faster) the step takes %.2f ms less of %.2f ms; worst %s at %.1fx its theory',
           s.executions, s.ops, s.collectives, s.measured_ns / 1e6, s.theory_ns / 1e6, s.measured_ns / s.theory_ns,
           getvariable('xla_over_theory_change').faster_pct, p.saving_ns / 1e6, p.replayed_ns / 1e6, s.worst,
           s.worst_ratio) AS evidence,
    p.saving_ns, p.saving_pct,
    printf('tracesql query what_if %s -p ''faster=%s'' -p faster_pct=%s -p rank=%d -p instance=%d',
           COALESCE(getvariable('run'), 'RUN'), getvariable('xla_over_theory_change').events,
           CAST(getvariable('xla_over_theory_change').faster_pct AS VARCHAR), p.rank, p.instance) AS query
FROM priced p
JOIN in_step s ON s.run_id = p.run_id AND s.rank = p.rank AND s.instance = p.instance
WHERE p.saving_pct >= COALESCE(getvariable('min_saving_pct'), 5);
