"""Damaged or odd inputs ingest, or are refused in one line (issue 16, items 3, 6, 7, 9): traces with no complete
slice, integers no column holds, files that are not regular files, and the messages that used to mislead."""

from __future__ import annotations

import json
import os
import sqlite3
import zipfile

import pytest
from click.testing import CliRunner

import tracesql
from conftest import write_trace
from crafted import nsys_export
from tracesql.cli import main


def rows(run, sql):
    return tracesql.connect(run).execute(sql).fetchall()


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output.strip()


@pytest.mark.parametrize("events, table, expected_warning", [
    ([{"ph": "C", "name": "mem", "ts": 1, "pid": 1, "tid": 1, "args": {"bytes": 5}}], "counters", None),
    ([{"ph": "B", "name": "crashed", "ts": 1, "pid": 1, "tid": 1}], "warnings", "1 begin that never ends"),
    ([{"ph": "b", "name": "async", "cat": "x", "id": 3, "ts": 1, "pid": 1, "tid": 1}], "warnings",
     "1 begin that never ends"),
])
def test_trace_without_a_complete_slice_ingests(tmp_path, events, table, expected_warning):
    """Counters only, a crashed process's lone B, an async b alone: `ValueError: Must pass schema` before."""
    path = write_trace(tmp_path / "t.json", events)
    result = tracesql.ingest([path], tmp_path / "run")
    assert rows(tmp_path / "run", "SELECT count(*) FROM slices") == [(0,)]
    assert rows(tmp_path / "run", f"SELECT count(*) FROM {table}") == [(1,)]
    if expected_warning:
        assert f"{path}: skipped damaged events: {expected_warning}" in result.warnings


def test_nsys_export_without_device_work_or_calls_ingests(tmp_path):
    path = nsys_export(tmp_path / "report.sqlite", 5, huge=10)
    with sqlite3.connect(path) as con:
        con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL")
        con.execute("DELETE FROM CUPTI_ACTIVITY_KIND_RUNTIME")
    code, out = cli("ingest", path, "-o", tmp_path / "run", "-q", "--rank", 0)
    assert code in (0, 1) and "Traceback" not in out and len(out.splitlines()) <= 1, out


def test_out_of_range_device_id_skips_that_event(tmp_path):
    """A kernel with device 2^40: `Conversion Error … INT32` for the whole file before; now that one event is
    skipped, counted in `warnings` and named in the warning with the file."""
    events = [
        {"ph": "X", "cat": "kernel", "name": "bad", "ts": 10, "dur": 5, "pid": 0, "tid": 7,
         "args": {"device": 2**40, "stream": 7, "correlation": 1}},
        {"ph": "X", "cat": "kernel", "name": "good", "ts": 20, "dur": 5, "pid": 0, "tid": 7,
         "args": {"device": 0, "stream": 7, "correlation": 2}},
        {"ph": "X", "cat": "cpu_op", "name": "op", "ts": 1, "dur": 50, "pid": 1, "tid": 1},
    ]
    path = write_trace(tmp_path / "rank-0.json", events)
    result = tracesql.ingest([path], tmp_path / "run")
    assert f"{path}: skipped damaged events: 1 device id out of range" in result.warnings
    assert rows(tmp_path / "run", "SELECT name FROM slices WHERE kind = 'kernel'") == [("good",)]
    assert rows(tmp_path / "run", "SELECT event_count, source_path FROM warnings WHERE message = "
                                  "'1 event(s) skipped: device id out of range'") == [(1, "rank-0.json")]


def test_nsys_out_of_range_device_id_skips_that_event(tmp_path):
    path = nsys_export(tmp_path / "report.sqlite", 10, huge=10)
    with sqlite3.connect(path) as con:
        con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 1099511627776 WHERE rowid = 3")
    result = tracesql.ingest([path], tmp_path / "run")
    assert any(w.startswith(f"{path}: skipped damaged events:") and "1 device id out of range" in w
               for w in result.warnings), result.warnings
    assert rows(tmp_path / "run", "SELECT count(*) FROM slices WHERE kind = 'kernel'") == [(9,)]


@pytest.mark.parametrize("args, message", [
    (["--rank", "3000000000"], "Invalid value for '--rank': 3000000000 is not in the range 0<=x<=2147483647."),
    (["--rank", "-1"], "Invalid value for '--rank': -1 is not in the range 0<=x<=2147483647."),
    (["--jobs", "0"], "Invalid value for '-j' / '--jobs': 0 is not in the range 1<=x<=1024."),
])
def test_rank_and_counts_are_range_checked_at_the_cli(tmp_path, args, message):
    path = write_trace(tmp_path / "t.json", [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}])
    code, out = cli("ingest", path, "-o", tmp_path / "run", *args)
    assert code == 2 and out == f"Error: {message} (see `main ingest --help`)"
    with pytest.raises(tracesql.TraceError, match="is not a rank"):
        tracesql.ingest([path], tmp_path / "run", rank=2**31)


def test_out_of_range_rank_in_the_trace_is_ignored_with_a_note(tmp_path):
    path = write_trace(tmp_path / "t.json", [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}],
                       distributedInfo={"rank": 3_000_000_000, "world_size": -4})
    result = tracesql.ingest([path], tmp_path / "run")
    assert f"{path}: rank 3000000000 is out of range: ignored" in result.warnings
    assert f"{path}: world_size -4 is out of range: ignored" in result.warnings
    assert rows(tmp_path / "run", "SELECT rank, world_size FROM ranks") == [(0, None)]


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_special_files_are_refused_in_one_line(tmp_path, kind):
    """A FIFO in a source folder hung ingest forever."""
    src = tmp_path / "src"
    src.mkdir()
    write_trace(src / "rank-0.json", [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}])
    special = src / "rank-1.json"
    if kind == "fifo":
        os.mkfifo(special)
    else:
        import socket

        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(special))
    what = "a FIFO" if kind == "fifo" else "a socket"
    code, out = cli("ingest", src, "-o", tmp_path / "run")
    assert (code, out) == (1, f"Error: {special}: {what}, not a regular file: refused (only trace files are read)")


def test_character_device_is_refused(tmp_path):
    code, out = cli("ingest", "/dev/null", "-o", tmp_path / "run")
    assert (code, out) == (1, "Error: /dev/null: a character device, not a regular file: refused (only trace "
                              "files are read)")


def test_nanoseconds_in_a_microsecond_trace_say_so(tmp_path):
    path = write_trace(tmp_path / "t.json", [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1.7e18, "dur": 5000,
                                              "pid": 1, "tid": 1}])
    code, out = cli("ingest", path, "-o", tmp_path / "run")
    assert code == 1 and out.startswith(f"Error: {path}: no usable timed events: 1 have times out of range")
    assert "these look like nanoseconds: divide ts and dur by 1000" in out


def test_encrypted_zip_says_encrypted(tmp_path):
    trace = write_trace(tmp_path / "rank-0.json", [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}])
    archive = tmp_path / "traces.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.write(trace, "rank-0.json")
    data = bytearray(archive.read_bytes())
    data[6] |= 1  # the "encrypted" flag, in the local header and the central directory
    data[data.rfind(b"PK\x01\x02") + 8] |= 1
    archive.write_bytes(bytes(data))
    code, out = cli("ingest", archive, "-o", tmp_path / "run")
    assert (code, out) == (1, f"Error: {archive}: member 'rank-0.json' is encrypted: tracesql does not read "
                              "encrypted archives (unpack it with its password first)")


def test_markdown_output_keeps_names_with_newlines_and_pipes_in_their_cell(tmp_path):
    path = write_trace(tmp_path / "t.json", [{"ph": "X", "cat": "cpu_op", "name": "two\nlines | piped", "ts": 1,
                                              "dur": 1, "pid": 1, "tid": 1}])
    tracesql.ingest([path], tmp_path / "run")
    sql = tmp_path / "q.sql"
    sql.write_text("SELECT name, 1 AS n FROM slices")
    code, out = cli("query", sql, tmp_path / "run", "-f", "markdown")
    assert code == 0 and out.splitlines() == ["| name | n |", "|---|---:|", "| two<br>lines \\| piped | 1 |"]


def test_chart_labels_are_escaped_once():
    """plotly.js shows `&quot;` as written: a quote stays a quote; `<` and `&` are still escaped."""
    from tracesql.report.charts import text

    assert text('say "hi" <b> & co') == 'say "hi" &lt;b&gt; &amp; co'


@pytest.mark.parametrize("content, problem", [
    (b'{"traceEvents":[1,"x",null,[],{}]}',
     "no timed events (every event lacks a usable ts/dur; damaged: 4 malformed event)"),
    (b'{"traceEvents":[{"ph":"M","name":"process_name","pid":1,"args":{"name":"a"}}]}',
     "no timed events (every event lacks a usable ts/dur)"),
], ids=["junk elements", "metadata only"])
def test_a_trace_of_nothing_usable_is_refused_saying_why(tmp_path, content, problem):
    (tmp_path / "t.json").write_bytes(content)
    code, output = cli("ingest", tmp_path / "t.json", "-o", tmp_path / "run")
    assert (code, output) == (1, f"Error: {tmp_path / 't.json'}: {problem}") and not (tmp_path / "run").exists()


def test_a_null_among_events_is_counted_as_damaged(tmp_path):
    events = [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}, None, 7]
    (tmp_path / "t.json").write_text('{"traceEvents":' + json.dumps(events) + "}")
    result = tracesql.ingest([tmp_path / "t.json"], tmp_path / "run")
    assert result.warnings == [f"{tmp_path / 't.json'}: skipped damaged events: 2 malformed event"]
    assert rows(tmp_path / "run", "SELECT count(*) FROM slices") == [(1,)]


@pytest.mark.parametrize("encoding, problem", [
    ("utf-8-sig", "JSON that starts with a UTF-8 byte-order mark (EF BB BF), which tracesql does not read: remove "
                  "those first 3 bytes"),
    ("utf-16", "JSON encoded as UTF-16: tracesql reads JSON in UTF-8 (re-encode it, e.g. `iconv -f UTF-16 -t UTF-8`)"),
    ("utf-16-be", "JSON encoded as UTF-16-BE: tracesql reads JSON in UTF-8 (re-encode it, e.g. "
                  "`iconv -f UTF-16-BE -t UTF-8`)"),
    ("utf-32", "JSON encoded as UTF-32: tracesql reads JSON in UTF-8 (re-encode it, e.g. `iconv -f UTF-32 -t UTF-8`)"),
])
def test_json_in_another_encoding_is_refused_naming_it(tmp_path, encoding, problem):
    text = '{"traceEvents": [{"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]}'
    (tmp_path / "t.json").write_bytes(text.encode(encoding))
    assert cli("ingest", tmp_path / "t.json", "-o", tmp_path / "run") == (1, f"Error: {tmp_path / 't.json'}: {problem}")
