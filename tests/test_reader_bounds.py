"""The Nsight, rocprofv3, Perfetto, XPlane and torch_npu readers on crafted hostile inputs (no corpus needed): memory bounded by
--memory-limit plus a fixed overhead, whatever the input holds (a huge name every event refers to, slices that
never end, a decompression bomb), and the damage the Nsight reader used to fail on (a string that is not UTF-8,
text in an INTEGER column, a process that only made CUDA calls)."""

from __future__ import annotations

import gzip
import sqlite3

import pytest

import tracesql
from crafted import ascend_trace, nsys_export, peak_ingest_memory, perfetto_trace, rocprof_trace, xplane_trace
from tracesql import readers

LIMIT_MB = 256
#: What an ingest needs besides DuckDB's limit: the interpreter and libraries (~60-110 MB), a block of packets or a
#: few batches in flight, the Perfetto reader's bounded state, normalize's walk. Measured: 180-310 MB of RssAnon
#: at a 128 MB limit for 0.3-2 M events; the readers that held Python lists of every event took 1.5-2 GB here.
FIXED_OVERHEAD_MB = 320
NAME = 2000  # characters of the name every event refers to


def run_sql(run, sql):
    return tracesql.connect(run).execute(sql).fetchall()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["nsys", "rocprof", "perfetto"])
def test_memory_is_bounded_by_the_limit(fmt, tmp_path):
    """300-600 k events, each naming one long name (what a templated kernel's name can be), and for Perfetto
    200 k slices that never end: peak anonymous memory stays under the limit plus the overhead. (A name of
    megabytes is cut to readers.MAX_NAME_CHARS by the readers; normalize's in-memory link database, used below
    2 M slices, cannot then spill 8 kB per row at this limit: that is normalize's, left for its owner.)"""
    if fmt == "nsys":
        trace, slices = nsys_export(tmp_path / "big.sqlite", 300_000, huge=NAME), 600_000
    elif fmt == "rocprof":
        trace, slices = rocprof_trace(tmp_path / "7_results.json", 300_000, huge=NAME), 300_000
    else:
        trace, slices = perfetto_trace(tmp_path / "big.pftrace", 500_000, huge=NAME, unended=200_000), 500_000
    m = peak_ingest_memory(trace, tmp_path / "run", f"{LIMIT_MB}MB")
    assert m["exit"] == 0, m["stderr"]
    assert m["peak_anon_mb"] < LIMIT_MB + FIXED_OVERHEAD_MB, m
    got = run_sql(tmp_path / "run", "SELECT count(*), max(length(name)) FROM slices")
    assert got[0][0] >= slices - 1 and got[0][1] <= readers.MAX_NAME_CHARS
    if fmt == "perfetto":  # the 200 k slices that never end are counted
        assert run_sql(tmp_path / "run", "SELECT sum(event_count) FROM warnings WHERE message LIKE '%never ended%'"
                       ) == [(200_000,)]


def test_nsys_damage_is_read_not_a_traceback(tmp_path):
    """A thread name with invalid UTF-8 (UnicodeDecodeError before), a runtime call whose correlationId is text
    (ArrowInvalid before), a process that only made CUDA calls (a rank of its own before)."""
    path = nsys_export(tmp_path / "report.sqlite", 50, huge=10, api_only_process=True)
    result = tracesql.ingest([path], tmp_path / "run")
    run = tmp_path / "run"
    assert run_sql(run, "SELECT count(DISTINCT rank) FROM slices") == [(1,)]
    assert any("1 process(es) made CUDA calls but ran no device work, so are no rank: pid 777 (1 calls left out)"
               in w for w in result.warnings), result.warnings
    assert run_sql(run, "SELECT DISTINCT track FROM slices WHERE kind = 'runtime'") == [
        ("trainer / pyth\ufffdn (4243)",)]
    # the call with a text correlationId is kept, without a correlation; the other 49 launch their kernels
    assert run_sql(run, "SELECT count(*), count(correlation), count(*) FILTER (name = 'cudaLaunchKernel') "
                        "FROM slices WHERE kind = 'runtime'") == [(50, 49, 50)]
    assert run_sql(run, "SELECT count(launch_id) FROM slices WHERE kind = 'kernel'") == [(49,)]


def test_nsys_non_integer_times_are_skipped_and_counted(tmp_path):
    path = nsys_export(tmp_path / "report.sqlite", 20, huge=10)
    with sqlite3.connect(path) as con:
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = 1")
        con.execute('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = start - 5 WHERE rowid = 2')
    result = tracesql.ingest([path], tmp_path / "run")
    assert run_sql(tmp_path / "run", "SELECT count(*) FROM slices WHERE kind = 'kernel'") == [(18,)]
    text = " ".join(result.warnings)
    assert "start or end is not an integer" in text and "end before start" in text, result.warnings


@pytest.mark.parametrize("suffix, make, padding", [
    (".perfetto-trace.gz", lambda p: perfetto_trace(p, 10, huge=10), b"\x0a\x00"),  # empty packets
    ("_results.json.gz", lambda p: rocprof_trace(p, 10, huge=10), b" "),  # whitespace after the document
    ("trace_view.json.gz", lambda p: ascend_trace(p.parent / "plain_ascend_pt", 10), b" "),
])
def test_decompression_bomb_is_refused(suffix, make, padding, tmp_path, monkeypatch):
    """A gzip that inflates beyond the cap (1 GiB or 100x its size; lowered here) is refused in one line before
    it fills the disk; the same file under the cap reads."""
    plain = make(tmp_path / ("plain" + suffix[:-3]))
    bomb = tmp_path / ("bomb" + suffix)
    bomb.write_bytes(gzip.compress(plain.read_bytes() + padding * ((2 << 20) // len(padding))))  # ~500x
    monkeypatch.setattr(readers.common, "INFLATE_FREE_BYTES", 256 << 10)  # read where the readers read it
    with pytest.raises(tracesql.TraceError) as e:
        tracesql.ingest([bomb], tmp_path / "run")
    assert str(e.value).startswith(f"{bomb}: gzip inflates beyond") and "decompression bomb" in str(e.value)
    monkeypatch.setenv("TRACESQL_MAX_GZIP_RATIO", "10000")
    tracesql.ingest([bomb], tmp_path / "run2")


def _one_line_refusal(m: dict, trace, what: str) -> str:
    lines = m["stderr"].strip().splitlines()
    assert m["exit"] == 1 and len(lines) == 1 and "Traceback" not in m["stderr"], m
    assert lines[0].startswith(f"Error: {trace}: {what}") and f"--memory-limit {LIMIT_MB}MB" in lines[0], lines
    return lines[0]


def test_xplane_memory_is_bounded_by_the_limit(tmp_path):
    """300 k kernels on one stream line naming one 2,000-character name, 300 k host annotations: the events are
    parsed a chunk at a time and the batches cut by their text (before: the whole XSpace parsed, a line's events
    as Python lists, 65,536-row batches each repeating the name)."""
    trace = xplane_trace(tmp_path / "big.xplane.pb", 300_000, huge=NAME)
    m = peak_ingest_memory(trace, tmp_path / "run", f"{LIMIT_MB}MB")
    assert m["exit"] == 0, m["stderr"]
    assert m["peak_anon_mb"] < LIMIT_MB + FIXED_OVERHEAD_MB, m
    assert run_sql(tmp_path / "run", "SELECT count(*), count(*) FILTER (kind = 'kernel'), max(length(name)) "
                                     "FROM slices") == [(600_000, 300_000, NAME)]


def test_xplane_metadata_beyond_the_limit_is_refused(tmp_path):
    """What the reader holds whole (metadata, here two 8 MiB names, at up to 32 bytes a byte parsed) beyond
    --memory-limit is refused in one line naming the file and the limit; a larger limit reads it, names cut."""
    trace = xplane_trace(tmp_path / "names.xplane.pb", 10, huge=8 << 20)
    m = peak_ingest_memory(trace, tmp_path / "run", f"{LIMIT_MB}MB")
    _one_line_refusal(m, trace, "what an XPlane reader holds for the whole file")
    assert m["peak_anon_mb"] < LIMIT_MB + FIXED_OVERHEAD_MB, m
    tracesql.ingest([trace], tmp_path / "run2", memory_limit="1GB")
    assert run_sql(tmp_path / "run2", "SELECT count(*), max(length(name)) FROM slices") == [
        (20, readers.MAX_NAME_CHARS)]


@pytest.mark.slow
def test_ascend_streams_a_trace_far_beyond_what_it_could_hold(tmp_path):
    """A 104 MiB trace_view.json (200,000 tasks named by 150 characters, each with its torch_to_npu flow, and a
    malformed event every 1,000 tasks) is read an event at a time in two walks: at --memory-limit 256MB it ingests
    within the bound (before: refused beyond 6.8 MiB at this limit), every task and its launch a slice, the
    malformed events counted; what it holds for the whole file (the flows: 98 MiB charged) is refused in one line
    when the limit is below it."""
    trace = ascend_trace(tmp_path / "rank0_ascend_pt", 200_000, huge=150, flows=True, malformed=1000)
    assert trace.stat().st_size > 100 << 20
    m = peak_ingest_memory(trace, tmp_path / "run", f"{LIMIT_MB}MB")
    assert m["exit"] == 0, m["stderr"]
    assert m["peak_anon_mb"] < LIMIT_MB + FIXED_OVERHEAD_MB, m
    assert run_sql(tmp_path / "run", "SELECT count(*) FILTER (kind = 'kernel'), count(*) FILTER (name = "
                                     "'torch_to_npu'), count(*), max(length(name)) FROM slices") == [
        (200_000, 200_000, 400_000, 150)]
    assert run_sql(tmp_path / "run", "SELECT event_count FROM warnings WHERE message LIKE '%malformed event%'") == [
        (200,)]
    m = peak_ingest_memory(trace, tmp_path / "run2", "32MB")
    lines = m["stderr"].strip().splitlines()
    assert m["exit"] == 1 and len(lines) == 1 and "Traceback" not in m["stderr"], m
    assert lines[0].startswith(f"Error: {trace}: what the torch_npu reader holds for the whole file") and \
        "--memory-limit 32MB" in lines[0], lines


def test_ascend_one_event_beyond_the_limit_is_refused(tmp_path):
    """An event is held whole while it is parsed: one of 8 MiB (a name) is refused in one line at --memory-limit
    256MB (it may take 36 bytes a character), within the bound; the events around it do not matter."""
    path = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(b'[' + b'{"ph":"X","ts":1,"dur":1},' * 1000 + b'{"ph":"X","name":"' + b"n" * (8 << 20) + b'"}]')
    m = peak_ingest_memory(path, tmp_path / "run", f"{LIMIT_MB}MB")
    _one_line_refusal(m, path, "one event of the trace")
    assert m["peak_anon_mb"] < LIMIT_MB + FIXED_OVERHEAD_MB, m
