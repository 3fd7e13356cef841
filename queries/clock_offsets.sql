-- clock_offsets: Each rank's clock offset from the lowest rank's, from the send/recv pairs that must line up, with the evidence.
--
-- A transfer cannot complete before it was sent: for each send/recv pair (matched as in `collectives`:
-- p2p_match_key) the receiver's completion (the end of its recv kernels; on the host, the end of the backend's
-- transfer annotation that starts in the recv call, such as gloo:recv, else the call's end) minus the sender's
-- start bounds (receiver's clock − sender's clock) from above. Transfers both ways between two ranks bound the
-- difference of their clocks from both sides; the estimate is the middle of the tightest bounds and
-- uncertainty_ns half their width (a negative width: bounds that contradict each other, e.g. clocks that drift
-- over the trace). Ranks are chained to the lowest rank through their lowest linked rank (a pipeline: through
-- the stages between), adding up the differences and uncertainties. warning says when an offset exceeds the
-- median duration of the rank's collective calls by more than its uncertainty: then skews and the merged timeline across those ranks are
-- dominated by the clocks, not by the job.
--
-- Needs: send/recv pairs in both directions between ranks (a pipeline-parallel trace)
-- Columns:
--   run_id          VARCHAR  run
--   rank            INTEGER  rank
--   via_rank        INTEGER  the rank its offset was measured against (NULL for the reference)
--   offset_ns       BIGINT   this rank's clock − the reference rank's clock (the lowest rank: 0)
--   uncertainty_ns  BIGINT   half the width of the bounds, summed along the chain
--   evidence        BIGINT   send/recv pairs used, summed along the chain
--   warning         VARCHAR  offset (less its uncertainty) larger than the rank's median collective duration; NULL otherwise
WITH RECURSIVE calls AS (
    SELECT * FROM collective_calls() WHERE src_rank IS NOT NULL
), transfer_ends AS (  -- host recv calls: the end of the transfer annotation that starts inside the call
    SELECT c.run_id, c.rank, c.collective_id, max(s.ts + s.dur) AS done
    FROM calls c JOIN slices s ON s.run_id = c.run_id AND s.rank = c.rank AND s.kind = 'user_annotation'
     AND collective_kind(s.name) = 'recv' AND s.ts >= c.cpu_ts AND s.ts <= c.cpu_ts + c.cpu_dur
    WHERE c.collective = 'recv' AND c.device_ts IS NULL
    GROUP BY c.run_id, c.rank, c.collective_id
), pairs AS (
    SELECT s.run_id, s.rank AS src, r.rank AS dst,
        COALESCE(r.device_ts + r.device_dur, e.done, r.cpu_ts + r.cpu_dur) - COALESCE(s.device_ts, s.cpu_ts)
            AS bound_ns  -- dst clock − src clock <= bound_ns
    FROM calls s JOIN calls r ON r.run_id = s.run_id AND r.match_key = s.match_key AND r.collective = 'recv'
    LEFT JOIN transfer_ends e ON e.run_id = r.run_id AND e.rank = r.rank AND e.collective_id = r.collective_id
    WHERE s.collective = 'send'
), links AS (  -- per rank pair (lo < hi): bounds on hi's clock − lo's clock
    SELECT run_id, least(src, dst) AS lo, greatest(src, dst) AS hi,
        min(bound_ns) FILTER (WHERE dst > src) AS upper_ns, -min(bound_ns) FILTER (WHERE dst < src) AS lower_ns,
        count(*) AS evidence
    FROM pairs GROUP BY run_id, lo, hi
    HAVING upper_ns IS NOT NULL AND lower_ns IS NOT NULL
), parents AS (  -- each rank's lowest linked rank below it
    SELECT run_id, hi AS rank, arg_min(lo, lo) AS via_rank, arg_min((upper_ns + lower_ns) / 2, lo) AS diff_ns,
        arg_min((upper_ns - lower_ns) / 2, lo) AS half_ns, arg_min(evidence, lo) AS evidence
    FROM links GROUP BY run_id, hi
), chained AS (
    SELECT run_id, rank, CAST(NULL AS INTEGER) AS via_rank, 0::DOUBLE AS offset_ns, 0::DOUBLE AS uncertainty_ns,
        0::BIGINT AS evidence
    FROM (SELECT run_id, min(lo) AS rank FROM links GROUP BY run_id)
    UNION ALL
    SELECT p.run_id, p.rank, p.via_rank, c.offset_ns + p.diff_ns, c.uncertainty_ns + p.half_ns,
        c.evidence + p.evidence
    FROM chained c JOIN parents p ON p.run_id = c.run_id AND p.via_rank = c.rank
)
SELECT c.run_id, c.rank, c.via_rank, CAST(round(c.offset_ns) AS BIGINT) AS offset_ns,
    CAST(round(c.uncertainty_ns) AS BIGINT) AS uncertainty_ns, c.evidence,
    CASE WHEN abs(c.offset_ns) - c.uncertainty_ns > d.median_ns
         THEN format('offset {:.3f} ms exceeds the median collective duration {:.3f} ms: cross-rank times '
                     || 'are dominated by the clocks', c.offset_ns / 1e6, d.median_ns / 1e6)
    END AS warning
FROM chained c
LEFT JOIN (SELECT run_id, rank, median(COALESCE(device_dur, cpu_dur)) AS median_ns FROM collectives
           GROUP BY run_id, rank) d ON d.run_id = c.run_id AND d.rank = c.rank
ORDER BY c.run_id, c.rank;
