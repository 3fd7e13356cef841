"""What users do: the CLI, Python sessions, plain DuckDB clients, fleets of runs, raw traces on the fly."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import tracesql
from conftest import DATASETS, REPO, raw_events, write_trace
from tracesql import queries, schema
from tracesql.cli import main

TRACE_FILTER = DATASETS / "hta_trace_filter"


def cli(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)


def test_views_have_the_schema_types(ingested):
    con = tracesql.connect(ingested(TRACE_FILTER))
    for name, table in schema.TABLES.items():
        described = con.execute(f"DESCRIBE {name}").fetchall()
        assert [(r[0], r[1]) for r in described] == [(c.name, c.type) for c in table.columns], name


def test_parquet_files_are_plain_parquet_with_the_schema(ingested):
    run = ingested(TRACE_FILTER)
    (runs_file,) = (run / "runs").iterdir()  # the runs table: one file per run, not per rank
    assert re.fullmatch(r"run-[0-9a-f]{12}\.parquet", runs_file.name)
    assert pq.read_schema(runs_file).names == schema.TABLES["runs"].column_names
    for name in set(schema.TABLES) - set(schema.RUN_TABLES):
        files = sorted((run / name).glob("rank*.parquet"))
        assert len(files) == 2, name  # one per rank (and `warnings` has the run's own checks besides)
        others = sorted({p.name for p in (run / name).iterdir()} - {f.name for f in files})
        assert len(others) == (name == "warnings") and all(re.fullmatch(r"run-checks-[0-9a-f]{12}\.parquet", o)
                                                           for o in others)
        assert pq.read_schema(files[0]).names == schema.TABLES[name].column_names


def test_plain_duckdb_client_sees_tables_and_macros(ingested, tmp_path):
    """init.sql in the run: a DuckDB session that never imports tracesql gets the views and the functions."""
    run = ingested(TRACE_FILTER)
    script = (
        "import duckdb, os, sys\n"
        f"os.chdir({str(run)!r})\n"
        "con = duckdb.connect()\n"
        "con.execute(open('init.sql').read())\n"
        "print(con.execute(\"SELECT count(*) FROM slices WHERE kind = 'kernel'\").fetchone()[0])\n"
        "print(con.execute(\"SELECT dtype_bytes('c10::BFloat16'), collective_kind('_allgather_base')\").fetchone())\n"
        "print(con.execute(open(sys.argv[1]).read()).fetchall()[0][-1])\n"
        "print('tracesql' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(queries.find("overlap").path)],
                         capture_output=True, text=True, cwd=tmp_path, check=True).stdout.split("\n")
    kernels = sum(1 for f in TRACE_FILTER.glob("*.json.gz") for e in raw_events(f) if e.get("cat") == "kernel")
    assert out[0] == str(kernels) == "2258"
    assert out[1] == "(2, 'all_gather')"
    assert out[2] == "14.95"  # overlap_pct of rank 0 with the defaults, same as through tracesql
    assert out[3] == "False"


def test_fleet_folder_reads_as_one_dataset(tmp_path):
    tracesql.ingest([TRACE_FILTER / "sampled_rank-0.json.gz"], tmp_path / "fleet" / "run-a")
    tracesql.ingest([DATASETS / "tracelens_mi210_gpu_only"], tmp_path / "fleet" / "run-b")
    df = tracesql.query("temporal_breakdown", tmp_path / "fleet")
    assert sorted(df.run_id) == ["run-a", "run-b"]


def test_raw_traces_are_ingested_into_the_cache_once(tmp_path):
    first = tracesql.query("overlap", TRACE_FILTER)
    assert list(first.overlap_pct) == [14.95, 19.93]
    cached = list(Path(os.environ["TRACESQL_CACHE"]).glob("hta_trace_filter-*"))
    assert len(cached) == 1
    before = {p: p.stat().st_mtime_ns for p in cached[0].rglob("*.parquet")}
    assert list(tracesql.query("overlap", TRACE_FILTER).overlap_pct) == [14.95, 19.93]
    assert {p: p.stat().st_mtime_ns for p in cached[0].rglob("*.parquet")} == before


def test_cli_ingest_query_formats(tmp_path):
    result = cli("ingest", TRACE_FILTER, "-o", tmp_path / "run")
    assert result.exit_code == 0 and "2 file(s) ingested" in result.output and "2 rank(s)" in result.output
    assert cli("ingest", TRACE_FILTER, "-o", tmp_path / "run").output.endswith("up to date (2 files unchanged)\n")

    csv = cli("query", "overlap.sql", tmp_path / "run", "-p", "class_scheme=hta", "-p", "analysis_window=hta",
              "-f", "csv").output.splitlines()
    assert csv[0].startswith("run_id,rank,device_id,") and csv[0].endswith(",overlap_pct")
    assert csv[1].endswith(",11.81") and csv[2].endswith(",20.05")
    rows = json.loads(cli("query", "temporal_breakdown", tmp_path / "run", "-f", "json").output)
    assert [r["idle_pct"] for r in rows] == [55.21, 52.89]
    assert cli("query", "overlap", tmp_path / "run", "-f", "markdown").output.startswith("| run_id | rank |")
    table = cli("query", "overlap", tmp_path / "run").output
    assert "overlap_pct" in table and "(2 rows)" in table
    cli("query", "hotspots", tmp_path / "run", "-f", "parquet", "-o", tmp_path / "hot.parquet")
    assert pq.read_table(tmp_path / "hot.parquet").num_rows == 40

    mine = tmp_path / "mine.sql"
    mine.write_text("-- mine: kernels per stream\nSELECT stream, count(*) AS n FROM slices "
                    "WHERE kind = 'kernel' AND rank = 0 GROUP BY 1 ORDER BY 1;\n")
    per_stream = collections.Counter(e["args"]["stream"] for e in raw_events(TRACE_FILTER / "sampled_rank-0.json.gz")
                                     if e.get("cat") == "kernel")
    expected = "stream,n\n" + "".join(f"{k},{v}\n" for k, v in sorted(per_stream.items()))
    assert cli("query", mine, tmp_path / "run", "-f", "csv").output == expected


def test_cli_errors_are_one_line(tmp_path):
    bad = tmp_path / "rank-0.json"
    bad.write_text("{not json")
    for args, message in [
        (("ingest", bad, "-o", tmp_path / "run"), f"Error: {bad}: not a trace tracesql can read"),
        (("query", "overlap", tmp_path / "missing"), f"Error: {tmp_path / 'missing'}: no such file or folder"),
        (("query", "nope", TRACE_FILTER), "Error: nope: no such query file or curated query"),
        (("query", "overlap", TRACE_FILTER, "-p", "x=1"), "unknown parameter x"),
    ]:
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 1, args
        assert message in result.output and result.output.count("\n") == 1, result.output
    sql_error = tmp_path / "broken.sql"
    sql_error.write_text("SELECT nope FROM slices;")
    result = CliRunner().invoke(main, ["query", str(sql_error), str(TRACE_FILTER)])
    assert result.exit_code == 1 and result.output.startswith("Error: SQL error: Binder Error")


def test_cli_catalogue_schema_and_shell(ingested):
    listing = cli("queries").output.splitlines()
    assert any(line.startswith("overlap ") for line in listing) and len(listing) == len(queries.catalogue())
    assert "slices: Every timed event" in cli("schema").output
    assert "| `launch_id` | BIGINT |" in cli("schema", "--format", "markdown").output
    shell = cli("shell", ingested(TRACE_FILTER), input="SELECT count(*) AS n\nFROM ranks;\n.tables\n")
    assert "n" in shell.output and "2" in shell.output and "slices  ops" in shell.output


def test_installed_package_finds_its_queries(tmp_path):
    """From another folder, the installed command lists the curated queries (they ship inside the package)."""
    out = subprocess.run([sys.executable, "-m", "tracesql", "queries"], capture_output=True, text=True,
                         cwd=tmp_path, check=True, env={**os.environ, "PYTHONPATH": ""}).stdout
    assert "overlap" in out and "temporal_breakdown" in out
    location = subprocess.run([sys.executable, "-c", "import tracesql.queries as q; print(q.queries_dir())"],
                              capture_output=True, text=True, cwd=tmp_path, check=True).stdout.strip()
    assert location.endswith("queries") and (location.startswith(str(REPO)) or "site-packages" in location)


@pytest.mark.parametrize("name", schema.TABLES)
def test_every_table_is_documented(name):
    for column in schema.TABLES[name].columns:
        assert column.doc and column.type, (name, column.name)
    duckdb.connect().execute(f"SELECT {schema.select_list(name)} FROM (SELECT {', '.join('NULL AS ' + c for c in schema.TABLES[name].column_names)})")


def _kernels(n: int, dur_us: float, launched: bool) -> list[dict]:
    events = [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#1", "ts": 0, "dur": 10 * n + 10, "pid": 1, "tid": 1}]
    for i in range(n):
        ts = 5 + 10 * i + 0.25
        if launched:
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts - 1, "dur": 0.5,
                           "pid": 1, "tid": 1, "args": {"correlation": i + 1}})
        events.append({"ph": "X", "cat": "kernel", "name": "gemm", "ts": ts, "dur": dur_us, "pid": 0, "tid": 7,
                       "args": {"correlation": i + 1, "device": 0, "stream": 7}})
    return events


@pytest.mark.parametrize("events, args, note", [
    ([{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 0, "dur": 5, "pid": 1, "tid": 1}], [],
     "no rows: overlap needs device kernels (a GPU/accelerator trace): this run has no device events"),
    (_kernels(5, 0.5, launched=True), ["-p", "time_unit_ns=1000"],
     "time_unit_ns = 1000 rounds every one of the run's 5 device events to zero length (each lies within one "
     "time unit, as in HTA): no device time is counted"),
    # two steps, kernels whose correlation ids have no launch in the trace: HTA's window keeps none
    (_kernels(5, 3, launched=False) + [{"ph": "X", "cat": "cpu_op", "name": "ProfilerStep#2", "ts": 70, "dur": 5,
                                         "pid": 1, "tid": 1}], ["-p", "analysis_window=hta"],
     "no rows: analysis_window = 'hta' keeps none of the run's 5 device events"),
])
def test_no_rows_says_why(events, args, note, tmp_path):
    trace = write_trace(tmp_path / "t.json", events)
    result = cli("query", "overlap", trace, *args)
    assert result.exit_code == 0 and f"Note: {note}" in result.output, result.output


def _rows(con, names=("overlap", "roofline", "hotspots", "critical_path", "steps")):
    return {name: queries.run(con, queries.find(name)).fetchall() for name in names}


def test_sessions_attach_the_macros_compiled_once(ingested, tmp_path, monkeypatch):
    """tracesql.connect attaches the macros from one database file in the cache, made by the first session and
    reused by the next; the queries (the cost model's formulas and the critical path's macro among them) give
    the rows a session that creates every macro itself gives."""
    from tracesql import engine, functions

    run = ingested(TRACE_FILTER)
    monkeypatch.setenv("TRACESQL_CACHE", str(tmp_path))
    first = tracesql.connect(run)
    made = list((tmp_path / "functions").iterdir())
    assert len(made) == 1 and made[0].suffix == ".duckdb"
    stamp = made[0].stat().st_mtime_ns
    second = tracesql.connect(run)
    assert list((tmp_path / "functions").iterdir()) == made and made[0].stat().st_mtime_ns == stamp
    assert second.execute("SELECT current_setting('search_path')").fetchall()[0][0].endswith(
        f",{functions.COMPILED}.main")
    # the same session, its macros created in it (no cache): what tracesql did before
    monkeypatch.setattr(engine, "cache_root", lambda: None)
    plain = tracesql.connect(run)
    assert plain.execute(f"SELECT count(*) FROM duckdb_databases() WHERE database_name = '{functions.COMPILED}'"
                         ).fetchall()[0][0] == 0
    assert _rows(second) == _rows(plain) and _rows(first)["overlap"] == _rows(plain)["overlap"]
    for con in (first, second, plain):
        con.close()


def test_each_session_edits_its_own_data_tables(ingested, tmp_path, monkeypatch):
    """The data tables (device peaks, kernel classes) are each session's, as before: a row one session adds is
    not in another's; a temporary macro a session makes comes before the attached one (findings relies on it)."""
    monkeypatch.setenv("TRACESQL_CACHE", str(tmp_path))
    run = ingested(TRACE_FILTER)
    one, two = tracesql.connect(run), tracesql.connect(run)
    before = two.execute("SELECT count(*) FROM device_peaks").fetchall()[0][0]
    one.execute("INSERT INTO device_peaks SELECT * FROM device_peaks LIMIT 1")
    assert one.execute("SELECT count(*) FROM device_peaks").fetchall()[0][0] == before + 1
    assert two.execute("SELECT count(*) FROM device_peaks").fetchall()[0][0] == before
    one.execute("CREATE TEMP MACRO arithmetic_intensity(flops, bytes) AS -1")
    assert one.execute("SELECT arithmetic_intensity(8, 2)").fetchall() == [(-1,)]
    assert two.execute("SELECT arithmetic_intensity(8, 2)").fetchall() == [(4.0,)]


def test_a_cache_that_cannot_be_written_or_read_leaves_the_macros_in_the_session(ingested, tmp_path, monkeypatch):
    """Where the cache folder cannot be made (a file is in the way), or its file cannot be attached (damaged),
    each session creates the macros itself: slower to open, the same answers."""
    from tracesql import functions

    run = ingested(TRACE_FILTER)
    blocked, damaged = tmp_path / "blocked", tmp_path / "damaged"
    blocked.mkdir()
    (blocked / "functions").write_text("not a folder")
    # a file of the right name that is not a DuckDB database (a disk's damage): refused, and made in the session
    functions.compiled(damaged).write_bytes(b"not a database" * 100)
    for cache in (blocked, damaged):
        monkeypatch.setenv("TRACESQL_CACHE", str(cache))
        con = tracesql.connect(run)
        assert con.execute(f"SELECT count(*) FROM duckdb_databases() WHERE database_name = '{functions.COMPILED}'"
                           ).fetchall()[0][0] == 0
        assert con.execute("SELECT count(*) FROM duckdb_functions() WHERE function_name = 'op_flops'"
                           ).fetchall()[0][0] == 1
        assert _rows(con, ("overlap",))["overlap"][0][5] == 396_199_000  # rank 0's communication ns (README)
        con.close()
