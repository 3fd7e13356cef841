"""Every file of the corpus: each trace (any format) ingests, keeps its invariants and answers every curated
query; every other file (READMEs, scripts, reference outputs) is refused with a one-line reason."""

from __future__ import annotations

import pytest

import tracesql
from conftest import CORPUS
from test_peaks import OWN_DEVICE, assert_above_peak_is_warned
from tracesql import queries
from tracesql.readers import trace_suffixes

FILES = sorted(p for p in CORPUS.rglob("*") if p.is_file()) if CORPUS.exists() else []
TRACES = [p for p in FILES if p.name.endswith(trace_suffixes())]
OTHERS = [p for p in FILES if p not in TRACES]


@pytest.mark.corpus
@pytest.mark.skipif(not FILES, reason="corpus not available")
@pytest.mark.parametrize("other", OTHERS, ids=lambda p: str(p.relative_to(CORPUS)))
def test_corpus_file_that_is_no_trace_is_refused_in_one_line(other, tmp_path):
    with pytest.raises(tracesql.TraceError) as err:
        tracesql.ingest([other], tmp_path / "run")
    message = str(err.value)
    # the file as given or resolved (a corpus reached through a symlinked ../shared)
    assert message.startswith((f"{other}: ", f"{other.resolve()}: ")) and "\n" not in message
    assert "not a trace" in message or "not valid JSON" in message or "no timed events" in message, message
    assert not (tmp_path / "run").exists()


@pytest.mark.corpus
@pytest.mark.slow  # every corpus trace, every query: minutes
@pytest.mark.skipif(not TRACES, reason="corpus not available")
@pytest.mark.parametrize("trace", TRACES, ids=lambda p: str(p.relative_to(CORPUS)))
def test_corpus_trace(trace, ingested):
    con = tracesql.connect(ingested(trace))  # the session's run of the trace, which other tests reuse
    invariants = con.execute("""
        SELECT
            -- a device event is linked exactly when a runtime/driver call with its correlation id exists
            (SELECT count(*) FROM slices d WHERE d.kind IN ('kernel', 'memcpy', 'memset') AND d.launch_id IS NULL
               AND d.correlation IN (SELECT correlation FROM slices WHERE kind IN ('runtime', 'driver'))),
            -- parents enclose their children on the same track
            (SELECT count(*) FROM slices c JOIN slices p ON p.slice_id = c.parent_id
              WHERE p.track <> c.track OR c.ts < p.ts OR c.ts + c.dur > p.ts + p.dur),
            -- an op's device time through nested ops is at least its own
            (SELECT count(*) FROM ops WHERE device_total_ns < device_self_ns),
            (SELECT count(*) FROM slices WHERE dur < 0)
    """).fetchall()[0]  # fetchone() would leave the result open and block the queries below on `con`
    assert invariants == (0, 0, 0, 0)
    for query in queries.catalogue():
        # the queries that rate against a peak run with test_peaks' parameters (a superset of their defaults:
        # every row, MFU too), and their rows keep its invariant: no rate above the peak without a warning
        params = OWN_DEVICE.get(query.name, {})
        found = queries.run(con, query, params)
        if query.name in OWN_DEVICE:
            assert_above_peak_is_warned(query.name, params, found)
        else:
            found.fetchall()
