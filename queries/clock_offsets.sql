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
-- dominated by the clocks, not by the job. To remove them: `collectives` and `collective_stragglers` with
-- -p align_clocks=true, and `tracesql export --all-ranks` (by default), subtract each offset that exceeds its
-- uncertainty from the rank's times (rank_clock_offsets' shift_ns).
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
SELECT c.run_id, c.rank, c.via_rank, CAST(round(c.offset_ns) AS BIGINT) AS offset_ns,
    CAST(round(c.uncertainty_ns) AS BIGINT) AS uncertainty_ns, c.evidence,
    CASE WHEN abs(c.offset_ns) - c.uncertainty_ns > d.median_ns
         THEN format('offset {:.3f} ms exceeds the median collective duration {:.3f} ms: cross-rank times '
                     || 'are dominated by the clocks (-p align_clocks=true applies the offsets)',
                     c.offset_ns / 1e6, d.median_ns / 1e6)
    END AS warning
FROM rank_clock_offsets() c
LEFT JOIN (SELECT run_id, rank, median(COALESCE(device_dur, cpu_dur)) AS median_ns FROM collectives
           GROUP BY run_id, rank) d ON d.run_id = c.run_id AND d.rank = c.rank
ORDER BY c.run_id, c.rank;
