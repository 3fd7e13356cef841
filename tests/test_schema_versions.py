"""Runs written by another schema version: older ones are read (what they lack reads as empty) with a note,
newer ones and ones too old are refused with a message saying what to do. Real run folders whose manifest
version is edited, as a run of that version would have it."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner

import tracesql
from conftest import DATASETS
from tracesql import schema
from tracesql.cli import main
from tracesql.errors import OlderSchemaWarning

GOOD = DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz"


def _run_of_version(tmp_path, version, drop_tables=()):
    run = tmp_path / "run"
    tracesql.ingest([GOOD], run)
    for table in drop_tables:  # what that version did not write
        shutil.rmtree(run / table)
    manifest = json.loads((run / "tracesql.json").read_text())
    if drop_tables:  # written before manifests listed the run's files
        manifest.pop("files")
    (run / "tracesql.json").write_text(json.dumps({**manifest, "schema_version": version}))
    return run


def _files(run):
    return {p.relative_to(run): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


NEWER = schema.SCHEMA_VERSION + 1
SINCE_1 = "; ".join(schema.SCHEMA_CHANGES[v] for v in range(2, schema.SCHEMA_VERSION + 1))


def test_current_version_and_its_history_is_recorded():
    assert schema.SCHEMA_VERSION >= 4 and set(schema.SCHEMA_CHANGES) == set(range(1, schema.SCHEMA_VERSION + 1))
    assert all(t in schema.SCHEMA_CHANGES[2] and t in schema.TABLES for t in ("warnings", "counters"))
    assert "xla_ops" in schema.SCHEMA_CHANGES[3] and "xla_ops" in schema.TABLES
    assert "prefill_tokens" in schema.SCHEMA_CHANGES[4] and "prefill_tokens" in schema.TABLES["steps"].column_names
    assert "fwd_op_id" in schema.SCHEMA_CHANGES[5] and "fwd_op_id" in schema.TABLES["ops"].column_names
    assert all(c in schema.SCHEMA_CHANGES[8] and c in schema.TABLES["slices"].column_names
               for c in ("launch_ts", "launch_dur", "launch_pid", "launch_tid"))


def test_older_run_is_read_with_a_note(tmp_path):
    run = _run_of_version(tmp_path, 1, drop_tables=["warnings", "counters"])
    with pytest.warns(OlderSchemaWarning) as notes:
        con = tracesql.connect(run)
    assert str(notes[0].message) == (
        f"{run}: written with schema version 1, read as version {schema.SCHEMA_VERSION} (since then: {SINCE_1}; "
        "what it lacks reads as empty — re-ingest to fill it)")
    assert con.execute("SELECT count(*) FROM slices").fetchone()[0] == 4811  # as a current run of it has
    assert con.execute("SELECT count(*) FROM warnings").fetchone()[0] == 0
    types = [r[1] for r in con.execute("DESCRIBE warnings").fetchall()]
    assert types == [c.type for c in schema.TABLES["warnings"].columns]

    result = CliRunner().invoke(main, ["query", "overlap", str(run), "-f", "csv"])
    assert result.exit_code == 0
    assert result.stderr.startswith(f"Note: {run}: written with schema version 1, read as version {schema.SCHEMA_VERSION}")
    assert result.stdout.splitlines()[1].startswith("run,0,0,")
    info = CliRunner().invoke(main, ["info", str(run)])
    assert ("schema:    version 1 (written by tracesql 0.1.0); written with schema version 1, read as version "
            f"{schema.SCHEMA_VERSION}") in info.output and "warnings:  none" in info.output


def test_older_run_without_op_costs_is_told_to_ingest_again(tmp_path):
    """Op costs are worked out at ingest since version 10: a run written before has none, and what costs ops says so
    (reading it as empty would give no roofline at all); what does not cost ops reads it as before."""
    run = _run_of_version(tmp_path, 9, drop_tables=["op_costs"])
    runner = CliRunner()
    for query in ("roofline", "mfu", "cost_coverage"):
        result = runner.invoke(main, ["query", query, str(run)])
        assert result.exit_code == 1 and result.stderr.splitlines()[-1] == (
            "Error: SQL error: Invalid Input Error: run run has no op costs: it was ingested by a tracesql older "
            "than schema version 10, which works them out at ingest; ingest it again"), query
    assert runner.invoke(main, ["query", "kernel_breakdown", str(run)]).exit_code == 0


def test_ingest_into_an_older_run_reads_every_source_again(tmp_path):
    run = _run_of_version(tmp_path, 1, drop_tables=["warnings", "counters"])
    result = tracesql.ingest([GOOD], run)
    assert result.ingested == [GOOD.name] and not result.reused
    assert result.warnings == [f"{run}: written with schema version 1, read as version {schema.SCHEMA_VERSION} "
                               f"(since then: {SINCE_1}; what it lacks reads as empty — "
                               "re-ingest to fill it); all its sources are read again"]
    assert json.loads((run / "tracesql.json").read_text())["schema_version"] == schema.SCHEMA_VERSION
    extra = {p.name for p in (run / "warnings").iterdir()} - {p.name for p in (run / "ranks").iterdir()}
    assert len(extra) == 1 and re.fullmatch(r"run-checks-[0-9a-f]{12}\.parquet", extra.pop())
    assert tracesql.ingest([GOOD], run).reused == [GOOD.name]  # and from then on it is current


@pytest.mark.parametrize("version, problem", [
    (NEWER, f"written by tracesql 0.1.0 with schema version {NEWER}; this tracesql 0.1.0 reads schema versions "
            f"1..{schema.SCHEMA_VERSION}: install a tracesql that reads schema version {NEWER}, or re-ingest the "
            "traces with this one"),
    (0, "written by tracesql 0.1.0 with schema version 0, which this tracesql 0.1.0 no longer reads (it reads "
        f"1..{schema.SCHEMA_VERSION}): re-ingest the traces"),
    ("2", "the manifest has no valid schema_version ('2'); re-ingest the traces"),
])
def test_newer_or_unreadable_run_is_refused_everywhere(tmp_path, version, problem):
    run = _run_of_version(tmp_path, version)
    before = _files(run)
    with pytest.raises(tracesql.TraceError) as err:
        tracesql.connect(run)
    assert str(err.value) == f"{run}: {problem}"
    for args in (["query", "overlap", str(run)], ["info", str(run)], ["ingest", str(GOOD), "-o", str(run)]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1 and result.output == f"Error: {run}: {problem}\n", args
    assert _files(run) == before  # the ingest refused before touching it


def test_op_costs_of_a_version_10_run_read_their_cost_source(tmp_path):
    """A run of version 10 has op_costs without cost_source and cost_op_id: the view gives an op with FLOPs its
    source ('xla' for XLA's numbers, else 'formula'), none to an op without, and no cost_op_id."""
    import duckdb

    from tracesql import views

    part = tmp_path / "op_costs.parquet"
    con = duckdb.connect()
    con.execute(f"""COPY (SELECT * FROM (VALUES ('r', 0, 1, 'gemm', 'bf16', 8.0, 8.0, 4.0, 10, true),
                                                ('r', 0, 2, 'xla', NULL, 2.0, 2.0, 1.0, 5, true),
                                                ('r', 0, 3, NULL, NULL, NULL, NULL, NULL, 7, false))
                         t(run_id, rank, op_id, family, dtype, flops, torch_flops, bytes, device_total_ns, counted))
                    TO '{part}' (FORMAT parquet)""")
    have = {c[0] for c in con.execute(f"DESCRIBE SELECT * FROM '{part}'").fetchall()}
    con.execute(views.view_sql("op_costs", [str(part)], have))
    assert con.execute("SELECT op_id, cost_source, cost_op_id FROM op_costs ORDER BY op_id").fetchall() == [
        (1, "formula", None), (2, "xla", None), (3, None, None)]
