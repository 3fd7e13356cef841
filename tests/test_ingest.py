"""Ingest as users run it: bad input gives one clear line, failures leave the run as it was, unchanged files
are not read again, several ranks ingest together."""

from __future__ import annotations

import gzip
import os
import shutil

import pytest

import tracesql
from conftest import DATASETS, write_trace

GOOD = DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz"


def _files(run):
    return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


BAD_INPUTS = {
    "truncated gzip": (lambda: GOOD.read_bytes()[:5000], "truncated gzip"),
    "truncated JSON": (lambda: gzip.decompress(GOOD.read_bytes())[:100_000], "not valid JSON (Input data was truncated)"),
    "not JSON": (lambda: b"step,time\n1,2\n", "not a trace tracesql can read"),
    "JSON list of events without times": (lambda: b'[{"ph": "X"}]', "no timed events"),
    "JSON list of numbers": (lambda: b'[1, 2, "ph"]', "no timed events"),
    "truncated JSON list": (lambda: b'[{"ph": "X", "ts": 1, "dur": 2}, {"ph": "X", "ts"', "not valid JSON"),
    "JSON without traceEvents": (lambda: b'{"schemaVersion": 1, "deviceProperties": []}',
                                 "not a trace: JSON object has no 'traceEvents'"),
    "empty traceEvents": (lambda: b'{"schemaVersion": 1, "traceEvents": []}', "empty trace: 'traceEvents' has no events"),
    "traceEvents not a list": (lambda: b'{"schemaVersion": 1, "traceEvents": 3}', "'traceEvents' is not a list"),
    "only metadata": (lambda: b'{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {}}]}',
                      "no timed events"),
    "empty file": (lambda: b"", "empty file"),
    "binary": (lambda: bytes(range(256)) * 10, "not a trace tracesql can read"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_naming_the_file(case, tmp_path):
    content, problem = BAD_INPUTS[case]
    bad = tmp_path / "rank-0.json.gz"
    bad.write_bytes(content())
    with pytest.raises(tracesql.TraceError) as err:
        tracesql.ingest([bad], tmp_path / "run")
    message = str(err.value)
    assert message.startswith(str(bad) + ": ") and problem in message and "\n" not in message
    assert not (tmp_path / "run").exists()
    # no staging folder left behind (the lock file stays: removing it would race with a waiting ingest)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.lock", "rank-0.json.gz"]


def test_failed_ingest_leaves_the_previous_run_untouched(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(GOOD, traces / "rank-0.json.gz")
    run = tmp_path / "run"
    tracesql.ingest([traces], run)
    before = _files(run)
    shutil.copy(DATASETS / "hta_trace_filter" / "sampled_rank-1.json.gz", traces / "rank-1.json.gz")
    (traces / "rank-2.json.gz").write_bytes(GOOD.read_bytes()[:3000])  # a rank killed mid-write
    with pytest.raises(tracesql.TraceError, match="rank-2.json.gz: truncated gzip"):
        tracesql.ingest([traces], run)
    assert _files(run) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.lock", "run", "traces"]


def test_reingest_does_no_work_and_picks_up_changes(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    shutil.copy(GOOD, traces / "rank-0.json.gz")
    run = tmp_path / "run"
    first = tracesql.ingest([traces], run)
    assert first.ingested == ["rank-0.json.gz"]
    mtimes = {p: p.stat().st_mtime_ns for p in run.rglob("*.parquet")}

    again = tracesql.ingest([traces], run)
    assert not again.changed and again.reused == ["rank-0.json.gz"]
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*.parquet")} == mtimes

    shutil.copy(DATASETS / "hta_trace_filter" / "sampled_rank-1.json.gz", traces / "rank-1.json.gz")
    added = tracesql.ingest([traces], run)
    assert added.ingested == ["rank-1.json.gz"] and added.reused == ["rank-0.json.gz"]
    con = tracesql.connect(run)
    assert con.execute("SELECT list(DISTINCT rank ORDER BY rank) FROM slices").fetchone()[0] == [0, 1]

    os.remove(traces / "rank-1.json.gz")
    removed = tracesql.ingest([traces], run)
    assert removed.removed == ["rank-1.json.gz"]
    assert tracesql.connect(run).execute("SELECT count(DISTINCT rank) FROM slices").fetchone()[0] == 1


def test_rank_sources_and_conflicts(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 1.0, "dur": 1.0, "pid": 1, "tid": 1}]
    a = write_trace(tmp_path / "worker3.json", events)
    b = write_trace(tmp_path / "trace.json", events, distributedInfo={"rank": 5, "world_size": 8})
    tracesql.ingest([a, b], tmp_path / "run")
    con = tracesql.connect(tmp_path / "run")
    assert con.execute("SELECT rank, world_size, source_path FROM ranks ORDER BY rank").fetchall() == \
        [(3, None, "worker3.json"), (5, 8, "trace.json")]

    c = write_trace(tmp_path / "rank-3.json", events)
    with pytest.raises(tracesql.TraceError, match="rank 3 is also the rank of"):
        tracesql.ingest([a, c], tmp_path / "clash")
    unnamed = write_trace(tmp_path / "other.json", events)
    with pytest.raises(tracesql.TraceError, match="cannot tell which rank"):
        tracesql.ingest([a, unnamed], tmp_path / "unnamed")
    tracesql.ingest([unnamed], tmp_path / "given", rank=11)
    assert tracesql.connect(tmp_path / "given").execute("SELECT rank FROM ranks").fetchall() == [(11,)]


def test_refuses_to_write_into_a_folder_that_is_not_a_run(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(tracesql.TraceError, match="exists and is not a tracesql run"):
        tracesql.ingest([GOOD], tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


def test_parallel_ingest_equals_serial(tmp_path, monkeypatch):
    """Two worker processes (jobs=2 wins over $TRACESQL_JOBS) give the run that one process gives; $TRACESQL_JOBS=1
    (the test session's default, set here too) reads the files in this process: no pool is started."""
    from tracesql import ingestion

    monkeypatch.setenv("TRACESQL_JOBS", "1")
    parallel = tracesql.ingest([DATASETS / "hta_trace_filter"], tmp_path / "parallel", jobs=2)
    monkeypatch.setattr(ingestion, "ProcessPoolExecutor", None)
    tracesql.ingest([DATASETS / "hta_trace_filter"], tmp_path / "serial")
    assert parallel.ingested == ["sampled_rank-0.json.gz", "sampled_rank-1.json.gz"]
    con = tracesql.connect(tmp_path / "parallel")
    for table in ("slices", "ops", "collectives", "steps"):
        diff = con.execute(f"SELECT count(*) FROM (SELECT * EXCLUDE (run_id) FROM {table} EXCEPT ALL "
                           f"SELECT * EXCLUDE (run_id) FROM read_parquet('{tmp_path}/serial/{table}/*.parquet'))")
        assert diff.fetchone()[0] == 0


def test_a_folder_mixing_formats_ingests_in_one_command(tmp_path):
    """Kineto, XPlane, Perfetto and generic Chrome JSON side by side: one run, a rank each (from distributedInfo
    or the file name), and every curated query answers over all of them."""
    from tracesql import queries

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz", mixed)
    shutil.copy(DATASETS / "jax_cpu_mlp" / "vm.xplane.pb", mixed / "rank-1.xplane.pb")
    shutil.copy(DATASETS / "chromium_perfetto" / "chromium.perfetto-trace.gz", mixed / "rank-2.perfetto-trace.gz")
    shutil.copy(DATASETS / "viztracer_counters" / "viz_trace.json", mixed / "rank-3.json")
    result = tracesql.ingest([mixed], tmp_path / "run")
    assert len(result.ingested) == 4
    con = tracesql.connect(tmp_path / "run")
    assert con.execute("SELECT rank, source_format FROM ranks ORDER BY 1").fetchall() == [
        (0, "kineto"), (1, "xplane"), (2, "perfetto"), (3, "chrome")]
    assert con.execute("SELECT count(DISTINCT rank) FROM slices").fetchall() == [(4,)]
    for query in queries.catalogue():
        queries.run(con, query).fetchall()


def test_a_run_that_cannot_be_written_is_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("a file where the run's folder would be")
    with pytest.raises(tracesql.TraceError) as err:
        tracesql.ingest([GOOD], tmp_path / "notes.txt" / "run")
    assert str(err.value) == f"{tmp_path / 'notes.txt'}: cannot write the run: File exists"
