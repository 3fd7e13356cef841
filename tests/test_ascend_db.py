"""torch_npu's `.db` export (export_type=db): a real export (MindStudio Insight's test data, Level1, one rank of the
8-NPU job of datasets/torch_npu_ascend_2rank but another run: no public text and .db export of one run exists),
read into the tables the text export fills, checked against sqlite3 queries of the file's own tables and
torch_npu's own figures for it (OVERLAP_ANALYSIS, analysis.db's StepTraceTime)."""

from __future__ import annotations

import json
import sqlite3

import pytest

import tracesql
from conftest import DATASETS
from tracesql.errors import TraceError
from tracesql.readers import ascend_db, is_companion, reader_for

EXPORT = DATASETS / "torch_npu_db_level1"
OUTPUT = EXPORT / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
DB = OUTPUT / "ascend_pytorch_profiler_0.db"


@pytest.fixture(scope="module")
def run(ingested):
    out = ingested(EXPORT)
    assert list(json.loads((out / "tracesql.json").read_text())["sources"]) == ["ascend_pytorch_profiler_0.db"]
    return out


def sql(query: str, *args) -> list[tuple]:
    con = sqlite3.connect(f"file:{DB}?mode=ro&immutable=1", uri=True)
    try:
        return con.execute(query, args).fetchall()
    finally:
        con.close()


def union_ns(query: str) -> int:
    total, end = 0, None
    for s, e in sorted(sql(query)):
        if end is None or s > end:
            total, end = total + e - s, e
        elif e > end:
            total, end = total + e - end, e
    return total


def test_detected_and_analysis_db_skipped():
    assert reader_for(DB) is ascend_db
    assert is_companion(OUTPUT / "analysis.db") and not is_companion(DB)


def test_rows_are_the_databases(run):
    """Before: 'no trace files found' (a folder), an Nsight reader's error (the file)."""
    con = tracesql.connect(run)
    assert con.sql("SELECT rank, source_format, backend FROM ranks").fetchall() == [(0, "torch_npu_db", "hccl")]
    assert con.sql("SELECT device_id, name FROM devices").fetchall() == [(0, "Ascend910B")]
    kinds = dict(con.sql("SELECT kind || '/' || category, count(*) FROM slices GROUP BY 1").fetchall())
    assert kinds["kernel/ascend_hardware"] == sql("SELECT count(*) FROM TASK WHERE globalTaskId IN "
                                                  "(SELECT globalTaskId FROM COMPUTE_TASK_INFO)")[0][0] == 187
    assert kinds["gpu_annotation/hccl_task"] == sql("SELECT count(*) FROM COMMUNICATION_TASK_INFO")[0][0]
    assert kinds["kernel/hccl"] == sql("SELECT count(*) FROM COMMUNICATION_OP")[0][0] == 4
    ops = sql("SELECT count(*) FROM PYTORCH_API p JOIN ENUM_API_TYPE t ON t.id = p.type WHERE t.name = 'op'")[0][0]
    assert con.sql("SELECT count(*) FROM ops").fetchall()[0][0] == ops == 860
    # every device task has a launch: its op's torch_to_npu (CONNECTION_IDS), else its CANN call
    unlinked = ("SELECT count(*) FROM slices WHERE kind IN ('kernel', 'memcpy') AND category <> 'hccl' "
                "AND launch_id IS NULL")
    assert con.sql(unlinked).fetchall()[0][0] == 0
    assert con.sql("SELECT step, rule FROM steps").fetchall() == [(50, "profiler_step")]


def test_overlap_equals_torch_npus_overlap_analysis(run):
    row = tracesql.query("overlap", run).iloc[0]
    # the database's own overlap lanes (type 0 computing, 1 communication, 2 communication not overlapped) and
    # analysis.db's StepTraceTime (µs), to the ns
    lanes = {t: union_ns(f"SELECT startNs, endNs FROM OVERLAP_ANALYSIS WHERE type = {t}") for t in (0, 1, 2)}
    assert row.compute_ns == lanes[0] == union_ns(
        "SELECT startNs, endNs FROM TASK WHERE globalTaskId IN (SELECT globalTaskId FROM COMPUTE_TASK_INFO)")
    assert row.comm_ns == lanes[1] == union_ns("SELECT startNs, endNs FROM COMMUNICATION_OP")
    assert row.exposed_comm_ns == lanes[2]
    con = sqlite3.connect(f"file:{OUTPUT / 'analysis.db'}?mode=ro&immutable=1", uri=True)
    computing, overlapped = con.execute("SELECT computing, overlapped FROM StepTraceTime").fetchone()
    con.close()
    assert (row.compute_ns, row.overlap_ns) == (round(computing * 1000), round(overlapped * 1000)) \
        == (8_903_431, 4_036_153)


def test_memory_equals_memory_record(run):
    got = tracesql.query("memory", run).set_index("allocator")
    for component in ("PTA", "GE"):
        allocated, reserved, events = sql(
            "SELECT max(totalAllocated), max(totalReserved), count(*) FROM MEMORY_RECORD m JOIN STRING_IDS s "
            "ON s.id = m.component WHERE s.value = ?", component)[0]
        row = got.loc[component]
        assert (row.peak_allocated_bytes, row.peak_reserved_bytes, row.events) == (allocated, reserved, events)
    assert got.loc["PTA"].peak_op is not None


def test_a_database_that_is_no_trace_is_named_in_one_line(tmp_path):
    """torch_npu's analysis.db given on its own (before: Nsight's reader, which found none of its tables)."""
    with pytest.raises(TraceError) as e:
        tracesql.ingest([OUTPUT / "analysis.db"], tmp_path / "run")
    message = str(e.value)
    assert "torch_npu's analysis.db" in message and "ascend_pytorch_profiler_<rank>.db" in message
    assert "\n" not in message
