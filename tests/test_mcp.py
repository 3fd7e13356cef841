"""`tracesql mcp`: the SDK's own client starts the server (`python -m tracesql mcp RUNS`) over stdio, lists the
tools and calls each on bundled runs, checking the numbers against tracesql's Python API and CLI; escapes through
`run_sql` fail in one line; the limits hold and are stated. The `Tools` class is also called directly for the
limits (fast, no process)."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import time

import duckdb
import pytest
from click.testing import CliRunner

import tracesql
from conftest import DATASETS, REPO
from tracesql import info, queries, schema
from tracesql.cli import main
from tracesql.errors import TraceError
from tracesql.mcp_server import TOOLS, CallLimits, Tools

pytest.importorskip("mcp")
anyio = pytest.importorskip("anyio")

TRACE_FILTER = DATASETS / "hta_trace_filter"
GLOO = DATASETS / "torch_gloo_2rank"
STRAGGLER = DATASETS / "torch_gloo_4rank_straggler"


@pytest.fixture(scope="module")
def runs(ingested):
    """name -> run folder: three bundled traces, ingested once."""
    return {"hta_trace_filter": ingested(TRACE_FILTER), "torch_gloo_2rank": ingested(GLOO),
            "torch_gloo_4rank_straggler": ingested(STRAGGLER)}


def session(args: list, calls):
    """Start `tracesql mcp ARGS` with the SDK's client over stdio and return `await calls(client)`."""
    from mcp import Client, StdioServerParameters

    server = StdioServerParameters(command=sys.executable, args=["-m", "tracesql", "mcp", *map(str, args)], cwd=REPO,
                                   env={"PYTHONPATH": str(REPO), "TRACESQL_CACHE": os.environ["TRACESQL_CACHE"]})

    async def go():
        async with Client(server, mode="legacy") as client:
            return await calls(client)

    return anyio.run(go)


def answer(result) -> dict:
    assert not result.is_error, result.content[0].text
    data = json.loads(result.content[0].text)
    assert data == result.structured_content
    return data


def refusal(result) -> str:
    assert result.is_error
    text = result.content[0].text
    assert "\n" not in text.strip(), text
    return text


def same(value, expected) -> bool:
    if isinstance(expected, float) and math.isnan(expected):
        return value is None
    if isinstance(expected, float) and isinstance(value, (int, float)):
        return math.isclose(value, expected, rel_tol=1e-12, abs_tol=1e-12)
    return value == expected


def frame_rows(frame) -> list[list]:
    return [[None if v is None or (isinstance(v, float) and math.isnan(v)) else v for v in row]
            for row in frame.astype(object).itertuples(index=False, name=None)]


@pytest.mark.slow
def test_client_session_calls_every_tool_with_real_numbers(runs, tmp_path):
    export_dir = tmp_path / "exports"

    async def calls(client):
        listed = await client.list_tools()
        out = {"tools": {t.name: t for t in listed.tools}}
        out["list_runs"] = answer(await client.call_tool("list_runs", {}))
        # a run by its name, and by its path as given on the command line
        out["describe_run"] = answer(await client.call_tool("describe_run", {"run": "torch_gloo_4rank_straggler"}))
        out["describe_by_path"] = answer(await client.call_tool("describe_run",
                                                                {"run": str(runs["hta_trace_filter"])}))
        out["schema"] = answer(await client.call_tool("schema", {"run": "hta_trace_filter"}))
        out["list_queries"] = answer(await client.call_tool("list_queries", {}))
        out["run_query"] = answer(await client.call_tool("run_query", {
            "run": "hta_trace_filter", "query": "overlap", "params": {"per": "step"}}))
        out["run_sql"] = answer(await client.call_tool("run_sql", {
            "run": "torch_gloo_2rank", "sql": "SELECT kind, count(*) AS n, sum(dur) AS dur_ns FROM slices "
                                               "GROUP BY ALL ORDER BY n DESC, kind"}))
        out["diff"] = answer(await client.call_tool("diff", {"before": "torch_gloo_2rank",
                                                             "after": "torch_gloo_4rank_straggler", "top": 4}))
        out["export_step"] = answer(await client.call_tool("export_step", {"run": "torch_gloo_2rank", "rank": 0,
                                                                           "step": 3}))
        out["unknown run"] = refusal(await client.call_tool("describe_run", {"run": "nope"}))
        out["unknown query"] = refusal(await client.call_tool("run_query", {"run": "hta_trace_filter",
                                                                            "query": "../etc/passwd"}))
        out["bad parameter"] = refusal(await client.call_tool("run_query", {
            "run": "hta_trace_filter", "query": "overlap", "params": {"per": "week"}}))
        out["resources"] = {str(r.uri) for r in (await client.list_resources()).resources}
        out["units"] = (await client.read_resource("tracesql://concepts/units")).contents[0].text
        out["overlap_sql"] = (await client.read_resource("tracesql://queries/overlap")).contents[0].text
        return out

    got = session([*runs.values(), "--export-dir", export_dir], calls)
    assert set(got["tools"]) == set(TOOLS)
    assert all(got["tools"][t].annotations.read_only_hint for t in TOOLS if t != "export_step")
    assert set(got["tools"]["run_query"].input_schema["properties"]) == {"run", "query", "params"}

    listed = {r["name"]: r for r in got["list_runs"]["runs"]}
    assert got["list_runs"]["count"] == 3 and set(listed) == set(runs)
    assert [listed[n]["ranks"] for n in runs] == [2, 2, 4] and listed["hta_trace_filter"]["formats"] == ["kineto"]

    described = got["describe_run"]
    expected = info.info(runs["torch_gloo_4rank_straggler"])
    assert described["rows"] == expected.rows and described["sources_total"] == 4
    assert (described["start_ns"], described["end_ns"]) == (expected.start_ns, expected.end_ns)
    assert got["describe_by_path"]["name"] == "hta_trace_filter"
    assert got["describe_by_path"]["rows"]["slices"] == info.info(runs["hta_trace_filter"]).rows["slices"]

    tables = {t["name"]: t for t in got["schema"]["tables"]}
    assert list(tables) == list(schema.TABLES)
    assert [c[0] for c in tables["slices"]["columns"]] == schema.TABLES["slices"].column_names
    assert any(f.startswith("device_activity(") and f.endswith("-> table") for f in got["schema"]["functions"])
    assert {"kernel_classes", "device_peaks"} <= set(got["schema"]["data_tables"])

    assert [q["name"] for q in got["list_queries"]["queries"]] == [q.name for q in queries.catalogue()]

    result = got["run_query"]
    frame = tracesql.query("overlap", runs["hta_trace_filter"], per="step")
    assert [c["name"] for c in result["columns"]] == list(frame.columns)
    assert result["row_count"] == len(frame) == 4 and not result["truncated"]
    assert all(same(v, e) for row, exp in zip(result["rows"], frame_rows(frame)) for v, e in zip(row, exp))
    units = {c["name"]: c.get("unit") for c in result["columns"]}
    assert (units["exposed_comm_ns"], units["overlap_pct"], units["rank"]) == ("ns", "percent (0-100)", None)
    assert result["limits"] == {"time_limit_s": 30.0, "row_limit": 200, "memory_limit": "2GB"}

    con = tracesql.connect(runs["torch_gloo_2rank"])
    expected = con.sql("SELECT kind, count(*), sum(dur) FROM slices GROUP BY ALL ORDER BY 2 DESC, kind").fetchall()
    assert got["run_sql"]["rows"] == [list(r) for r in expected] and got["run_sql"]["row_count"] == len(expected)

    cli = CliRunner().invoke(main, ["diff", str(runs["torch_gloo_2rank"]), str(runs["torch_gloo_4rank_straggler"]),
                                    "--top", "4", "-f", "json"], catch_exceptions=False)
    expected = json.loads(cli.output)
    diffed = got["diff"]
    assert diffed["row_count"] == len(expected) > 0
    assert [dict(zip([c["name"] for c in diffed["columns"]], row)) for row in diffed["rows"]] == expected

    exported = got["export_step"]
    assert (exported["rank"], exported["step"]) == (0, 3)
    assert os.path.getsize(exported["path"]) == exported["bytes"] > 0 and exported["path"].startswith(str(export_dir))
    window = con.sql("SELECT min(ts), max(ts + dur) FROM steps WHERE rank = 0 AND step = 3").fetchall()[0]
    assert tuple(exported["window"]) == window

    assert got["unknown run"] == ("Error executing tool describe_run: nope: no such run here (runs: hta_trace_filter, "
                                  "torch_gloo_2rank, torch_gloo_4rank_straggler)")
    assert "no curated query of that name" in got["unknown query"]
    assert "parameter per = 'week' is not one of" in got["bad parameter"]
    assert {"tracesql://concepts/units", "tracesql://concepts/cost-model"} <= got["resources"]
    assert got["units"] == (REPO / "docs" / "concepts" / "units.md").read_text()
    assert got["overlap_sql"] == queries.find("overlap").sql


@pytest.mark.slow
def test_escapes_through_run_sql_fail_in_one_line(runs, tmp_path):
    """Through the tools, with the server's --memory-limit small: each escape is refused in one line, nothing is
    written, and the next call answers."""
    other_part = next((runs["torch_gloo_2rank"] / "slices").glob("rank*.parquet"))
    tries = {
        "read /etc/passwd": ("SELECT * FROM read_text('/etc/passwd')", "Permission Error"),
        "read another run": (f"SELECT count(*) FROM read_parquet('{other_part}')", "Permission Error"),
        "write a file": (f"COPY (SELECT * FROM slices) TO '{tmp_path / 'out.csv'}'", "Permission Error"),
        "attach a database": (f"ATTACH '{tmp_path / 'x.db'}' AS x", "Permission Error"),
        "install an extension": ("INSTALL httpfs", "Permission Error"),
        "load an extension": ("LOAD httpfs", "Permission Error"),
        "re-enable access": ("SET enable_external_access = true", "Invalid Input Error"),
        "exhaust memory": ("SELECT list(i) FROM range(100000000) t(i)", "Out of Memory Error"),
        "run forever": ("SELECT count(*) FROM range(10000000000) a, range(10) b", "time limit"),
    }

    async def calls(client):
        out = {what: refusal(await client.call_tool("run_sql", {"run": "hta_trace_filter", "sql": sql}))
               for what, (sql, _) in tries.items()}
        out["after"] = answer(await client.call_tool("run_sql", {"run": "hta_trace_filter",
                                                                 "sql": "SELECT count(*) AS n FROM slices"}))
        return out

    got = session([runs["hta_trace_filter"], "--memory-limit", "100MB", "--time-limit", "2"], calls)
    for what, (_, refused) in tries.items():
        prefix = "Error executing tool run_sql: " + ("" if refused == "time limit" else "SQL error: ")
        assert got[what].startswith(prefix + refused), (what, got[what])
    assert got["after"]["rows"] == [[tracesql.connect(runs["hta_trace_filter"]).sql(
        "SELECT count(*) FROM slices").fetchall()[0][0]]]
    assert list(tmp_path.iterdir()) == []


def test_limits_are_kept_and_stated(runs):
    tools = Tools([runs["hta_trace_filter"]], CallLimits(seconds=1, rows=3, memory="100MB"))
    result = tools.run_sql("hta_trace_filter", "SELECT slice_id FROM slices ORDER BY rank, slice_id")
    total = tracesql.connect(runs["hta_trace_filter"]).sql("SELECT count(*) FROM slices").fetchall()[0][0]
    assert (result["returned"], result["row_count"], result["truncated"]) == (3, total, True)
    assert result["limits"] == {"time_limit_s": 1, "row_limit": 3, "memory_limit": "100MB"}
    started = time.perf_counter()
    with pytest.raises(TraceError, match=r"^time limit: stopped after 1 s"):
        tools.run_sql("hta_trace_filter", "SELECT count(*) FROM range(10000000000) a, range(10) b")
    assert time.perf_counter() - started < 10
    with pytest.raises(duckdb.OutOfMemoryException):
        tools.run_sql("hta_trace_filter", "SELECT list(i) FROM range(100000000) t(i)")
    # statements before the last run too (on the call's own connection), and a statement without rows answers
    assert tools.run_sql("hta_trace_filter", "SET VARIABLE k = 'kernel'; SELECT count(*) FROM slices "
                                         "WHERE kind = getvariable('k')")["rows"][0][0] > 0
    with pytest.raises(TraceError, match="no such run here"):
        tools.run_sql(str(runs["torch_gloo_2rank"]), "SELECT 1")  # a folder not served is not opened


def test_one_call_leaves_nothing_for_the_next(runs):
    tools = Tools([runs["hta_trace_filter"]])
    tools.run_sql("hta_trace_filter", "CREATE MACRO kernels() AS TABLE SELECT 1; CREATE OR REPLACE VIEW slices AS "
                                  "SELECT 1 AS x")
    assert tools.run_sql("hta_trace_filter", "SELECT count(*) FROM slices")["rows"][0][0] > 1
    with pytest.raises(duckdb.CatalogException):
        tools.run_sql("hta_trace_filter", "SELECT * FROM kernels()")


def test_the_command_needs_the_extra_and_help_does_not_load_it(runs):
    """Without the SDK: one line saying how to install the extra; `tracesql --help` never imports it."""
    code = ("import sys; sys.modules['mcp'] = None\n"  # an import of mcp now fails, as when it is not installed
            "from tracesql.cli import main; main(['mcp', sys.argv[1]])")
    done = subprocess.run([sys.executable, "-c", code, str(runs["hta_trace_filter"])], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 1
    assert done.stderr == ('Error: tracesql mcp: tracesql mcp needs the [mcp] extra: pip install ".[mcp]" '
                           '(in the checkout) or "tracesql-ml[mcp]"\n')
    done = subprocess.run([sys.executable, "-c", "import sys; from tracesql.cli import main\n"
                           "try: main(['--help'])\nexcept SystemExit: print(sorted(m for m in sys.modules if "
                           "m.split('.')[0] in ('mcp', 'duckdb', 'tracesql.mcp_server')))"],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          timeout=120)
    assert done.stdout.splitlines()[-1] == "[]"


@pytest.mark.parametrize("args, message", [
    (["/no/such/run"], "Error: Invalid value for 'TARGETS...': Path '/no/such/run' does not exist."),
    (["--memory-limit", "lots"], "Error: --memory-limit: 'lots' is not a size like 512MB or 2GB"),
    (["--row-limit", "0"], "Error: Invalid value for '--row-limit'"),
])
def test_bad_arguments_are_one_line_before_serving(runs, args, message):
    done = subprocess.run([sys.executable, "-m", "tracesql", "mcp", str(runs["hta_trace_filter"]), *args],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode in (1, 2) and done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.slow
def test_streamable_http_on_loopback(runs):
    from mcp import Client

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tracesql", "mcp", str(runs["hta_trace_filter"]), "--http",
                               str(port)], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)

        async def go():
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                return answer(await client.call_tool("list_runs", {}))

        assert [r["name"] for r in anyio.run(go)["runs"]] == ["hta_trace_filter"]
    finally:
        server.terminate()
        server.wait(timeout=30)
