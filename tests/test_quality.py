"""Semantic damage in real traces is counted in the `warnings` table, shown by `tracesql info`, and the curated
queries still answer on the damaged run."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
from click.testing import CliRunner

import tracesql
from conftest import DATASETS, raw_events, write_trace
from tracesql import schema
from tracesql.cli import main

RANK0 = DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz"
STRAGGLER = DATASETS / "torch_gloo_4rank_straggler"


def _damaged(tmp_path, damage, source=RANK0, name="rank-0.json"):
    """The real trace with `damage(events)` applied, written as a new file."""
    top = json.loads(gzip.decompress(source.read_bytes()))
    damage(top["traceEvents"])
    path = tmp_path / name
    path.write_text(json.dumps(top))
    return path


def _warnings(run):
    con = tracesql.connect(run)
    return {r[0]: r[1:] for r in con.execute(
        "SELECT check_name, event_count, example, message, source_path FROM warnings").fetchall()}


def _queries_still_answer(run):
    for name in ("overlap", "temporal_breakdown", "steps", "launch", "hotspots", "kernel_breakdown"):
        df = tracesql.query(name, run)
        assert len(df) > 0, name


def _kernels(events):
    return [e for e in events if e.get("cat") == "kernel"]


def test_real_trace_has_no_warnings(ingested):
    assert _warnings(ingested(DATASETS / "hta_trace_filter")) == {}


def test_end_before_start_is_counted_and_skipped(tmp_path):
    def damage(events):
        for e in _kernels(events)[:3]:
            e["dur"] = -e["dur"]
    trace = _damaged(tmp_path, damage)
    result = tracesql.ingest([trace], tmp_path / "run")
    found = _warnings(tmp_path / "run")
    assert set(found) == {"end_before_start"}
    count, example, message, source = found["end_before_start"]
    assert (count, source) == (3, "rank-0.json") and example.startswith("X void fbgemm_gpu::permute_2D_lengths")
    assert "3 end before start" in result.warnings[0]
    kernels = tracesql.connect(tmp_path / "run").execute("SELECT count(*) FROM slices WHERE kind = 'kernel'")
    assert kernels.fetchone()[0] == len(_kernels(raw_events(RANK0))) - 3
    _queries_still_answer(tmp_path / "run")


def test_kernels_without_launch_and_repeated_correlation_ids(tmp_path):
    def damage(events):
        for i, e in enumerate(_kernels(events)[100:105]):  # their launch can no longer be found
            e["args"]["correlation"] = 10**12 + i
        launches = [e for e in events if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})]
        for e in launches[10:12]:  # two more calls claim the correlation id of the first one
            e["args"]["correlation"] = launches[0]["args"]["correlation"]
    trace = _damaged(tmp_path, damage)
    tracesql.ingest([trace], tmp_path / "run")
    found = _warnings(tmp_path / "run")
    # the two calls that lost their own id leave their kernels without a launch, too
    assert found["kernel_without_launch"][0] == 5 + 2
    assert found["repeated_correlation"][0] == 2
    assert found["repeated_correlation"][1].startswith("correlation 6935929: cudaLaunchKernel")
    con = tracesql.connect(tmp_path / "run")
    launches = con.execute(
        "SELECT l.ts, count(k.slice_id) FROM slices l LEFT JOIN slices k ON k.launch_id = l.slice_id "
        "WHERE l.correlation = 6935929 AND l.kind = 'runtime' GROUP BY ALL ORDER BY 1").fetchall()
    # the kernel with that id is linked to the earliest of the three calls
    assert [n for _, n in launches] == [1, 0, 0] and launches[0][0] == 1682725898082212000
    _queries_still_answer(tmp_path / "run")


@pytest.mark.slow
def test_step_that_never_ends(tmp_path):
    def no_dur(events):
        del next(e for e in events if e.get("name") == "ProfilerStep#552")["dur"]

    def endless(events):
        next(e for e in events if e.get("name") == "ProfilerStep#552")["dur"] = 10.0 ** 9

    cases = {"no_dur": (no_dur, "X ProfilerStep#552 ts=1682725898686653.0 dur=?", [551]),
             "endless": (endless, "ProfilerStep#552", [551, 552])}
    for case, (damage, example, steps) in cases.items():
        (tmp_path / case).mkdir()
        tracesql.ingest([_damaged(tmp_path / case, damage)], tmp_path / case / "run")
        found = _warnings(tmp_path / case / "run")
        assert set(found) == {"unterminated_step"}, case
        assert found["unterminated_step"][:2] == (1, example)
        assert sorted(tracesql.query("steps", tmp_path / case / "run")["step"].unique()) == steps
        _queries_still_answer(tmp_path / case / "run")


def test_rank_clocks_minutes_apart(tmp_path):
    traces = tmp_path / "traces"
    traces.mkdir()
    for f in sorted(STRAGGLER.glob("rank-*.json.gz")):
        shutil.copy(f, traces / f.name)

    def five_minutes_late(events):
        for e in events:
            if "ts" in e:
                e["ts"] += 300e6
    (traces / "rank-3.pt.trace.json.gz").unlink()
    _damaged(traces, five_minutes_late, STRAGGLER / "rank-3.pt.trace.json.gz", "rank-3.pt.trace.json")
    tracesql.ingest([traces], tmp_path / "run")
    con = tracesql.connect(tmp_path / "run")
    rows = con.execute("SELECT rank, check_name, event_count, message FROM warnings").fetchall()
    assert len(rows) == 1 and rows[0][:3] == (3, "clock_skew", 1)
    assert rows[0][3].startswith("trace starts 300.") and "after the median start of the 4 ranks" in rows[0][3]
    stragglers = tracesql.query("collective_stragglers", tmp_path / "run")
    assert stragglers.set_index("rank").loc[3, "times_last"] == 27  # defined: rank 3 now looks last every time

    # re-ingesting only an unchanged file recomputes the run's checks: still one row
    tracesql.ingest([traces], tmp_path / "run")
    assert tracesql.connect(tmp_path / "run").execute("SELECT count(*) FROM warnings").fetchone()[0] == 1


def test_info_shows_sources_rows_span_and_warnings(tmp_path):
    def damage(events):
        for e in _kernels(events)[:2]:
            e["dur"] = -1.0
    trace = _damaged(tmp_path, damage)
    tracesql.ingest([trace], tmp_path / "run")
    out = CliRunner().invoke(main, ["info", str(tmp_path / "run")], catch_exceptions=False).output
    lines = out.splitlines()
    assert lines[1] == f"schema:    version {schema.SCHEMA_VERSION} (written by tracesql {tracesql.__version__})"
    assert lines[2] == "sources:   1 file(s), 1 rank(s) (0); kineto 1"
    timed = [e for e in raw_events(trace) if e.get("ph") == "X" and e["dur"] >= 0]  # µs
    start, end = min(e["ts"] for e in timed), max(e["ts"] + e["dur"] for e in timed)
    assert (start, end) == (1682725897226747, 1682725900594091)
    assert lines[3] == "time span: 2023-04-28 23:51:37.226747 UTC → 2023-04-28 23:51:40.594091 UTC (3.367 s)"
    instants = [e for e in raw_events(trace) if e.get("ph") in ("i", "I")]
    assert len(timed) + len(instants) == 4809
    assert "slices 4,809, ops 2,329" in lines[4] and "warnings 1" in lines[4]
    assert "4,855 events (2 skipped)  rank-0.json" in lines[5]
    assert lines[6] == "warnings:  1"
    assert "end_before_start" in lines[7] and "2 event(s) skipped: end before start" in lines[7]


def test_info_of_a_folder_that_is_not_a_run(tmp_path):
    result = CliRunner().invoke(main, ["info", str(tmp_path)])
    assert result.exit_code == 1 and result.output == f"Error: {tmp_path}: not a tracesql run (no tracesql.json); " \
                                                      "`tracesql ingest` makes one\n"


@pytest.mark.parametrize("check", ["end_before_start", "kernel_without_launch"])
def test_strict_still_fails_only_on_skipped_events(tmp_path, check):
    def damage(events):
        if check == "end_before_start":
            _kernels(events)[0]["dur"] = -1.0
        else:
            _kernels(events)[0]["args"]["correlation"] = 10**12
    trace = _damaged(tmp_path, damage)
    if check == "end_before_start":
        with pytest.raises(tracesql.TraceError, match="damaged events: 1 end before start"):
            tracesql.ingest([trace], tmp_path / "run", strict=True)
    else:  # unlinked events are data, not damage to refuse
        tracesql.ingest([trace], tmp_path / "run", strict=True)
        assert _warnings(tmp_path / "run")["kernel_without_launch"][0] == 1


def test_unlaunched_kernels_name_the_unknown_category_that_holds_their_launches(tmp_path):
    """Launch calls under a category tracesql does not know: the warning says so, not 'no host runtime calls'."""
    events = []
    for i in range(3):
        events += [{"ph": "X", "cat": "acme_runtime", "name": "acmeLaunch", "ts": 10 * i, "dur": 2, "pid": 1,
                    "tid": 1, "args": {"correlation": i + 1}},
                   {"ph": "X", "cat": "kernel", "name": "k", "ts": 10 * i + 3, "dur": 4, "pid": 0, "tid": 7,
                    "args": {"correlation": i + 1, "device": 0, "stream": 7}}]
    tracesql.ingest([write_trace(tmp_path / "t.json", events)], tmp_path / "run")
    count, _, message, _ = _warnings(tmp_path / "run")["kernel_without_launch"]
    assert count == 3 and "their correlation ids are on 3 host event(s) of category 'acme_runtime'" in message
