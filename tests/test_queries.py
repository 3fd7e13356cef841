"""The curated queries: headers that tell the truth, parameters, and real numbers on real traces."""

from __future__ import annotations

import re

import pytest

import tracesql
from conftest import DATASETS, raw_events
from tracesql import queries

CURATED = queries.catalogue()


def test_catalogue_lists_the_curated_files():
    assert {q.name for q in CURATED} >= {"overlap", "temporal_breakdown", "hotspots"}
    for q in CURATED:
        assert q.title and q.doc and q.columns, q.name


BUNDLED = sorted(p for p in DATASETS.iterdir() if p.is_dir() and any(p.glob("*.json.gz")))


@pytest.fixture(scope="module")
def bundled_sessions(ingested):
    """One session per bundled run for every query (opening one attaches all the functions: 0.07 s)."""
    return [tracesql.connect(ingested(dataset)) for dataset in BUNDLED]


@pytest.mark.parametrize("query", CURATED, ids=lambda q: q.name)
def test_header_columns_match_what_the_query_returns(query, bundled_sessions):
    """On every bundled run: the columns are the header's; and some bundled run has the data it needs."""
    rows = 0
    for con in bundled_sessions:
        rel = queries.run(con, query)
        assert [(c, str(t)) for c, t in zip(rel.columns, rel.types)] == [(n, t) for n, t, _ in query.columns]
        rows += len(rel.fetchall())
    assert rows > 0 and query.needs


@pytest.mark.parametrize("query", CURATED, ids=lambda q: q.name)
def test_header_defaults_are_the_sql_defaults(query):
    """The SQL reads each parameter as COALESCE(getvariable('name'), default): the header must say that default,
    so the file behaves the same in tracesql and in a plain DuckDB session."""
    in_sql = dict(re.findall(r"COALESCE\(getvariable\('(\w+)'\),\s*('[^']*'|[\w.]+)\)", query.sql))
    assert in_sql == {name: p.default for name, p in query.params.items()}


def test_unknown_parameter_is_an_error(ingested):
    with pytest.raises(tracesql.TraceError, match="unknown parameter windw .*class_scheme, analysis_window"):
        tracesql.query("overlap", ingested(DATASETS / "hta_trace_filter"), windw="hta")


def test_unknown_query_says_what_was_meant():
    """Issue 24: a wrong name listed all 22 curated queries; now the close ones (difflib), else where the list is."""
    with pytest.raises(tracesql.TraceError, match=r"^overlapp: no such query file or curated query \(did you mean "
                                                  r"overlap\?\)$"):
        queries.find("overlapp")
    with pytest.raises(tracesql.TraceError, match=r"\(did you mean bubbles_largest or bubbles\?\)$"):
        queries.find("bubbles_larg")
    with pytest.raises(tracesql.TraceError, match=r"\(`tracesql queries` lists the \d+ curated ones\)$"):
        queries.find("xyzzy")


def test_hotspots_on_trace_filter_match_json(ingested):
    run = ingested(DATASETS / "hta_trace_filter")
    df = tracesql.query("hotspots", run, top=5)
    kernels = df[df.level == "kernel"]
    assert list(kernels.rank_in_level) == [1, 2, 3, 4, 5]
    top = kernels.iloc[0]
    durations = [e["dur"] for rank in (0, 1)
                 for e in raw_events(DATASETS / "hta_trace_filter" / f"sampled_rank-{rank}.json.gz")
                 if e.get("name", "").startswith("ncclKernel_SendRecv")]
    assert top["name"].startswith("ncclKernel_SendRecv") and top["count"] == len(durations) == 20
    assert top["device_ns"] == sum(durations) * 1000 == 775_252_000 and top["ranks"] == 2
    assert kernels.cumulative_share.is_monotonic_increasing and kernels.cumulative_share.iloc[-1] <= 1
    assert abs(top["share"] - top["cumulative_share"]) < 1e-12
    ops = df[df.level == "op"]
    assert ops.iloc[0]["name"] == "record_param_comms" and len(ops) == 5


def test_overlap_is_null_without_communication(ingested):
    df = tracesql.query("overlap", ingested(DATASETS / "tracelens_mi210_gpu_only"))
    assert len(df) == 1 and df.comm_ns[0] == 0 and df.overlap_ratio.isna()[0]


def test_temporal_breakdown_adds_up_on_every_bundled_gpu_trace(ingested):
    for name in ("hta_trace_filter", "hta_nccl_parser_config", "tracelens_vllm_graph_execution",
                 "tracelens_mi210_gpu_only", "tracelens_b200_eager"):
        df = tracesql.query("temporal_breakdown", ingested(DATASETS / name))
        assert len(df) >= 1, name
        parts = df.compute_ns + df.exposed_comm_ns + df.exposed_memory_ns + df.idle_ns
        assert (parts == df.window_ns).all() and (df.window_ns > 0).all(), name


def test_b200_default_rules_count_ncclDevKernel_as_communication(ingested):
    """NCCL ≥2.19 names its kernels ncclDevKernel_*: tracesql's rules count them, HTA 0.5's do not."""
    run = ingested(DATASETS / "tracelens_b200_eager")
    ours = tracesql.query("overlap", run)
    hta = tracesql.query("overlap", run, class_scheme="hta")
    assert ours.comm_ns[0] > 0 and hta.comm_ns[0] == 0


def test_every_curated_parameter_states_the_values_it_takes():
    for q in CURATED:
        for p in q.params.values():
            assert p.rule, f"{q.name}.{p.name}: description must start with its values ('one of ...:', ...)"
            if p.default != "NULL":  # the default itself is allowed
                assert p.check(p.default.strip("'")) is None, (q.name, p.name, p.default)


@pytest.mark.parametrize("name, params, message", [
    # named by the query, not the installed file's path (issue 24)
    ("overlap", {"class_scheme": "HTA"}, "overlap: parameter class_scheme = 'HTA' is not one of default, hta"),
    ("overlap", {"per": "steps"}, "per = 'steps' is not one of rank, step, process_group"),
    ("temporal_breakdown", {"per": "process_group"}, "per = 'process_group' is not one of rank, step"),
    ("overlap", {"analysis_window": "bogus"}, "analysis_window = 'bogus' is not one of all, hta"),
    ("overlap", {"time_unit_ns": -5}, "time_unit_ns = -5 is not integer >= 1"),
    ("overlap", {"time_unit_ns": "1.5"}, "is not an integer (integer >= 1)"),
    ("hotspots", {"top": "many"}, "is not a number (integer >= 1)"),
    ("hotspots", {"levels": "kernel,ops"}, "levels = 'kernel,ops' names 'ops': each must be one of kernel, kernel_family, op, op_args"),
    ("mfu", {"device": "H1000"}, "is not a device_peaks key (known: V100-SXM2, "),
])
def test_parameter_values_are_checked_before_running(name, params, message, tmp_path):
    # the target does not exist: the parameters are refused before it is opened
    with pytest.raises(tracesql.TraceError, match="^" + re.escape(message) if message.startswith(name) else
                       re.escape(message)):
        tracesql.query(name, tmp_path / "no-such-run", **params)


def test_checked_parameters_still_run(ingested):
    run = ingested(DATASETS / "hta_trace_filter")
    df = tracesql.query("hotspots", run, levels="kernel,kernel_family", top="3")
    assert set(df.level) == {"kernel", "kernel_family"}
    assert len(tracesql.query("overlap", run, time_unit_ns="1000", class_scheme="hta")) == 2


def test_a_connection_keeps_only_its_latest_result(ingested):
    """A report runs dozens of queries on one connection: each `run` frees the previous result's table, and the
    rows of each result are those a fresh connection gives."""
    run = ingested(DATASETS / "hta_trace_filter")
    con = tracesql.connect(run)
    results = "SELECT count(*) FROM duckdb_tables() WHERE temporary AND starts_with(table_name, 'tracesql_result_')"
    for name in ("overlap", "hotspots", "overlap"):
        rows = queries.run(con, queries.find(name)).fetchall()
        assert rows and rows == queries.run(tracesql.connect(run), queries.find(name)).fetchall()
        assert con.execute(results).fetchall() == [(1,)]
    queries.drop_results(con)
    assert con.execute(results).fetchall() == [(0,)]
