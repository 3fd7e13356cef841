"""Every Kineto trace of the corpus ingests, keeps its invariants, and answers every curated query."""

from __future__ import annotations

import pytest

import tracesql
from conftest import CORPUS
from tracesql import queries

KINETO = sorted(CORPUS.rglob("*.json.gz")) if CORPUS.exists() else []


@pytest.mark.corpus
@pytest.mark.skipif(not KINETO, reason="corpus not available")
@pytest.mark.parametrize("trace", KINETO, ids=lambda p: str(p.relative_to(CORPUS)))
def test_corpus_trace(trace, tmp_path):
    tracesql.ingest([trace], tmp_path / "run")
    con = tracesql.connect(tmp_path / "run")
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
        queries.run(con, query).fetchall()
