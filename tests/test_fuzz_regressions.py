"""Inputs the fuzzer (tests/fuzz) found that broke a reader, each kept as a regression test: a real trace with the
mutation that broke it, now ingested or refused with a one-line TraceError."""

from __future__ import annotations

import gzip
import json

import pytest

import tracesql
from conftest import DATASETS, corpus_path

KINETO = DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz"
ROCPROF = ("tracelens", "tests", "rocprof", "908_results.json.gz")


def _deep(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def _ingest(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path, lambda: tracesql.ingest([path], tmp_path / "run")


def test_rocprof_deeply_nested_value(tmp_path):
    doc = json.loads(gzip.decompress(corpus_path(*ROCPROF).read_bytes()))
    doc["rocprofiler-sdk-tool"][0]["agents"][0]["vendor_id"] = "NEST"  # agents are read as plain dicts
    text = json.dumps(doc).replace('"NEST"', _deep(100_000))
    path, ingest = _ingest(tmp_path, "rank-0_results.json", text.encode())
    with pytest.raises(tracesql.TraceError) as err:
        ingest()
    assert str(err.value) == f"{path}: nested too deeply to read (thousands of levels: a damaged or hostile file)"


def test_kineto_deeply_nested_top_level_value_and_event(tmp_path):
    doc = json.loads(gzip.decompress(KINETO.read_bytes()))
    doc["traceName"] = "NEST"
    path, ingest = _ingest(tmp_path, "rank-0.json", json.dumps(doc).replace('"NEST"', _deep(100_000)).encode())
    with pytest.raises(tracesql.TraceError, match="nested too deeply to read"):
        ingest()


def test_rocprof_invalid_utf8_in_a_string(tmp_path):
    data = gzip.decompress(corpus_path(*ROCPROF).read_bytes())
    at = data.index(b'"hostname":"') + len(b'"hostname":"')
    path, ingest = _ingest(tmp_path, "rank-0_results.json", data[:at] + b"\xff\xfe" + data[at:])
    result = ingest()
    assert f"{path}: invalid UTF-8 in strings replaced by U+FFFD" in result.warnings
    con = tracesql.connect(tmp_path / "run")
    assert con.execute("SELECT host_name FROM ranks").fetchone()[0].startswith("\ufffd\ufffd")
    assert con.execute("SELECT count(*) FROM slices").fetchone()[0] == 43915  # as the undamaged file


def test_kineto_times_too_large_for_nanoseconds_are_skipped(tmp_path):
    doc = json.loads(gzip.decompress(KINETO.read_bytes()))
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[0]["dur"] = 2**63  # µs: no BIGINT holds it in ns
    kernels[1]["ts"] = 1e300
    kernels[2]["ts"] = -9.3e18
    doc["baseTimeNanoseconds"] = "soon"
    path, ingest = _ingest(tmp_path, "rank-0.json", json.dumps(doc).encode())
    result = ingest()
    assert f"{path}: skipped damaged events: 3 time out of range" in result.warnings
    assert f"{path}: baseTimeNanoseconds 'soon' is not a time in ns: ignored" in result.warnings
    con = tracesql.connect(tmp_path / "run")
    assert con.execute("SELECT check_name, event_count FROM warnings").fetchall() == [("time_out_of_range", 3)]
    assert con.execute("SELECT count(*) FROM slices WHERE kind = 'kernel'").fetchone()[0] == len(kernels) - 3
    assert tracesql.query("overlap", tmp_path / "run")["comm_ns"].notna().all()


def test_kineto_invalid_utf8_in_a_top_level_key(tmp_path):
    data = gzip.decompress(KINETO.read_bytes())
    path, ingest = _ingest(tmp_path, "rank-0.json", b'{"sch\xa2emaVersion": 1, ' + data.lstrip()[1:])
    ingest()
    assert tracesql.connect(tmp_path / "run").execute("SELECT count(*) FROM slices").fetchone()[0] == 4811


def test_perfetto_invalid_utf8_in_an_annotation_name(tmp_path):
    from test_perfetto import kineto_to_perfetto

    events = json.loads(gzip.decompress(KINETO.read_bytes()))["traceEvents"][:300]
    trace = kineto_to_perfetto(events, tmp_path / "good.perfetto-trace.gz")
    data = gzip.decompress(trace.read_bytes())
    assert data.count(b"Fwd thread id") > 0
    path, ingest = _ingest(tmp_path, "rank-0.perfetto-trace", data.replace(b"Fwd thread id", b"F\xf7d thread id"))
    ingest()
    args = tracesql.connect(tmp_path / "run").execute(
        "SELECT count(*) FROM slices WHERE list_contains(json_keys(args), 'F\ufffdd thread id')").fetchone()[0]
    assert args == data.count(b"Fwd thread id")


def test_rocprof_records_of_an_unread_domain_that_are_not_a_list(tmp_path):
    doc = json.loads(gzip.decompress(corpus_path(*ROCPROF).read_bytes()))
    doc["rocprofiler-sdk-tool"][0]["buffer_records"]["page_migration"] = "not a list"
    path, ingest = _ingest(tmp_path, "rank-0_results.json", json.dumps(doc).encode())
    with pytest.raises(tracesql.TraceError) as err:
        ingest()
    assert str(err.value) == f"{path}: unreadable page_migration records (Expected `array`, got `str`)"


def test_torch_npu_damaged_values_are_per_event(tmp_path):
    """What the fuzzer found in torch_npu's trace_view.json (each a traceback before): a ts of Infinity or beyond
    Decimal's exponent, a category that is a list or a number, a lone surrogate escaped in args (DuckDB refused
    the args JSON). Each is counted on its event, or its value kept as text."""
    out = tmp_path / "r_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    ok = '"ph":"X","pid":1,"tid":1,"dur":1'
    (out / "trace_view.json").write_text(
        f'[{{{ok},"ts":Infinity}},{{{ok},"ts":"1e999999"}},{{{ok},"ts":"-1e500"}},{{{ok},"ts":1,"cat":[1]}},'
        f'{{{ok},"ts":2,"cat":2.5}},{{{ok},"ts":3,"args":{{"a":"x\\ud800","b":"\\ud834\\udd1e"}}}}]')
    tracesql.ingest([tmp_path], tmp_path / "run", rank=0)
    con = tracesql.connect(tmp_path / "run")
    assert con.sql("SELECT category, args FROM slices ORDER BY ts").fetchall() == [
        ("[1]", None), ("2.5", None), (None, '{"a": "x\\ufffd", "b": "\\ud834\\udd1e"}')]
    assert sorted(con.sql("SELECT message, event_count FROM warnings").fetchall()) == [
        ("1 event(s) skipped: missing or non-numeric ts", 1),  # 1e999999 µs: beyond Decimal
        ("2 event(s) skipped: time out of range", 2)]  # Infinity, -1e500
