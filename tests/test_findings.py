"""`tracesql findings`: the rules' headers, their rows on a real run checked against the what_if query they cite,
and the planted-cause benchmark on a bundled trace (benchmarks/bench_findings.py)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex

import pytest
from click.testing import CliRunner

import tracesql
from conftest import DATASETS, REPO, corpus_path
from tracesql import findings, json_schemas, queries
from tracesql.cli import main

RULES = findings.catalogue()
TRACE_FILTER = DATASETS / "hta_trace_filter"
#: The rules whose cause HTA's sampled trace holds (it records no shapes: no GEMM to rate against its roofline;
#: a fifth of its kernels are tiny, under tiny_kernels' 50 %; no kernel sequence recurs 10 times; no pipeline)
#: (nor XLA ops, nor a memory peak near the device's capacity: tests/test_findings_rules.py)
ON_TRACE_FILTER = sorted({r.name for r in RULES} - {"gemm_under_roofline", "tiny_kernels", "kernel_sequences",
                                                    "pipeline_bubbles", "xla_async_wait", "xla_data_formatting",
                                                    "xla_over_theory", "memory_peak"})


def _bench():
    spec = importlib.util.spec_from_file_location("bench_findings", REPO / "benchmarks" / "bench_findings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_rule_headers(rule):
    """Each rule says what it detects and needs, returns FINDING_COLUMNS, takes its threshold and the run's name,
    and its header's defaults are its SQL's."""
    assert rule.title and rule.doc and rule.needs
    assert rule.columns == list(findings.FINDING_COLUMNS)
    # a threshold: the saving's, or (memory_peak, which saves no time) the peak's share of the device's memory
    assert "run" in rule.params and {"min_saving_pct", "min_peak_pct"} & set(rule.params)
    in_sql = dict(re.findall(r"COALESCE\(getvariable\('(\w+)'\),\s*('[^']*'|[\w.]+)\)", rule.sql))
    assert in_sql == {name: p.default for name, p in rule.params.items()}
    assert f"'{rule.name}' AS finding" in rule.sql


@pytest.mark.slow  # five what-if replays of every step, and one per rule to cross-check
def test_findings_match_the_what_if_they_cite(ingested):
    """On HTA's sampled two-rank trace every rule runs; with no threshold each rule whose cause the step holds
    has a row (this trace is bound by Python between its few ops: no fix the rules price saves anything), never
    NULL; each row's command, run, shows that saving (the what_if query: a second path to the number)."""
    run = ingested(TRACE_FILTER)
    con = tracesql.connect(run)
    found = findings.run(con, "RUN", {"min_saving_pct": 0}).df()
    assert list(found.columns) == [c for c, _, _ in findings.FINDING_COLUMNS]
    assert found.groupby("finding").size().to_dict() == {name: 4 for name in ON_TRACE_FILTER}
    assert found[found.finding == "host_op"].evidence.str.startswith("without forward ").all()
    assert found.saving_ns.notna().all() and (found.saving_ns >= 0).all()
    assert list(found.saving_ns) == sorted(found.saving_ns, reverse=True)
    for row in found.drop_duplicates("finding").itertuples():
        argv = shlex.split(row.query)
        assert argv[:3] == ["tracesql", "query", "what_if"] and argv[3] == "RUN"
        done = CliRunner().invoke(main, argv[1:3] + [str(run)] + argv[4:] + ["-f", "json"], catch_exceptions=False)
        (cited,) = json.loads(done.stdout)
        assert (cited["rank"], cited["step"], cited["saving_ns"]) == (row.rank, row.step, row.saving_ns)
    # the trace is bound by Python between ops: no rule saves 5 % of a step (the default threshold)
    assert findings.run(con, "RUN").df().empty


@pytest.mark.slow  # every rule twice
def test_findings_share_what_no_rule_changes(ingested):
    """`findings` computes each step's unchanged replay and critical path once for all rules (what_if_unchanged);
    its rows are each rule's run by itself, which walks them all again. data_loader's change makes the steps'
    DataLoader ranges ops, which changes their graphs: its steps are walked anew (their known rows would be
    another graph's)."""
    run = ingested(TRACE_FILTER)
    con = tracesql.connect(run)
    assert con.sql("SELECT count(*) FILTER (WHERE reroled), count(*) "
                   "FROM critical_path_events(faster := data_loading_pattern())").fetchall() == [(4, 4)]
    found = findings.run(con, "RUN", {"min_saving_pct": 0}).fetchall()
    alone = [row for rule in RULES if "min_saving_pct" in rule.params
             for row in queries.run(tracesql.connect(run), rule, {"run": "RUN", "min_saving_pct": 0}).fetchall()]
    assert len(found) == 4 * len(ON_TRACE_FILTER)
    assert sorted(found, key=repr) == sorted(alone, key=repr)


def test_findings_of_a_run_without_steps(ingested):
    """A run without a step or range to replay (a GPU-only trace: no host, no ProfilerStep) has changes to price
    (its kernels) but no window: no finding, as each rule alone, and no error (the priced walks' inputs empty)."""
    run = ingested(DATASETS / "tracelens_mi210_gpu_only")
    con = tracesql.connect(run)
    assert con.sql("SELECT count(*) FROM critical_path_windows()").fetchall() == [(0,)]
    assert findings.run(con, "RUN", {"min_saving_pct": 0}).fetchall() == []
    assert [row for rule in RULES if "min_saving_pct" in rule.params
            for row in queries.run(con, rule, {"run": "RUN", "min_saving_pct": 0}).fetchall()] == []


def test_changes_that_walk_alike_are_walked_once(ingested):
    """Two what-ifs whose changes differ in a parameter that changes nothing (faster_pct without `faster`) are one
    change (one key, what_if_change_key) and one walk of the lengths `findings` prices before its rules run, and
    each is priced as what_if alone predicts it."""
    run = ingested(TRACE_FILTER)
    con = tracesql.connect(run)
    calls = [f"what_if(no_launch_overhead := 1, faster_pct := {pct})" for pct in (0, 100)]
    changes, constant = findings._changes(con, " UNION ALL ".join(f"SELECT * FROM {call}" for call in calls))
    assert constant and len(changes) == 2 and len({c["key"] for c in changes}) == 1
    with findings._event_lists_once(con):
        lists = con.sql("FROM findings_event_lists").to_arrow_table()
        scales = findings._Scales(con, lists)
        scales.add(changes)
        keys, *walks = findings._lengths_input(lists, changes, scales)
        assert keys == [changes[0]["key"]]
        replays = findings._replays(keys, *walks)
        findings._walk(replays)
        lengths = [findings._lengths(replays)]
        with findings._unchanged_once(con, lists), findings._priced_once(con, changes, lengths):
            assert con.sql("SELECT what_if_priced(NULL, 100, 0, 1, 0, 0), what_if_priced(NULL, 0, 0, 1, 0, 0)"
                           ).fetchall() == [(True, True)]
            priced = [sorted(con.sql(f"SELECT rank, instance, predicted_ns FROM {call}").fetchall()) for call in calls]
            # what the rules' last statements read in what_if's place: the same rows, every column, for a priced
            # change (what_if_known) and for calls passed on to what_if (not priced, other windows, a rank)
            others = ["what_if(hide_communication := 1)",
                      "what_if(annotation := 'ProfilerStep', faster := 'it''s', faster_pct := 12.5)",
                      "what_if(no_launch_overhead := 1, rank_filter := 1)", "what_if(replay := 0)",
                      "what_if(predict := 0)"]
            for call in calls + others:
                unchanged = sorted(con.sql(f"FROM {call}").fetchall(), key=repr)
                with findings._known_what_if(con):
                    assert sorted(con.sql(f"FROM {call}").fetchall(), key=repr) == unchanged, call
                assert unchanged
    alone = sorted(tracesql.connect(run).sql(f"SELECT rank, instance, predicted_ns FROM {calls[0]}").fetchall())
    assert len(alone) == 4 and priced == [alone, alone]


def test_what_ifs_priced_before_the_rules_are_those_their_arguments_allow(ingested):
    """`findings` prices before its rules run the what_if calls whose arguments it can evaluate then (literals,
    variables, macros); a call whose argument reads the rule's own rows or tables is left to what_if, not an
    error."""
    con = tracesql.connect(ingested(TRACE_FILTER))
    con.execute("SET VARIABLE host_op_name = 'forward'")
    sql = """WITH calls AS (SELECT 1 AS syncs)
        SELECT * FROM what_if(remove_syncs := 1) JOIN calls ON true
        UNION ALL SELECT * FROM what_if(faster := '^' || regexp_escape(getvariable('host_op_name')) || '$',
                                        faster_pct := 100) JOIN calls ON true
        UNION ALL SELECT * FROM what_if(remove_syncs := (SELECT syncs FROM calls)) JOIN calls ON true
        UNION ALL SELECT * FROM what_if(faster := c.name) c
        UNION ALL SELECT * FROM what_if(annotation := 'ProfilerStep', hide_communication := 1)"""
    changes, constant = findings._changes(con, sql)
    assert not constant  # (its last statement runs with what_if itself: findings._known_what_if needs constants)
    assert [(c["faster"], c["faster_pct"], c["remove_syncs"]) for c in changes] == [
        (None, 0.0, 1), ("^forward$", 100.0, 0)]
    assert len({c["key"] for c in changes}) == 2
    # (DuckDB's parse says where the calls are: in the text's order, by their bytes, past a comment's non-ASCII)
    assert findings._what_if_calls(con, "-- ×\nSELECT 1 FROM what_if(faster := 'é', faster_pct := 50), "
                                        "what_if( remove_syncs := 1 ) x") == ["faster := 'é', faster_pct := 50",
                                                                             "remove_syncs := 1"]
    assert findings._changes(con, "SET VARIABLE x = 1") == ([], False)  # (not serialized: none priced before)


def test_findings_give_the_walks_a_core_and_leave_the_threads_as_they_were(ingested, monkeypatch):
    """While the walks run beside its SQL, `findings` runs DuckDB on one thread fewer (one of two, three of four;
    never none): from the walks ahead on, through the first statements of the rules that price without the paths;
    the first statements of those that read them (host_op, idle_bubbles: the first changes' walks end before
    they do) on all of them. It leaves the connection with the threads it had."""
    from tracesql import critical_path, queries

    con = tracesql.connect(ingested(TRACE_FILTER))
    seen, first = [], {}

    def threads():
        return con.execute("SELECT current_setting('threads')").fetchone()[0]

    walk, prepare = critical_path.walk_ahead, queries.prepare
    monkeypatch.setattr(critical_path, "walk_ahead", lambda *a: seen.append(threads()) or walk(*a))
    monkeypatch.setattr(queries, "prepare", lambda con, rule, *a: first.setdefault(rule.name, []).append(
        threads()) or prepare(con, rule, *a))
    for count in (4, 2, 1):
        con.execute(f"SET threads = {count}")
        findings.run(con, "RUN").fetchall()
        assert threads() == count
    assert seen == [3, 1, 1]
    assert first["straggler"] == first["host_sync"] == [3, 1, 1]
    assert first["host_op"] == first["idle_bubbles"] == [4, 2, 1]


def test_the_event_source_of_findings_reads_its_lists_for_the_default_windows_only(ingested):
    """While `findings` runs, critical_path_event_source reads its lists (the table) for the default windows and
    computes any other windows as outside it (`query` of the call's arguments, a quote in an annotation
    included): the same windows and events."""
    con = tracesql.connect(ingested(TRACE_FILTER))
    calls = ["", "annotation := ''", "annotation := 'ProfilerStep', occurrence := 1", "annotation := 'it''s'",
             "rank_filter := 1"]
    sql = "SELECT window_name, rank, instance, len(events) FROM critical_path_event_{}({}) ORDER BY ALL"
    outside = [con.sql(sql.format("lists", call)).fetchall() for call in calls]
    with findings._event_lists_once(con):
        assert con.sql("SELECT count(*) FROM findings_event_lists").fetchall() == [(4,)]
        inside = [con.sql(sql.format("source", call)).fetchall() for call in calls]
    assert inside == outside and [len(rows) for rows in outside] == [4, 2, 2, 0, 2]


@pytest.mark.slow
def test_findings_walk_each_steps_path_once(ingested, monkeypatch):
    """`findings` walks HTA's critical path of each step and each step's unchanged replay once, ahead
    (critical_path.walk_ahead, in a thread), for the rules that read them (step_critical_paths: host_op,
    idle_bubbles; what_if); inside its sharing the macro's rows, of every rank and of one, are those it walks
    outside, and the what_if macro's unchanged replays and paths build no graph of their own and read no events:
    it finds each walk by its events' key (critical_path_replay_lengths, step_critical_paths_walked)."""
    from tracesql import critical_path

    run = ingested(TRACE_FILTER)
    con = tracesql.connect(run)

    def paths():
        return {rank: sorted(con.sql(f"FROM step_critical_paths(rank_filter := {rank})").fetchall(), key=repr)
                for rank in ("NULL", 1)}

    walked = paths()
    unchanged = sorted(con.sql("FROM what_if(predict := 0)").fetchall(), key=repr)
    monkeypatch.setattr(critical_path, "_WALKED", {})
    monkeypatch.setattr(critical_path, "_PLANS", {})
    listed = "SELECT count(*), count(events) FROM critical_path_events(walked_ahead := 1)"
    with findings._event_lists_once(con):
        walks = critical_path.walk_ahead(con.sql("FROM findings_event_lists").to_arrow_table())
        walks.work()
        ahead_paths, ahead = walks.result()
        built, read = [], []
        plan, arrays = critical_path.Plan.__init__, critical_path._arrays
        monkeypatch.setattr(critical_path.Plan, "__init__", lambda *a: built.append(1) or plan(*a))
        monkeypatch.setattr(critical_path, "_arrays", lambda *a: read.append(1) or arrays(*a))
        with critical_path.walked_ahead(ahead), findings._paths_once(con, ahead_paths):
            assert paths() == walked
            assert sorted(con.sql("FROM what_if(predict := 0)").fetchall(), key=repr) == unchanged
            assert con.sql(listed).fetchall() == [(4, 0)]  # (no window's list made: its walks are found)
        assert con.sql(listed).fetchall() == [(4, 4)]  # (once findings lets them go, each list is made)
    assert built == [] and read == []
    assert 0 < len(walked[1]) < len(walked["NULL"])


@pytest.mark.slow
def test_walks_ahead_are_the_same_whichever_threads_walk_them(ingested, monkeypatch):
    """`findings` walks ahead in two threads (its own, and its main one once its SQL is done: critical_path.Shared),
    each step walked by one of them: the paths and walks are those one thread walks alone, in the steps' order."""
    import threading

    from tracesql import critical_path

    con = tracesql.connect(ingested(TRACE_FILTER))
    with findings._event_lists_once(con) as lists:
        alone = critical_path.walk_ahead(lists)
        alone.work()
        paths, walks = alone.result()
        monkeypatch.setattr(critical_path, "_WALKED", {})  # (walked again, not found kept)
        monkeypatch.setattr(critical_path, "_PLANS", {})
        both, walkers, step = threading.Barrier(2), [], critical_path._walk_step_ahead

        def first_steps_together(item):  # (each thread takes one step before either walks: both walk)
            if threading.get_ident() not in walkers:
                walkers.append(threading.get_ident())
                both.wait(timeout=60)
            return step(item)

        monkeypatch.setattr(critical_path, "_walk_step_ahead", first_steps_together)
        shared = critical_path.walk_ahead(lists)
        threads = [threading.Thread(target=shared.work) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        shared_paths, shared_walks = shared.result()
    assert len(walkers) == 2 and len(walks) == 6  # (4 windows' paths, 2 steps' replays of 2 ranks)
    assert shared_paths.equals(paths) and shared_walks.keys() == walks.keys()
    assert all(shared_walks[key].equals(walk) for key, walk in walks.items())


@pytest.mark.slow
def test_launch_overhead_counts_launches_onto_an_idle_stream(ingested):
    """Stream starvation in launch_overhead's evidence: the launches of each step whose stream had ended all its
    earlier work when the launch call began, counted again in pandas from the device events and their launches."""
    run = ingested(TRACE_FILTER)
    con = tracesql.connect(run)
    rule = next(r for r in RULES if r.name == "launch_overhead")
    found = queries.run(con, rule, {"min_saving_pct": 0}).df().sort_values(["rank", "step"])
    said = [int(re.search(r"; (\d+) launched onto an idle stream", e).group(1)) for e in found.evidence]
    device = con.sql("SELECT rank, device_id, stream, ts, dur, slice_id, launch_id FROM device_activity()").df()
    device = device.sort_values(["rank", "device_id", "stream", "ts", "slice_id"])
    device["free"] = (device.ts + device.dur).groupby([device["rank"], device.device_id, device.stream],
                                                       dropna=False).transform(lambda end: end.cummax().shift())
    calls = con.sql("SELECT rank, slice_id AS launch_id, ts AS call_ts FROM slices").df()
    launched = device.merge(calls, on=["rank", "launch_id"])
    windows = con.sql("SELECT rank, ts AS w0, te AS w1 FROM critical_path_windows() ORDER BY rank, ts").df()
    counted = [int(((launched["rank"] == w.rank) & launched.call_ts.between(w.w0, w.w1)
                    & (launched.free <= launched.call_ts)).sum()) for w in windows.itertuples()]
    assert said == counted and min(said) > 100  # 136–155 of the 577–602 kernels of each step


@pytest.mark.slow
def test_findings_command(ingested, monkeypatch):
    """`tracesql findings` as the README installs it: without the extras (sqlglot is the spark extra's)."""
    import sys

    monkeypatch.setitem(sys.modules, "sqlglot", None)  # (an import of it fails)
    run = ingested(TRACE_FILTER)
    done = CliRunner().invoke(main, ["findings", str(run), "-p", "min_saving_pct=0", "-f", "json"])
    assert done.exit_code == 0, done.output
    rows = json.loads(done.stdout)
    assert len(rows) == 4 * len(ON_TRACE_FILTER)  # each rule on each of 2 ranks × 2 steps
    import jsonschema

    jsonschema.Draft202012Validator(json_schemas.findings()).validate(rows)
    bad = CliRunner().invoke(main, ["findings", str(run), "-p", "min_saving=1"])
    assert bad.exit_code == 1
    assert bad.output.startswith("Error: findings: no rule takes a parameter min_saving (they take: ")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The benchmark's evaluate, sharing one scratch folder: the original is ingested and diagnosed once."""
    bench, scratch = _bench(), tmp_path_factory.mktemp("planted")
    return lambda cause: bench.evaluate(TRACE_FILTER / "sampled_rank-0.json.gz", cause, 0.3, scratch)


@pytest.mark.slow
@pytest.mark.parametrize("cause", ["host_stall", "slow_loader"])
def test_planted_stall_is_the_top_finding(planted, cause):
    """The benchmark's CI part: a host stall (an op) or a slow data loader (PyTorch's DataLoader annotation, no
    op inside) of 30 % of each step planted in rank 0 of HTA's sampled trace is the top finding of both steps,
    its saving within 25 % of what it cost, and the original has no finding."""
    result = planted(cause)
    (row,) = result["rows"]
    assert row["hits"] == row["steps"] == 2
    assert row["cost_ns"] > 150_000_000 and abs(row["error"]) <= 0.25
    assert result["false"] == 0


@pytest.mark.slow
def test_planted_layout_transpose_is_the_top_finding(tmp_path):
    """The benchmark's XLA cause: a transpose of 30 % of each step planted before the step's device work in the
    bundled JAX CPU profile (surgery on its XSpace and HLO) is the top finding of each step (xla_data_formatting
    naming it), its saving the step time it cost; the surgery moves each step by exactly the planted time, and
    the planted op is a data-formatting op of the program."""
    bench = _bench()
    original = DATASETS / "jax_cpu_mlp" / "vm.xplane.pb"
    result = bench.evaluate(original, "layout_transpose", 0.3, tmp_path)
    (row,) = result["rows"]
    assert row["hits"] == row["steps"] == 3
    assert row["cost_ns"] > 0 and abs(row["error"]) <= 0.25
    assert result["false"] == 0
    runs = {label: tracesql.connect(tmp_path / "runs" / f"jax_cpu_mlp-{label}")
            for label in ("original", "layout_transpose")}
    steps = {label: con.sql("SELECT step, dur FROM steps ORDER BY step").fetchall() for label, con in runs.items()}
    planted = [round(0.3 * dur * 1000) // 1000 for _, dur in steps["original"]]
    assert [dur - before for (_, dur), (_, before) in zip(steps["layout_transpose"], steps["original"])] == \
        pytest.approx(planted, abs=1)
    ops = runs["layout_transpose"].sql(f"SELECT category, count(*) FROM xla_ops WHERE name = "
                                       f"'{bench.PLANTED_TRANSPOSE}' GROUP BY ALL").fetchall()
    assert ops == [("data formatting", 1)]


@pytest.mark.slow
def test_planted_stall_behind_a_full_queue_is_absorbed():
    """The surgery's model of a device-bound trace (HTA's ns_resolution_trace: its launches block on a full
    queue): with no delay it changes nothing; a host stall at a step's start is absorbed by the blocked launches
    after it (the host arrives later, the queue has drained by then), so the device work does not move."""
    bench = _bench()
    path = corpus_path("hta/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")
    trace = bench.load(path)
    events = trace["traceEvents"]
    before = [(e.get("ts"), e.get("dur")) for e in events]
    step = bench._steps(events)[3]
    bench._shift(events, step["ts"] + 1, 0.0)
    assert [(e.get("ts"), e.get("dur")) for e in events] == before
    device = {id(e): e["ts"] for e in events if e.get("cat") in bench.DEVICE_CATS}
    bench._shift(events, step["ts"] + 1, 0.3 * step["dur"])
    assert all(e["ts"] == device[id(e)] for e in events if id(e) in device)
    after = bench._steps(events)[3]
    assert after["dur"] == pytest.approx(step["dur"], abs=0.001 * step["dur"])


def test_planted_slow_rank_surgery():
    """The benchmark's surgery across ranks on HTA's sampled two-rank trace (no ingest): with no change it
    changes nothing; with rank 1's kernels 30 % slower, those take 1.3 × their time, rank 0's keep theirs, and
    each collective completes on each rank its transfer time (its time after the last arrival) after the last
    rank's new arrival (here as before: see below)."""
    bench = _bench()
    job = bench.load_job(TRACE_FILTER)
    before = [[(e.get("ts"), e.get("dur")) for e in t["traceEvents"]] for t in job]
    bench._retime(job)
    assert [[(e.get("ts"), e.get("dur")) for e in t["traceEvents"]] for t in job] == before
    old = [bench._communication(t["traceEvents"]) for t in job]
    old = [[(c["ts"], c["ts"] + c["dur"]) for c in comm] for comm in old]
    bench._retime(job, slow=1)
    for rank, (trace, was) in enumerate(zip(job, before)):
        kernels = [(e, dur) for e, (_, dur) in zip(trace["traceEvents"], was)
                   if e.get("cat") == "kernel" and not e["name"].startswith("nccl")]
        assert all(e["dur"] == pytest.approx(dur * (1.3 if rank else 1)) for e, dur in kernels)
    new = [[(c["ts"], c["ts"] + c["dur"]) for c in bench._communication(t["traceEvents"])] for t in job]
    delayed = []
    for n in range(len(new[0])):
        last_old, last_new = max(o[n][0] for o in old), max(r[n][0] for r in new)
        for rank in (0, 1):
            assert new[rank][n][1] == pytest.approx(last_new + old[rank][n][1] - last_old)
        if last_new > last_old:
            delayed.append((n, round(last_new - last_old, 2)))
    # rank 1's host launches block on its full queue before the second collective: the surgery returns them when
    # a slot frees, later with slower kernels, so rank 1 (the last to arrive) arrives 6.03 ms later there; before
    # the other nine its device has room, and it arrives no later
    assert delayed == [(1, 6032.75)]

