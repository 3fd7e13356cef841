"""Collective instances are matched across ranks by group, kind and sequence number (collective_match_key):
a send meets its peer's recv, but calls of different kinds never become one instance, also in traces without
process groups or recorded sequence numbers."""

from __future__ import annotations


import tracesql
from conftest import corpus_path, write_trace


def test_match_key_macro():
    import duckdb

    from tracesql import functions

    con = duckdb.connect()
    functions.install(con, ("10_sizes.sql",))
    key = lambda pg, kind, seq: con.execute("SELECT collective_match_key(?, ?, ?)", [pg, kind, seq]).fetchall()[0][0]
    assert key("0", "send", 3) == key("0", "recv", 3) == key("0", "send_recv", 3)
    assert key("0", "all_reduce", 3) != key("0", "send", 3)
    assert key(None, "all_reduce", 3) != key(None, "all_gather", 3)
    assert key("0", "all_reduce", 3) != key("1", "all_reduce", 3) != key("0", "all_reduce", 4)


def test_single_rank_without_groups_never_pairs_kinds(tmp_path):
    """HTA's trace_diff control trace: one rank, no process groups, no recorded seq; 18 all_reduce host calls and
    42 SendRecv kernels. Matched by (group, seq) alone, each of the first 18 send_recvs became one 'instance'
    with an all_reduce, rank 3 twice in it (18 inconsistent instances out of 42)."""
    run = tracesql.ingest([corpus_path("hta", "tests", "data", "trace_diff", "control", "control.json.gz")],
                          tmp_path / "control").run
    con = tracesql.connect(run)
    kinds = dict(con.sql("SELECT collective, count(*) FROM collectives GROUP BY ALL").fetchall())
    assert kinds == {"all_reduce": 18, "send_recv": 42}
    got = tracesql.query("collectives", run)
    assert len(got) == 60 and got.consistent.all()
    assert (got.ranks_seen == 1).all() and all(list(r) == [3] for r in got.ranks)
    assert got.groupby("collective").size().to_dict() == {"all_reduce": 18, "send_recv": 42}
    # every call is in exactly one instance
    assert sorted(zip(got.collective, got.seq)) == sorted(
        con.sql("SELECT collective, seq FROM collectives").fetchall())


def test_kernels_no_host_call_launched_share_the_count_of_host_calls(tmp_path):
    """HTA's trace_diff test trace: 18 all_reduce host calls and 3 all_reduce kernels no host call launched, on
    one rank. Counted apart (0..17 and 0..2) they collided in three instances that held the rank twice."""
    run = tracesql.ingest([corpus_path("hta", "tests", "data", "trace_diff", "test", "test.json.gz")],
                          tmp_path / "test").run
    con = tracesql.connect(run)
    calls = con.sql("SELECT count(*), count(DISTINCT seq), count(cpu_ts) FROM collectives "
                    "WHERE collective = 'all_reduce'").fetchall()
    assert calls == [(21, 21, 18)]
    got = tracesql.query("collectives", run)
    assert len(got) == 64 and got.consistent.all() and (got.ranks_seen == 1).all()


def c10d(name, ts, rank_tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": 10, "pid": 1, "tid": rank_tid,
            "args": {"Input Dims": [[1024]], "Input type": ["float"]}}


def test_two_ranks_send_meets_recv_and_kinds_stay_apart(tmp_path):
    """gloo-style c10d calls (no metadata, no seq): rank 0 sends before its all_reduces, rank 1 receives after
    them. Counting each kind apart matches the all_reduces with each other and the send with the recv."""
    r0 = [c10d("c10d::send", 100), c10d("c10d::allreduce_", 200), c10d("c10d::allreduce_", 300)]
    r1 = [c10d("c10d::allreduce_", 205), c10d("c10d::allreduce_", 330), c10d("c10d::recv_", 400)]
    folder = tmp_path / "traces"
    folder.mkdir()
    write_trace(folder / "rank-0.json", r0)
    write_trace(folder / "rank-1.json", r1)
    run = tmp_path / "run"
    tracesql.ingest([folder], run)
    got = tracesql.query("collectives", run)
    assert len(got) == 3 and got.consistent.all() and (got.ranks_seen == 2).all()
    ar = got[got.collective == "all_reduce"].sort_values("seq")
    assert list(ar.seq) == [0, 1]
    assert list(ar.max_skew_ns) == [5_000, 30_000] and list(ar.last_rank) == [1, 1]
    p2p = got[got.collective.isin(["send", "recv"])].iloc[0]
    assert p2p.seq == 0 and list(p2p.ranks) == [0, 1] and p2p.max_skew_ns == 300_000
    st = tracesql.query("collective_stragglers", run).set_index("rank")
    assert st.loc[1].instances == 3 and st.loc[1].times_last == 3


def test_inconsistent_when_a_rank_records_two_calls_of_an_instance(tmp_path):
    """Recorded sequence numbers that repeat on one rank (a misaligned or merged trace) are flagged."""
    meta = {"Collective name": "allreduce", "Process Group Name": "0", "Group size": 2, "dtype": "Float",
            "In msg nelems": 8, "Out msg nelems": 8, "Seq": 4}
    ev = [{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": t, "dur": 5, "pid": 1, "tid": 1,
           "args": meta} for t in (10, 50)]
    run = tmp_path / "run"
    tracesql.ingest([write_trace(tmp_path / "rank-0.json", ev)], run)
    got = tracesql.query("collectives", run)
    assert len(got) == 1 and not got.consistent.iloc[0]
    assert got.seq.iloc[0] == 4 and got.ranks_seen.iloc[0] == 2
