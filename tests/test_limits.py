"""Ingest limits: --max-events for a quick look, --memory-limit for DuckDB, and the streamed Kineto path (events
located from the file's head and tail) against the whole-document path."""

from __future__ import annotations

import gzip
import json

import duckdb
import numpy as np
import pytest
from click.testing import CliRunner

import tracesql
from conftest import DATASETS, raw_events
from tracesql import db, functions, ingestion, normalize, store
from tracesql.arrays import array
from tracesql.cli import main
from tracesql.readers import kineto, read_trace

RANK0 = DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz"
XPLANE = DATASETS / "jax_cpu_mlp" / "vm.xplane.pb"


def _count(run, sql="SELECT count(*) FROM slices"):
    return tracesql.connect(run).execute(sql).fetchone()[0]


def test_max_events_reads_the_first_n_events(tmp_path):
    result = tracesql.ingest([RANK0], tmp_path / "run", max_events=1000)
    first = raw_events(RANK0)[:1000]
    timed = [e for e in first if e.get("ph") == "X" or e.get("ph") in ("i", "I")]
    assert _count(tmp_path / "run") == len(timed) == 1000
    assert _count(tmp_path / "run", "SELECT max(slice_id) FROM slices") == 999
    assert result.warnings == [f"{RANK0}: read only the first 1,000 events (--max-events)"]
    # the limit is part of what a source was read with: without it, the file is read again, whole
    again = tracesql.ingest([RANK0], tmp_path / "run")
    assert again.ingested == [RANK0.name] and _count(tmp_path / "run") == 4811


def test_max_events_for_a_reader_that_reads_everything(tmp_path):
    tracesql.ingest([XPLANE], tmp_path / "all", rank=0)
    total = _count(tmp_path / "all")
    result = tracesql.ingest([XPLANE], tmp_path / "run", rank=0, max_events=100)
    assert _count(tmp_path / "run") == 100 < total
    assert _count(tmp_path / "run", "SELECT max(slice_id) FROM slices") == \
        _count(tmp_path / "all", "SELECT max(slice_id) FROM (SELECT slice_id FROM slices ORDER BY 1 LIMIT 100)")
    assert result.warnings[-1] == f"{XPLANE}: kept only the first 100 of {total:,} events (--max-events)"


@pytest.mark.parametrize("args, problem", [
    (["--memory-limit", "lots"], "Error: --memory-limit: 'lots' is not a size like 512MB or 2GB"),
    (["--max-events", "0"], "Error: --max-events: must be at least 1 (got 0)"),
])
def test_bad_limits_are_one_line_errors(tmp_path, args, problem):
    result = CliRunner().invoke(main, ["ingest", str(RANK0), "-o", str(tmp_path / "run"), *args])
    assert result.exit_code == 1 and result.output == problem + "\n"


def test_a_small_memory_limit_gives_the_same_run(tmp_path, ingested):
    tracesql.ingest([DATASETS / "hta_trace_filter"], tmp_path / "run", memory_limit="64MB")
    con = tracesql.connect(tmp_path / "run")
    other = ingested(DATASETS / "hta_trace_filter")
    for table in ("slices", "ops", "collectives"):
        diff = con.execute(f"SELECT count(*) FROM (SELECT * EXCLUDE (run_id) FROM {table} EXCEPT ALL "
                           f"SELECT * EXCLUDE (run_id) FROM read_parquet('{other}/{table}/*.parquet'))")
        assert diff.fetchone()[0] == 0, table


def test_op_costs_get_their_least_memory_under_a_smaller_limit(tmp_path, ingested):
    """The run-wide op_costs query's hash tables take 79-88 MB on one thread on tracelens_b200_eager, more than a
    64MB limit holds (ingestion.OP_COSTS_MIN_MEMORY): the same run as at the default limit."""
    source = DATASETS / "tracelens_b200_eager"
    tracesql.ingest([source], tmp_path / "run", memory_limit="64MB")
    con = tracesql.connect(tmp_path / "run")
    assert con.execute(f"SELECT count(*) FROM (SELECT * EXCLUDE (run_id) FROM op_costs EXCEPT ALL SELECT * "
                       f"EXCLUDE (run_id) FROM read_parquet('{ingested(source)}/op_costs/*.parquet'))").fetchone()[0] \
        == 0 < con.execute("SELECT count(*) FILTER (WHERE counted) FROM op_costs").fetchone()[0]


def test_run_wide_steps_past_the_limit_are_one_line_and_keep_the_run(tmp_path, monkeypatch):
    """What DuckDB cannot spill in the run-wide steps (after every file was read) names the run and the limit in
    one line, and the run already there is left as it was."""
    run = tmp_path / "run"
    tracesql.ingest([NCCL], run)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.suffix != ".lock"}
    monkeypatch.setattr(ingestion, "OP_COSTS_MIN_MEMORY", "8MB")  # under what op_costs needs on this trace
    result = CliRunner().invoke(main, ["ingest", str(DATASETS / "tracelens_b200_eager"), "-o", str(run),
                                       "--memory-limit", "64MB"])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: {run}: the run-wide steps need more memory than --memory-limit 64MB "
                                    "gives DuckDB (Out of Memory Error: ")
    assert result.output.endswith("): ingest it with a larger --memory-limit\n")
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file() and p.suffix != ".lock"} \
        == before


def test_streamed_and_whole_document_paths_agree(tmp_path):
    doc = json.loads(gzip.decompress(RANK0.read_bytes()))
    streamed = tmp_path / "streamed" / "rank-0.json"
    whole = tmp_path / "whole" / "rank-0.json"
    for path in (streamed, whole):
        path.parent.mkdir()
    streamed.write_text(json.dumps(doc))  # traceEvents before scalar fields: located without reading it
    events = doc.pop("traceEvents")
    whole.write_text(json.dumps({**doc, "traceEvents": events, "late": [1, {"x": "]"}]}))  # a list after it
    with open(streamed, "rb") as f:
        start, end, meta = kineto._locate(f, streamed.stat().st_size)
        f.seek(start)
        assert json.loads(f.read(end - start)) == events and meta == {k: v for k, v in doc.items()}
    with open(whole, "rb") as f:  # taken for the array's end: the list after it (DuckDB then refuses the range)
        assert kineto._locate(f, whole.stat().st_size)[1] == whole.stat().st_size - 1
    for path in (streamed, whole):
        tracesql.ingest([path], path.parent / "run")
    con = tracesql.connect(streamed.parent / "run")
    assert con.execute(f"SELECT count(*) FROM (SELECT * EXCLUDE (run_id) FROM slices EXCEPT ALL SELECT * EXCLUDE "
                       f"(run_id) FROM read_parquet('{whole.parent}/run/slices/*.parquet'))").fetchone()[0] == 0
    assert con.execute("SELECT base_time_ns, world_size FROM ranks").fetchone() == \
        tracesql.connect(whole.parent / "run").execute("SELECT base_time_ns, world_size FROM ranks").fetchone()


NCCL = DATASETS / "hta_nccl_parser_config" / "nccl_data.json.gz"
TABLES = ("slices", "ops", "collectives", "memory", "steps", "warnings")


def _same_tables(run, other) -> None:
    con = tracesql.connect(run)
    for table in TABLES:
        diff = con.execute(f"SELECT count(*) FROM (SELECT * EXCLUDE (run_id) FROM {table} EXCEPT ALL "
                           f"SELECT * EXCLUDE (run_id) FROM read_parquet('{other}/{table}/*.parquet'))")
        assert diff.fetchone()[0] == 0, table


def test_linking_in_a_scratch_database_gives_the_same_run(tmp_path, ingested, monkeypatch):
    """The path big traces take (links computed in a DuckDB file that spills beyond --memory-limit), forced on
    a small trace, with the nesting walk crossing many batch boundaries."""
    monkeypatch.setattr(normalize, "ON_DISK_ROWS", 0)
    monkeypatch.setattr(normalize, "NEST_BATCH", 1000)
    tracesql.ingest([NCCL], tmp_path / "run", memory_limit="64MB", jobs=1)
    _same_tables(tmp_path / "run", ingested(NCCL))


def test_event_table_in_a_scratch_database_gives_the_same_run(tmp_path, ingested, monkeypatch):
    """The path events JSON over half of --memory-limit takes (DuckDB's event table in a database file), forced
    on a small trace."""
    databases = []
    connect = db.connect

    def recording(*args, database=None, **kwargs):
        databases.append(database)
        return connect(*args, database=database, **kwargs)

    monkeypatch.setattr(kineto, "_ON_DISK_SHARE", 0)
    monkeypatch.setattr(db, "connect", recording)
    tracesql.ingest([NCCL], tmp_path / "run", memory_limit="64MB", jobs=1)
    assert any(d is not None and d.name == "events.duckdb" for d in databases), databases
    _same_tables(tmp_path / "run", ingested(NCCL))


def test_a_kept_connection_moves_to_the_next_scratch_folder_unless_it_spilled(tmp_path, monkeypatch):
    """The next ingest (another scratch folder) and the run-wide steps (another thread count) get the connection
    kept before, its macros made, its temporary files set to spill in their folder; one that spilled into the
    folder before cannot move (DuckDB keeps it): a new one is opened, and it works."""
    monkeypatch.setattr(db, "_kept", {})
    first, second, third = (tmp_path / name for name in ("first", "second", "third"))
    for folder in (first, second, third):
        folder.mkdir()

    def spill_folder(con) -> str:
        return con.execute("SELECT current_setting('temp_directory')").fetchone()[0]

    monkeypatch.setattr("tempfile.tempdir", str(first))
    with db.for_trace(2, "64MB") as con:
        functions.install(con, names={"op_dtype"})
        kept = con
    monkeypatch.setattr("tempfile.tempdir", str(second))
    with db.for_trace(1, "64MB") as con:
        assert con is kept and spill_folder(con).startswith(str(second))
        assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
        assert con.execute("SELECT op_dtype(['c10::BFloat16'])").fetchone()[0] == "bf16"
        con.execute("SELECT count(DISTINCT s) FROM (SELECT md5(range::VARCHAR) AS s FROM range(2000000))").fetchall()
        assert list(second.glob("tracesql-spill-*/*")), "nothing spilled: the test does not test the move it means"
    monkeypatch.setattr("tempfile.tempdir", str(third))
    with db.for_trace(1, "64MB") as con:
        assert con is not kept and spill_folder(con).startswith(str(third))
        assert con.execute("SELECT count(*) FROM range(3)").fetchone()[0] == 3


def test_links_follow_the_readers_row_order(tmp_path):
    """Readers may give slices in any order (DuckDB's threads, begin/end pairs): the links line up by row."""
    data = read_trace(NCCL)[0]
    shuffled = read_trace(NCCL)[0]
    shuffled.slices = shuffled.slices.take(array(np.random.default_rng(7).permutation(shuffled.slices.num_rows)))
    tables = {}
    for name, trace in (("read", data), ("shuffled", shuffled)):
        with store.PartWriter(tmp_path / name, "part.parquet") as writer:
            normalize.normalize(trace, "run", 0, on_table=writer.write)
    con = duckdb.connect()
    for table in TABLES:
        a, b = (f"read_parquet('{tmp_path / name / table / 'part.parquet'}')" for name in ("read", "shuffled"))
        assert con.sql(f"SELECT count(*) FROM (SELECT * FROM {a} EXCEPT ALL SELECT * FROM {b})").fetchall() == [(0,)]
        tables[table] = con.sql(f"SELECT count(*) FROM {a}").fetchall()[0][0]
    assert tables["slices"] == 26935 and tables["ops"] > 10000 and tables["collectives"] > 0
