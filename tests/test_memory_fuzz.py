"""The memory fuzzer (issue 26, items 2-3): every reader, on every shape of input that took one past the documented
bound (long distinct strings, large args, interned tables, whitespace, many tiny records, one huge string,
millions of records; tests/fuzz/memory.py), ingested at --memory-limit 256MB in a fresh process: the peak heap of
the whole process tree stays within the limit + 320 MB, and the ingest gives a run or one line naming the file.
A reader added without a shape fails the suite."""

from __future__ import annotations

import subprocess
import sys

import pytest

import tracesql
from conftest import DATASETS
from fuzz.memory import BOUND_MB, SHAPES, ingest_shape, outcome_problem
from tracesql import limits, readers

#: The share of each shape's size (tests/fuzz/memory.py: issue 26's attack) ingested here: half of the strings'
#: shapes (still past the bound for a reader that holds them), a tenth of the shapes of millions of records (whose
#: memory does not grow with their number, while their time does: a minute and more at full size).
SCALE = 0.5
MILLIONS_SCALE = 0.1


def _scale(shape) -> float:
    return MILLIONS_SCALE if shape.name.startswith(("many-", "tiny-")) else SCALE


def test_every_reader_has_shapes():
    assert {r.FORMAT for r in readers.READERS} <= {s.reader for s in SHAPES}


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=[s.id for s in SHAPES])
def test_every_reader_stays_within_the_bound_on_every_shape(shape, tmp_path):
    m = ingest_shape(shape, tmp_path, _scale(shape))
    assert outcome_problem(m) is None, (outcome_problem(m), m["peak_mb"], BOUND_MB)


def test_a_read_past_the_bound_is_stopped_and_refused_in_one_line(tmp_path, monkeypatch):
    """The watch itself, on a real ingest in this process: with the bound lowered below what any ingest needs,
    the read is stopped (its DuckDB queries interrupted, the reader's Python interrupted) and the file refused
    naming it and the limit; nothing of the run is written."""
    trace = DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz"
    monkeypatch.setattr(limits, "FIXED_OVERHEAD", -(1 << 40))  # stops at once
    with pytest.raises(tracesql.TraceError) as e:
        tracesql.ingest([trace], tmp_path / "run", memory_limit="256MB")
    assert str(e.value).startswith(f"{trace}: needs more memory than --memory-limit 256MB allows"), e.value
    assert not (tmp_path / "run").exists()
    monkeypatch.undo()  # the watch gone with the read: the same ingest now reads
    assert tracesql.ingest([trace], tmp_path / "run", memory_limit="256MB").rows["slices"] == 4811



def test_a_read_past_the_bound_that_ends_before_the_watch_samples_is_refused_all_the_same(tmp_path, monkeypatch):
    """A read shorter than a sampling interval, or whose sampler a loaded machine did not schedule in time: the
    watch's last sample, taken when the read ends, still sees the heap past the bound, and the file is refused."""
    trace = DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz"
    monkeypatch.setattr(limits, "FIXED_OVERHEAD", -(1 << 40))
    monkeypatch.setattr(limits, "WATCH_INTERVAL_S", 3600.0)  # no sample while the read runs
    with pytest.raises(tracesql.TraceError, match="needs more memory than --memory-limit 256MB allows"):
        tracesql.ingest([trace], tmp_path / "run", memory_limit="256MB")
    assert not (tmp_path / "run").exists()

AFTER_WATCHED_READS = """
import sys, tempfile
import tracesql
from tracesql import limits
trace, out = sys.argv[1], tempfile.mkdtemp()
tracesql.ingest([trace], out + "/read", memory_limit="256MB")  # a read the watch lets finish
limits.FIXED_OVERHEAD = -(1 << 40)
try:
    tracesql.ingest([trace], out + "/stopped", memory_limit="256MB")  # a read the watch stops
except tracesql.TraceError:
    pass
sys.settrace(lambda *event: None)  # as a debugger or coverage does
print(sum(map(int, "123")))
"""


def test_the_watch_leaves_no_pending_stop_behind(tmp_path):
    """After a watched read, stopped or not, the process runs on normally under a trace function: a stop that
    was withdrawn rather than delivered left Python's eval breaker set, and the next call under a tracer hung."""
    trace = DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz"
    done = subprocess.run([sys.executable, "-c", AFTER_WATCHED_READS, str(trace)], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "6\n"), done.stderr[-2000:]
