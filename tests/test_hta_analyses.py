"""HTA's counter-style analyses as curated queries: queue length, memory-copy bandwidth, frequent kernel sequences
and CUPTI counters, each against what HTA 0.5 itself computes on its own test traces
(tests/data/make_hta_counters_reference.py wrote tests/data/hta_counters_reference.json; its times are the
traces' whole µs, tracesql's ns)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracesql
from conftest import DATASETS, corpus_path

REFERENCE = json.loads((Path(__file__).parent / "data" / "hta_counters_reference.json").read_text())
#: HTA attributes to these ops kernels they did not launch (see queries/kernel_sequences.sql): 555 kernels
#: (109 ms) to two aten::item calls of 1 µs on the autograd thread
HTA_CALL_GRAPH_ARTIFACTS = {("negative_queue_length_values_check", "aten::item"),
                            ("negative_queue_length_values_check", "aten::select")}


def run_of(name: str, ingested):
    if name in ("nccl_parser_config", "cupti_profiler"):
        return ingested(DATASETS / f"hta_{name}")
    return ingested(corpus_path("hta", "tests", "data", *name.split("/")))


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_queue_length_equals_hta(name, ingested):
    run = run_of(name, ingested)
    reference = REFERENCE[name]["queue_length"]
    got = tracesql.query("queue_length", run, analysis_window="hta", time_unit_ns=1000,
                         max_queue_length=4).set_index("stream")
    # Where a launch and a device start share a timestamp on a stream, HTA orders them with numpy's unstable sort
    # and tracesql counts the device start first: each such timestamp moves the points between them by at most 2,
    # so the summed queue lengths differ by at most 2 x (changes at mixed timestamps)
    con = tracesql.connect(run)
    mixed = dict(con.sql("""
        SELECT stream, COALESCE(sum(n) FILTER (WHERE ups > 0 AND downs > 0), 0) FROM (
            SELECT stream, ts, count(*) AS n, count(*) FILTER (WHERE delta = 1) AS ups,
                   count(*) FILTER (WHERE delta = -1) AS downs
            FROM (SELECT stream, ts, queue_length - lag(queue_length, 1, 0) OVER (
                      PARTITION BY stream ORDER BY ts, queue_length) AS delta
                  FROM queue_changes(analysis_window := 'hta', time_unit_ns := 1000))
            GROUP BY stream, ts)
        GROUP BY stream""").fetchall())
    assert sorted(got.index) == sorted(r["stream"] for r in reference["summary"])
    for ref in reference["summary"]:
        row = got.loc[ref["stream"]]
        assert (row.changes, row.min_length, row.max_length) == (ref["count"], ref["min"], ref["max"])
        assert (row.p25_length, row.p50_length, row.p75_length) == (ref["25%"], ref["50%"], ref["75%"])
        bound = 2 * mixed[ref["stream"]] / ref["count"]
        assert abs(row.mean_length - ref["mean"]) <= bound + 1e-12
        if bound == 0:
            assert row.std_length == pytest.approx(ref["std"], rel=1e-12)
    # HTA keeps one stream per rank (a dict keyed by rank: the last stream it visits) of the time at a full queue
    for blocked in reference["blocked_on_full_queue"]["4"]:
        assert got.loc[blocked["stream"], "at_max_ns"] == blocked["duration"] * 1000
    assert reference["blocked_on_full_queue"]["1024"] == []
    assert (tracesql.query("queue_length", run, analysis_window="hta").at_max_ns == 0).all()


@pytest.mark.parametrize("name", sorted(n for n in REFERENCE if REFERENCE[n]["memory_bw"]))
def test_copy_bandwidth_equals_hta(name, ingested):
    run = run_of(name, ingested)
    got = tracesql.query("copy_bandwidth", run, analysis_window="hta").set_index("copy_kind")
    assert sorted(got.index) == sorted(r["name"] for r in REFERENCE[name]["memory_bw"])
    for ref in REFERENCE[name]["memory_bw"]:
        row = got.loc[ref["name"]]
        if (name, ref["name"]) == ("ns_resolution_trace", "Memcpy DtoD"):
            # HTA's running float sum leaves 1.1e-16 GB/s after copies end: 5 such points counted as running
            assert ref["min"] < 1e-15 and ref["count"] - row.points == 5
            continue
        assert row.points == ref["count"]
        for column, stat in (("mean_gbps", "mean"), ("std_gbps", "std"), ("min_gbps", "min"), ("p25_gbps", "25%"),
                             ("p50_gbps", "50%"), ("p75_gbps", "75%"), ("max_gbps", "max")):
            assert row[column] == pytest.approx(ref[stat], rel=1e-9), (ref["name"], column)


def test_copy_bandwidth_is_bytes_over_time(ingested):
    """A second method: each copy's recorded bandwidth is its bytes over its duration, so a kind's busy_gbps times
    its busy time is its bytes wherever its copies never overlap (bundled nccl_parser_config)."""
    run = ingested(DATASETS / "hta_nccl_parser_config")
    got = tracesql.query("copy_bandwidth", run).set_index("copy_kind")
    con = tracesql.connect(run)
    for kind, row in got.iterrows():
        overlapping = con.execute(f"""
            SELECT count(*) FROM (SELECT ts, lag(ts + dur) OVER (ORDER BY ts) AS prev_end FROM slices
                                  WHERE kind IN ('memcpy', 'memset') AND starts_with(name, '{kind[:6]}'))
            WHERE ts < prev_end""").fetchone()[0]
        if overlapping == 0 and kind != "Memset":
            assert row.busy_gbps * row.busy_ns == pytest.approx(row.bytes, rel=1e-6)


@pytest.mark.parametrize("name", sorted(n for n in REFERENCE if isinstance(REFERENCE[n]["kernel_sequences"], dict)
                                        and "error" not in REFERENCE[n]["kernel_sequences"]
                                        and REFERENCE[n]["kernel_sequences"]))
def test_kernel_sequences_equal_hta(name, ingested):
    run = run_of(name, ingested)
    for operator, reference in REFERENCE[name]["kernel_sequences"].items():
        got = tracesql.query("kernel_sequences", run, operator=operator, analysis_window="hta")
        if (name, operator) in HTA_CALL_GRAPH_ARTIFACTS:
            assert got.empty
            continue
        mine = [(r.occurrences, r.kernel_ns, r.root_ns, r.pattern) for r in got.itertuples()]
        hta = [(r["count"], r["kernel_dur"] * 1000, r["op_dur"] * 1000, r["pattern"]) for r in reference]
        assert mine == hta, operator
        assert (got.kernels == got.kernel_names.map(len)).all()


def test_kernel_sequences_of_bundled_trace(ingested):
    """Every top-level host event by default; `top` keeps the most frequent patterns. A second method: with
    min_pattern_len 1 the top-level events' patterns hold every launched device event exactly once, so their kernel
    time is the device time of all device work whose launching call is in the trace."""
    run = ingested(DATASETS / "hta_nccl_parser_config")
    everything = tracesql.query("kernel_sequences", run, min_pattern_len=1)
    assert len(everything) > 5 and (everything.occurrences.diff().dropna() <= 0).all()
    assert list(tracesql.query("kernel_sequences", run, min_pattern_len=1, top=3).pattern) == \
        list(everything.pattern[:3])
    con = tracesql.connect(run)
    (device_ns, launched), = con.execute("""
        SELECT sum(d.dur), count(*) FROM slices d JOIN slices l ON l.rank = d.rank AND l.slice_id = d.launch_id
        WHERE d.device_id IS NOT NULL""").fetchall()
    assert everything.kernel_ns.sum() == device_ns == 165_185_838
    assert (everything.kernels * everything.occurrences).sum() == launched


def test_kernel_counters_equal_hta(ingested):
    got = tracesql.query("kernel_counters", run_of("cupti_profiler", ingested))
    reference = REFERENCE["cupti_profiler"]["counters"]
    assert len(got) == len(reference) == 77
    for row, ref in zip(got.itertuples(), reference):
        assert (row.name, row.top_level_op, row.bottom_level_op, list(row.op_stack)) == \
            (ref["name"], ref["top_level_op"], ref["bottom_level_op"], ref["op_stack"])
        counters = json.loads(row.counters)
        assert all(counters[k] == v for k, v in ref["values"].items())
        fma = sum(v for k, v in ref["values"].items() if "fma" in k)
        assert row.sass_flops == 2 * fma + sum(v for k, v in ref["values"].items() if "fma" not in k)
    assert got.kernel_index.tolist() == list(range(77))


def test_kernel_counters_need_counter_events(ingested):
    assert tracesql.query("kernel_counters", ingested(DATASETS / "hta_nccl_parser_config")).empty
