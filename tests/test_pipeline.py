"""Pipeline parallelism on real traces (torch.distributed.pipelining over gloo, datasets/torch_pipeline_*): send/recv
paired by peer, and the `pipeline` query's stages, bubbles and limiting stage, checked against the raw JSON."""
from __future__ import annotations

import gzip
import json
import re

import pytest

import tracesql
from conftest import DATASETS

pytestmark = pytest.mark.slow  # each ingests a 2-4 rank run first (~3 CPU s each)

GPIPE = DATASETS / "torch_pipeline_gpipe_4stage"
SLOW = DATASETS / "torch_pipeline_1f1b_4stage_slow2"
INTERLEAVED = DATASETS / "torch_pipeline_interleaved_2rank"


def events(folder, rank):
    return json.loads(gzip.open(folder / f"rank-{rank}.pt.trace.json.gz").read())["traceEvents"]


def raw_p2p(folder, ranks):
    """(src, dst) -> transfers, from each rank's c10d::send (dstRank) and c10d::recv_ (srcRank) in the raw JSON."""
    sends, recvs = {}, {}
    for r in ranks:
        for e in events(folder, r):
            if e.get("name") in ("c10d::send", "c10d::recv_"):
                peer = int(e["args"]["Concrete Inputs"][2])
                pair, into = ((r, peer), sends) if e["name"] == "c10d::send" else ((peer, r), recvs)
                into[pair] = into.get(pair, 0) + 1
    return sends, recvs


def test_send_recv_paired_by_peer(ingested):
    got = tracesql.query("collectives", ingested(GPIPE))
    sends, recvs = raw_p2p(GPIPE, range(4))
    assert sends == recvs and sum(sends.values()) == 48  # every send has its recv: 48 transfers
    pairs = got[got.src_rank.notna()]
    assert len(pairs) == len(got) == 48 and (pairs.ranks_seen == 2).all() and pairs.consistent.all()
    counted = pairs.groupby(["src_rank", "dst_rank"]).size().to_dict()
    assert counted == sends and set(sends) == {(0, 1), (1, 2), (2, 3), (1, 0), (2, 1), (3, 2)}
    assert all(sorted(r) == sorted([s, d]) for r, s, d in zip(pairs.ranks, pairs.src_rank, pairs.dst_rank))


def test_unbalanced_stage_is_the_limit(ingested):
    """Stage 2 does 3x the work: it computes longest, so it limits every step, and is the straggler of the pairs."""
    got = tracesql.query("pipeline", ingested(SLOW))
    assert set(got.step) == {2, 3} and (got.stages == 4).all() and (got.microbatches == 8).all()
    assert (got.microbatches_from == "sends").all()  # 1F1B records no schedule ranges: counted on the first link
    assert list(got[got.step == 2].sort_values("stage")["rank"]) == [0, 1, 2, 3]
    limit = got[got.limiting]
    assert list(limit["rank"]) == [2, 2]
    for step, rows in got.groupby("step"):
        s2 = rows.set_index("rank").loc[2]
        others = rows[rows["rank"] != 2]
        assert s2.compute_ns > 1.2 * others.compute_ns.max() and s2.imbalance_ns == 0
        assert s2.bubble_pct < others.bubble_pct.min()  # the limit idles least
    assert got.ideal_bubble_pct.round(6).eq(round(100 * 3 / 11, 6)).all()
    assert got.zero_bubble_pct.round(6).eq(round(100 * 3 / 27, 6)).all()
    st = tracesql.query("collective_stragglers", ingested(SLOW))
    assert st.iloc[0]["rank"] == 2


def test_pipeline_bubbles_finding_prices_the_limiting_stage(ingested):
    """The pipeline_bubbles rule on the unbalanced 1F1B job: both steps idle far above 1F1B's ideal (3/11), the
    limiting stage 2 (rank 2) is named, and its saving is the what-if's with rank 2's host compute at the others'
    median (straggler_to_median, host ops' own time) = the pipeline query's compute of stage 2 minus the median
    stage's (the union of its busy intervals: a second measure of the same time), within 0.1 ms."""
    from tracesql import findings

    con = tracesql.connect(ingested(SLOW))
    rule = next(r for r in findings.catalogue() if r.name == "pipeline_bubbles")
    found = tracesql.queries.run(con, rule, {"run": "RUN"}).df().set_index("step").sort_index()  # rows come unordered
    assert list(found["rank"]) == [2, 2]
    stages = con.sql("SELECT * FROM pipeline_stages()").df()
    for step, rows in stages.groupby("step"):
        median = sorted(rows.compute_ns)[1]  # of the 3 other stages
        assert found.loc[step, "saving_ns"] == pytest.approx(rows.compute_ns.max() - median, abs=100_000)
        assert f"the schedule's ideal {100 * 3 / 11:.1f} %" in found.loc[step, "evidence"]
    assert found.saving_ns.tolist() == [158_773_131, 250_259_974]
    assert (found["query"] == "tracesql query pipeline RUN").all()


def test_idle_decompositions_add_up_and_compute_matches_the_json(ingested):
    """Both splits of idle add up exactly; a stage's compute is the union of its host ops other than c10d calls
    inside its ProfilerStep, recomputed here from the raw JSON."""
    got = tracesql.query("pipeline", ingested(GPIPE))
    # read from GPipe's "Forward i" ranges (stage 0's four sends to stage 1 per step say the same)
    forwards = {e["name"] for e in events(GPIPE, 0) if re.fullmatch(r"Forward \d+", e.get("name", ""))}
    assert len(forwards) == 4 and (got.microbatches == 4).all() and (got.microbatches_from == "trace").all()
    idle = got.window_ns - got.compute_ns
    assert (got.idle_ns == idle).all()
    assert (got.warmup_ns + got.p2p_blocked_ns + got.cooldown_ns + got.other_idle_ns == idle).all()
    assert (got.schedule_ns + got.imbalance_ns + got.overhead_ns == idle).all()
    assert (got[["warmup_ns", "p2p_blocked_ns", "cooldown_ns"]] >= 0).all().all()
    assert got.ideal_bubble_pct.round(6).eq(round(100 * 3 / 7, 6)).all()
    row = got[(got["rank"] == 1) & (got.step == 3)].iloc[0]
    ev = events(GPIPE, 1)
    step = next(e for e in ev if e.get("name") == "ProfilerStep#3")
    lo, hi = step["ts"] * 1000, (step["ts"] + step["dur"]) * 1000
    spans = sorted((max(e["ts"] * 1000, lo), min((e["ts"] + e["dur"]) * 1000, hi)) for e in ev
                   if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e["dur"] > 0
                   and not e["name"].startswith("c10d::") and e["ts"] * 1000 < hi and (e["ts"] + e["dur"]) * 1000 > lo)
    union, end = 0.0, None
    for a, b in spans:
        if end is None or a > end:
            union, end = union + (b - a), b
        elif b > end:
            union, end = union + (b - end), b
    assert row.compute_ns == pytest.approx(union, abs=len(spans))  # ns rounding of the µs timestamps


def test_interleaved_chunks(ingested):
    """Interleaved 1F1B, 2 ranks × 2 chunks: the schedule's ranges PP:<stage>F<microbatch> name stages 0 and 2 on
    rank 0 and microbatches 0-3, so v = 2 and m = 4 with no parameter, and the ideal bubble is
    (p − 1) / (v·m + p − 1) = 1/9. The sends say the same: rank 0 sends 2·4 activations and 4 gradients to rank 1
    per step, m = 12 / (v + v − 1) = 4. Parameters override what the trace says."""
    run = ingested(INTERLEAVED)
    names = {e["name"] for e in events(INTERLEAVED, 0) if re.fullmatch(r"PP:\d+F\d+", e.get("name", ""))}
    assert names == {f"PP:{s}F{m}" for s in (0, 2) for m in range(4)}
    got = tracesql.query("pipeline", run)
    assert (got.microbatches == 4).all() and (got.chunks == 2).all() and (got.stages == 2).all()
    assert (got.microbatches_from == "trace").all()
    assert got.ideal_bubble_pct.round(6).eq(round(100 / 9, 6)).all()
    assert got.groupby("step").limiting.sum().eq(1).all()
    forced = tracesql.query("pipeline", run, chunks=1, microbatches=6)
    assert (forced.microbatches_from == "parameter").all() and (forced.chunks == 1).all()
    assert forced.ideal_bubble_pct.round(6).eq(round(100 / 7, 6)).all()


SHIFT_US = 5000.0


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    """The GPipe run with rank 1's trace shifted by +5 ms (all four ranks ran on one host: one clock)."""
    folder = tmp_path_factory.mktemp("shifted") / "traces"
    folder.mkdir()
    for r in range(4):
        data = json.loads(gzip.open(GPIPE / f"rank-{r}.pt.trace.json.gz").read())
        if r == 1:
            for e in data["traceEvents"]:
                if "ts" in e:
                    e["ts"] += SHIFT_US
        (folder / f"rank-{r}.pt.trace.json").write_text(json.dumps(data))
    run = folder.parent / "run"
    tracesql.ingest([folder], run)
    return run


def test_clock_offset_of_a_shifted_rank_is_recovered(ingested, shifted):
    """Rank 1's offset comes out 5 ms within 0.2 ms; the ranks measured through it keep theirs."""
    before = tracesql.query("clock_offsets", ingested(GPIPE)).set_index("rank")
    assert abs(before.loc[1].offset_ns) < 200_000 and before.loc[1].uncertainty_ns < 200_000
    assert before.loc[1].evidence == 16 and before.loc[1].via_rank == 0
    after = tracesql.query("clock_offsets", shifted).set_index("rank")
    assert after.loc[1].offset_ns == pytest.approx(SHIFT_US * 1000, abs=200_000)
    assert after.loc[1].offset_ns - before.loc[1].offset_ns == pytest.approx(SHIFT_US * 1000, abs=1)
    assert list(after.loc[[2, 3]].offset_ns) == list(before.loc[[2, 3]].offset_ns)


def test_aligned_clocks_give_the_unshifted_skews(ingested, shifted):
    """The shift is flagged (5 ms exceeds rank 1's send/recv calls), and with align_clocks=true the shifted run's
    stragglers and pair skews are the unshifted run's again, within 0.2 ms; as recorded, rank 1 is 5 ms off."""
    offsets = tracesql.query("clock_offsets", shifted).set_index("rank")
    assert offsets.loc[1].warning.startswith("offset 4.9") and offsets.loc[[0, 2, 3]].warning.isna().all()
    assert tracesql.query("clock_offsets", ingested(GPIPE)).warning.isna().all()

    def lateness(run, **params):
        got = tracesql.query("collective_stragglers", run, **params).set_index("rank")
        return got[["instances", "mean_lateness_ns", "max_lateness_ns"]]

    truth, recorded, aligned = lateness(ingested(GPIPE)), lateness(shifted), lateness(shifted, align_clocks=True)
    assert (aligned.instances == truth.instances).all() and (truth.instances >= 16).all()
    assert ((aligned.mean_lateness_ns - truth.mean_lateness_ns).abs() < 200_000).all()
    assert ((aligned.max_lateness_ns - truth.max_lateness_ns).abs() < 200_000).all()
    assert (recorded.max_lateness_ns - truth.max_lateness_ns).abs().max() > 4_000_000

    def skews(run, **params):
        got = tracesql.query("collectives", run, **params)
        return got.set_index(["src_rank", "dst_rank", "seq"]).sort_index()
    truth, aligned = skews(ingested(GPIPE)), skews(shifted, align_clocks="true")
    assert len(truth) == len(aligned) == 48 and (truth.ranks.map(tuple) == aligned.ranks.map(tuple)).all()
    gap = [abs(a - b) for ta, tb in zip(truth.start_skew_ns, aligned.start_skew_ns) for a, b in zip(ta, tb)]
    assert max(gap) < 200_000


def test_all_ranks_export_one_process_per_rank_aligned_and_linked(ingested, shifted, tmp_path):
    """--all-ranks on the shifted run, step 3, read back with the perfetto package's protos: a process per rank,
    rank 1 moved back onto the others' clock (its sends where the unshifted trace has them, within 0.2 ms), one
    flow per send/recv pair of the step from one rank's call to the other's."""
    from tracesql.export import export_all_ranks, read

    result = export_all_ranks(shifted, tmp_path / "all.pftrace", step=3)
    assert set(result.offsets) == {1} and result.offsets[1] == pytest.approx(SHIFT_US * 1000, abs=200_000)
    tracks, owner, begins, open_ = {}, {}, [], {}
    for p in read(tmp_path / "all.pftrace"):
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            tracks[d.uuid] = d
            owner[d.uuid] = p.trusted_packet_sequence_id
        elif p.track_event.type == p.track_event.TYPE_SLICE_BEGIN and p.track_event.categories[0] != "tracesql":
            begins.append((owner[p.track_event.track_uuid] - 1, p.timestamp, p.track_event))
    processes = sorted(d.process.process_name for d in tracks.values() if d.HasField("process"))
    assert processes == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert len(begins) == sum(part.slices for part in result.parts)
    sends = [(r, ts) for r, ts, e in begins if e.name == "c10d::send" and r == 1]
    con = tracesql.connect(ingested(GPIPE))
    original = [t for (t,) in con.execute("SELECT ts FROM slices WHERE rank = 1 AND name = 'c10d::send' AND step = 3 "
                                          "ORDER BY ts").fetchall()]
    assert len(sends) == len(original) == 8
    assert all(abs(ts - o) < 200_000 for (_, ts), o in zip(sorted(sends), original))
    outs = {f: r for r, _, e in begins for f in e.flow_ids if f >= 1 << 62}
    ins = {f: r for r, _, e in begins for f in e.terminating_flow_ids if f >= 1 << 62}
    assert outs.keys() == ins.keys() and len(outs) == result.links
    assert all(outs[f] != ins[f] for f in outs)  # each links two ranks
    pairs = tracesql.query("collectives", shifted)
    assert result.links == len(pairs[pairs.step == 3]) == 24


def test_comm_matrix_pairs_and_rings(ingested):
    """Send/recv links carry the bytes of the raw trace's sends (Input Dims × 4 bytes of gloo:send's float); the
    ring collectives of the 4-rank gloo run put (n − 1)/n of each reduce_scatter/all_gather (2(n − 1)/n of an
    all_reduce) on each next-rank link and size/n of an all_to_all on every link, as the collectives query's
    instances say."""
    got = tracesql.query("comm_matrix", ingested(GPIPE)).set_index(["src_rank", "dst_rank"])
    expect: dict = {}
    for r in range(4):
        for e in events(GPIPE, r):
            if e.get("name") == "c10d::send":
                (dims,) = e["args"]["Input Dims"][0]
                key = (r, int(e["args"]["Concrete Inputs"][2]))
                expect[key] = expect.get(key, 0) + dims[0] * dims[1] * 4
    assert got.p2p_bytes.to_dict() == expect and (got.collective_bytes == 0).all()
    assert (got.transfers == 8).all() and got.slowest.sum() == 1
    assert got[got.slowest].gbps.iloc[0] == got.gbps.min()

    gloo = DATASETS / "torch_gloo_4rank_straggler"
    matrix = tracesql.query("comm_matrix", ingested(gloo)).set_index(["src_rank", "dst_rank"])
    inst = tracesql.query("collectives", ingested(gloo))
    inst = inst[inst.size_bytes.notna() & (inst.ranks_seen >= 2)]
    factor = {"all_reduce": 2 * 3 / 4, "all_gather": 3 / 4, "reduce_scatter": 3 / 4}
    ring = sum(round(s * factor[c]) for c, s in zip(inst.collective, inst.size_bytes) if c in factor)
    a2a = sum(round(s / 4) for c, s in zip(inst.collective, inst.size_bytes) if c == "all_to_all")
    assert matrix.loc[(0, 1)].collective_bytes == ring + a2a and matrix.loc[(0, 2)].collective_bytes == a2a
    assert len(matrix) == 12 and (matrix.p2p_bytes == 0).all()


def test_parallel_dimensions_by_name_and_by_layout(ingested):
    """DeviceMesh's groups are described mesh_dp / mesh_tp; the layout tp=2,dp=2 (tp fastest) gives the same
    labels from the groups' ranks alone, and dp=2,tp=2 swaps them."""
    mesh = ingested(DATASETS / "torch_mesh_dp2_tp2")

    def labels(**params):
        got = tracesql.query("parallelism", mesh, per="group", **params)
        return {g[0]: (d, by) for g, d, by in zip(got.groups, got.dimension, got.labelled_by)}

    named = labels()
    ranks = {e["pg_name"]: (e["pg_desc"], e["ranks"]) for e in json.loads(
        gzip.open(DATASETS / "torch_mesh_dp2_tp2" / "rank-0.pt.trace.json.gz").read())["distributedInfo"]["pg_config"]}
    assert named["0"] == ("world", "world")
    assert {n for n, (d, _) in named.items() if d == "TP"} == {"3", "4"}  # mesh_tp: [0, 1], [2, 3]
    assert {n for n, (d, _) in named.items() if d == "DP"} == {"1", "2"}  # mesh_dp: [0, 2], [1, 3]
    assert ranks["3"] == ("mesh_tp", [0, 1]) and ranks["1"] == ("mesh_dp", [0, 2])
    laid_out = labels(parallelism="tp=2,dp=2")
    assert {n: d for n, (d, _) in laid_out.items()} == {n: d for n, (d, _) in named.items()}
    assert {by for n, (_, by) in laid_out.items() if n != "0"} == {"layout"}
    swapped = labels(parallelism="dp=2,tp=2")
    assert {n for n, (d, _) in swapped.items() if d == "TP"} == {"1", "2"}
    steps = tracesql.query("parallelism", mesh)
    assert list(steps.step) == [2, 3] and (steps.calls == 8).all()  # gloo's calls record no group: 'unknown'


@pytest.mark.parametrize("name", ["hta_nccl_parser_config", "hta_trace_filter"])
def test_exposed_communication_per_dimension_is_overlaps(ingested, name):
    """parallelism's exposed_ns, a call's kernel span less its device's compute then, summed over steps and
    dimensions, is overlap per=process_group's exposed_comm_ns (a union of segments: a second method), and so is
    comm_ns its comm_ns: each call's kernels do not overlap one another on these GPU traces."""
    run = ingested(DATASETS / name)
    got = tracesql.query("parallelism", run)
    overlap = tracesql.query("overlap", run, per="process_group")
    assert got.exposed_ns.sum() == overlap.exposed_comm_ns.sum() and got.comm_ns.sum() == overlap.comm_ns.sum()
    assert (got.exposed_ns < got.comm_ns).all() and (got.exposed_ns > 0.7 * got.comm_ns).all()
    assert list(got.exposed_step_share) == pytest.approx(list(got.step_share * got.exposed_ns / got.comm_ns), rel=1e-9)


def test_report_section_names_the_limiting_stage(ingested, shifted):
    """The report's Parallelism section on the unbalanced 1F1B run: the pipeline query's stages (mean per step),
    stage 2 named as the limit in both steps; no clock warning there, rank 1's on the shifted GPipe run."""
    from types import SimpleNamespace

    from tracesql import engine
    from tracesql.report import parallel_tables
    from tracesql.report.render import parallel_markdown

    run = ingested(SLOW)
    con = engine.connect(run)
    try:
        tables = parallel_tables(con, "torch_pipeline_1f1b_4stage_slow2")
    finally:
        con.close()
    stages = tables["stages"].set_index("rank")
    want = tracesql.query("pipeline", run).groupby("rank")
    assert list(stages.limiting_steps) == [0, 0, 2, 0] and tables["clocks"].empty
    assert list(stages.compute_ns) == pytest.approx(list(want.compute_ns.mean()))
    lines = parallel_markdown(SimpleNamespace(focus="slow", focus_tables=tables, traces=[]))
    assert ("Pipeline on group 0 (`pipeline`): 4 stages, 8 microbatches, 1 model chunk(s) per rank; stage 2 (rank 2) "
            "limits it in 2 of 2 steps (computes longest). Mean per step:") in lines
    row = stages.loc[2]
    assert any(line.startswith(f"| 2 | 2 | {row.compute_ns / 1e6:,.3f} ms |") and line.endswith("| 2 |")
               for line in lines)
    con = engine.connect(shifted)
    try:
        (rid,) = con.execute("SELECT run_id FROM runs").fetchone()
        tables = parallel_tables(con, rid)
    finally:
        con.close()
    assert list(tables["clocks"]["rank"]) == [1]
    lines = parallel_markdown(SimpleNamespace(focus=rid, focus_tables=tables, traces=[]))
    assert any(line.startswith("Clock offsets (`clock_offsets`): rank 1: offset 4.9") for line in lines)


def test_all_ranks_export_capped_host_depth_keeps_every_call(ingested, tmp_path):
    """What a 64+ rank export keeps (host_depth, by default 2 beyond 16 ranks): host slices nested no deeper than
    N and every communication call. On GPipe step 3 with N = 1, every slice read back is a depth <= 1 slice or a
    c10d call, each send/recv pair of the step is still linked, and under half the step's slices are written."""
    from tracesql.export import export_all_ranks, read

    run = ingested(GPIPE)
    capped = export_all_ranks(run, tmp_path / "capped.pftrace", step=3, host_depth=1)
    con = tracesql.connect(run)
    (in_step,) = con.execute("SELECT count(*) FROM slices WHERE step = 3").fetchone()
    assert capped.host_depth == 1 and sum(p.slices for p in capped.parts) < in_step / 2
    shallow = {n for (n,) in con.execute("SELECT DISTINCT name FROM slices WHERE depth <= 1").fetchall()}
    names = [p.track_event.name for p in read(tmp_path / "capped.pftrace")
             if p.track_event.type == p.track_event.TYPE_SLICE_BEGIN and p.track_event.categories[0] != "tracesql"]
    assert len(names) == sum(p.slices for p in capped.parts)
    assert {n for n in names if n not in shallow} <= {"c10d::send", "c10d::recv_"}
    assert names.count("c10d::send") == names.count("c10d::recv_") == 24 and capped.links == 24
