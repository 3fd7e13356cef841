"""Several processes at once, as CI jobs and dashboards do it: two ingests of one run, reading while an ingest
publishes, an ingest killed with SIGKILL at any moment. Real processes (the CLI), real traces."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import tracesql
from conftest import DATASETS, REPO

pytestmark = pytest.mark.concurrency
from tracesql import engine, store  # (tracesql.engine: imported, not only reached as an attribute)

A = DATASETS / "hta_trace_filter"  # 2 ranks, 9,487 slices
B = DATASETS / "torch_gloo_2rank"
ENV = {**os.environ, "PYTHONPATH": str(REPO)}

READER = """
import json, os, sys, tracesql
run, stop, sql = sys.argv[1], sys.argv[2], sys.argv[3]
last = False
while not last:
    last = os.path.exists(stop)  # one more answer after the writer is done
    try:
        row = tracesql.query(sql, run).iloc[0]
        print(json.dumps([int(row.slices), list(row.sources), int(row.ops)]), flush=True)
    except Exception as e:
        print(json.dumps(["error", type(e).__name__, str(e)]), flush=True)
"""


def _ingest_cmd(source, run):
    return [sys.executable, "-m", "tracesql", "ingest", str(source), "-o", str(run), "-q", "-j", "1"]


def _state(run):
    """What a reader sees: slices, sources, ops."""
    con = tracesql.connect(run)
    return list(con.execute("SELECT (SELECT count(*) FROM slices), (SELECT list(source_path ORDER BY source_path) "
                            "FROM ranks), (SELECT count(*) FROM ops)").fetchone())


def _files(run):
    return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def expected(tmp_path_factory):
    """The state of a run of A and of a run of B, ingested alone."""
    base = tmp_path_factory.mktemp("expected")
    tracesql.ingest([A], base / "a")
    tracesql.ingest([B], base / "b")
    return {"a": _state(base / "a"), "b": _state(base / "b")}


def _consistent(run):
    """Every file of every table belongs to a source of the manifest, and every source has its files."""
    manifest = store.load_manifest(run)
    parts = {part for entry in manifest["sources"].values() for part in entry["parts"]}
    for table in tracesql.schema.TABLES:
        files = {p.name for p in (run / table).glob("*.parquet")} - {store.RUN_CHECKS}
        assert files == parts, table


def test_two_ingests_of_one_run_at_once(tmp_path, expected):
    run = tmp_path / "fleet" / "run"
    procs = [subprocess.Popen(_ingest_cmd(src, run), env=ENV, stderr=subprocess.PIPE, text=True) for src in (A, B)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    _consistent(run)
    assert _state(run) in (expected["a"], expected["b"])  # one ingest, then the other: never a mix
    assert sorted(p.name for p in (tmp_path / "fleet").iterdir()) == [".run.lock", "run"]


def test_readers_see_the_old_or_the_new_run_while_ingests_publish(tmp_path, expected):
    run = tmp_path / "run"
    tracesql.ingest([A], run)
    stop = tmp_path / "stop"
    sql = tmp_path / "state.sql"
    sql.write_text("SELECT (SELECT count(*) FROM slices) AS slices, (SELECT list(source_path ORDER BY source_path) "
                   "FROM ranks) AS sources, (SELECT count(*) FROM ops) AS ops")
    reader = subprocess.Popen([sys.executable, "-c", READER, str(run), str(stop), str(sql)], env=ENV,
                              stdout=subprocess.PIPE, text=True)
    seen = [json.loads(reader.stdout.readline())]  # it reads A before the first swap, and B after the last
    for source in (B, A, B):
        subprocess.run(_ingest_cmd(source, run), env=ENV, check=True)
    stop.touch()
    seen += [json.loads(line) for line in reader.communicate(timeout=120)[0].splitlines()]
    errors = [s for s in seen if s[0] == "error"]
    assert not errors, errors[:3]
    assert all(s in (expected["a"], expected["b"]) for s in seen)
    assert seen[0] == expected["a"] and seen[-1] == expected["b"]


@pytest.mark.parametrize("first", [True, False], ids=["new run", "existing run"])
def test_ingest_killed_at_any_moment_leaves_nothing_that_looks_valid(tmp_path, expected, first):
    fleet = tmp_path / "fleet"
    run = fleet / "run"
    if not first:
        tracesql.ingest([A], run)
        before = _files(run)
    outcomes = set()
    for delay in (0.3, 0.8, 1.3, 1.8, 2.3, 2.8):
        proc = subprocess.Popen(_ingest_cmd(B, run), env=ENV)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # the run is the previous one, byte for byte, or the new one, complete
        if run.exists() and _files(run) != (before if not first else None):
            _consistent(run)
            assert _state(run) == expected["b"]
            outcomes.add("new")
            shutil.rmtree(run)
            if not first:
                tracesql.ingest([A], run)
                before = _files(run)
        else:
            outcomes.add("old")
        # leftovers are hidden and never taken for runs of the fleet
        runs = tracesql.engine.resolve(fleet) if run.exists() else []
        assert runs in ([], [run])
    assert "old" in outcomes  # the kills did land mid-ingest
    leftovers = [p.name for p in fleet.iterdir() if p.name.startswith(".run.staging")]
    tracesql.ingest([B], run)  # the next ingest of the run removes them
    assert sorted(p.name for p in fleet.iterdir()) == [".run.lock", "run"], leftovers
    assert _state(run) == expected["b"]


def test_a_reader_waits_while_the_first_ingest_of_a_run_holds_its_lock(tmp_path):
    run = tmp_path / "run"
    locker = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, tracesql, tracesql.store\n"
        "from pathlib import Path\n"
        "with tracesql.store.locked(Path(sys.argv[1])):\n"
        "    print('locked', flush=True)\n"
        "    time.sleep(1.5)\n"
        "    tracesql.ingest([sys.argv[2]], sys.argv[1] + '.tmp')\n"
        "    Path(sys.argv[1] + '.tmp').rename(sys.argv[1])\n"), str(run), str(A)],
        env=ENV, stdout=subprocess.PIPE, text=True)
    assert locker.stdout.readline() == "locked\n"
    assert store.being_written(run)
    t0 = time.monotonic()
    assert tracesql.engine.resolve(run) == [run]  # waited for it instead of taking `run` for missing traces
    assert time.monotonic() - t0 > 0.5
    locker.wait(timeout=60)


def test_a_query_that_loses_a_file_to_a_swap_runs_again_on_the_new_run(tmp_path):
    import duckdb

    tracesql.ingest([A], tmp_path / "run")
    attempts = []

    def work(con):
        attempts.append(con)
        if len(attempts) == 1:  # what DuckDB says when a globbed file is gone by the time it opens it
            raise duckdb.IOException('IO Error: Cannot open file "x.parquet": No such file or directory')
        return con.execute("SELECT count(*) FROM ranks").fetchone()[0]

    assert tracesql.engine.on_fresh_connection(tmp_path / "run", work) == 2 and len(attempts) == 2

    def broken(con):
        raise duckdb.IOException("IO Error: disk on fire")

    with pytest.raises(duckdb.IOException, match="disk on fire"):
        tracesql.engine.on_fresh_connection(tmp_path / "run", broken)
