"""The Chrome/Kineto reader's memory bound holds for adversarial input too (issue 16, item 1): where its streaming
path cannot read a document (whitespace or one huge string inside the array, deep nesting, too little memory),
it reads the document whole only when that fits in half of --memory-limit, and otherwise refuses it in one line;
gzip and archive decompression bombs are refused by their inflation ratio before they fill the disk."""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path

import pytest

import tracesql
from crafted import peak_ingest_memory
from tracesql.readers import common

DATASETS = Path(__file__).resolve().parent.parent / "datasets"

LIMIT_MB = 64
FIXED_OVERHEAD_MB = 320  # as tests/test_reader_bounds.py: interpreter, libraries, DuckDB's own structures


def _whitespace_in_array(path, mib: int):
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b'{"schemaVersion": 1, "traceEvents": [')
        for _ in range(mib):
            f.write(b" " * (1 << 20))
        f.write(b"]}")
    return path


def _huge_string(path, mib: int):
    path.write_bytes(b'{"schemaVersion":1,"traceEvents":[{"ph":"X","name":"a","ts":1,"dur":1,"pid":1,"tid":1},'
                     b'{"ph":"X","name":"' + b"x" * (mib << 20) + b'","ts":2,"dur":1,"pid":1,"tid":1}]}')
    return path


def _deep(path, mib: int):
    depth = (mib << 20) // 2
    path.write_bytes(b'{"schemaVersion":1,"traceEvents":[{"ph":"X","name":"a","ts":1,"dur":1,"pid":1,"tid":1,'
                     b'"args":{"x":' + b"[" * depth + b"]" * depth + b'}}]}')
    return path


@pytest.mark.parametrize("make, name", [(_whitespace_in_array, "ws.json.gz"), (_huge_string, "huge.json"),
                                        (_deep, "deep.json")])
def test_adversarial_documents_stay_within_the_limit(tmp_path, make, name):
    """Before: the whole decompressed document was read into memory (a 1 MB gzip of whitespace took 2.2 GB)."""
    trace = make(tmp_path / name, 200)
    m = peak_ingest_memory(trace, tmp_path / "run", f"{LIMIT_MB}MB")
    assert m["peak_anon_mb"] < LIMIT_MB + FIXED_OVERHEAD_MB, m
    lines = m["stderr"].strip().splitlines()
    if m["exit"]:
        assert len(lines) == 1 and lines[0].startswith(f"Error: {trace}: ") and "Traceback" not in m["stderr"], m
        assert "too large to read whole within --memory-limit 64MB" in lines[0] or "nested too deeply" in lines[0]


def test_small_documents_laid_out_otherwise_are_still_read_whole(tmp_path):
    """A trace whose array DuckDB cannot read (an event over its 16 MB object size) is read whole when small."""
    trace = _huge_string(tmp_path / "huge.json", 20)
    tracesql.ingest([trace], tmp_path / "run")  # default limit: whole reads up to ~0.5 GB
    con = tracesql.connect(tmp_path / "run")
    assert con.execute("SELECT count(*) FROM slices").fetchone()[0] == 2


def test_trailing_metadata_object_is_located_not_read_whole(tmp_path, monkeypatch):
    """Chrome writes `"metadata": {...}` after the array: the array is still located and streamed."""
    from tracesql.readers import kineto

    path = tmp_path / "chrome.json"
    path.write_bytes(b'{"traceEvents":[{"ph":"X","name":"a","ts":1,"dur":1,"pid":1,"tid":1}],'
                     b'"metadata":{"clock-domain":"LINUX_CLOCK_MONOTONIC","nested":{"x":[1,2]}}}')
    monkeypatch.setattr(kineto, "whole_read_bytes", lambda: 0)  # reading it whole would be refused
    tracesql.ingest([path], tmp_path / "run")
    assert tracesql.connect(tmp_path / "run").execute("SELECT count(*) FROM slices").fetchone()[0] == 1


@pytest.mark.parametrize("in_kernel", [True, False])
def test_located_array_is_copied_whole(tmp_path, monkeypatch, ingested, in_kernel):
    """A plain file's array is copied into the scratch folder by copy_file_range where the OS has it, else a chunk
    at a time (chunks smaller than the array here): both give DuckDB every event, as the gzip path does."""
    import gzip as gz
    import os

    from tracesql.readers import kineto

    path = tmp_path / "sampled_rank-0.json"
    path.write_bytes(gz.decompress((DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz").read_bytes()))
    monkeypatch.setattr(kineto, "whole_read_bytes", lambda: 0)  # no fallback to reading it whole
    if not in_kernel:
        monkeypatch.delattr(os, "copy_file_range", raising=False)
        monkeypatch.setattr(kineto, "_CHUNK", 1 << 16)
    assert path.stat().st_size > 8 << 16  # several chunks
    tracesql.ingest([path], tmp_path / "run")
    gz = ingested(DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz")  # not copied
    rows = "SELECT count(*), count(DISTINCT slice_id), max(slice_id), sum(dur) FROM slices"
    got = tracesql.connect(tmp_path / "run").execute(rows).fetchone()
    assert got == tracesql.connect(gz).execute(rows).fetchone()
    assert got[:3] == (4811, 4811, 4853)


def test_gzip_bomb_is_refused_by_its_ratio(tmp_path, monkeypatch):
    trace = _whitespace_in_array(tmp_path / "rank-0.json.gz", 8)
    monkeypatch.setattr(common, "INFLATE_FREE_BYTES", 1 << 20)
    with pytest.raises(tracesql.TraceError) as e:
        tracesql.ingest([trace], tmp_path / "run")
    assert str(e.value).startswith(f"{trace}: gzip inflates beyond") and "decompression bomb" in str(e.value)


def test_zip_bomb_is_refused_by_its_ratio_before_unpacking(tmp_path, monkeypatch):
    """A 10 MB zip took 10.5 GB of memory and 20 GB of scratch disk before."""
    archive = tmp_path / "traces.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("rank-0.json", b'{"traceEvents": [' + b" " * (16 << 20) + b"]}")
    monkeypatch.setattr(common, "INFLATE_FREE_BYTES", 1 << 20)
    with pytest.raises(tracesql.TraceError) as e:
        tracesql.ingest([archive], tmp_path / "run")
    assert str(e.value).startswith(f"{archive}: unpacks to {16 * 2**20 + 19:,} bytes") and "bomb" in str(e.value)
    assert list(tmp_path.glob(".run.extract-*")) == []
