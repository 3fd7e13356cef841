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
