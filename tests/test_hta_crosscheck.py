"""overlap and temporal_breakdown under HTA's conventions agree with Holistic Trace Analysis 0.5.0's own output.

HTA conventions = class_scheme 'hta' (its kernel name rules), analysis_window 'hta' (kernels launched before the
last ProfilerStep) and time_unit_ns 1000 (it shrinks events to whole µs). Reference numbers:
../shared/corpus/reference/hta/*_hta050.txt (printed by run_hta.py there).
"""

from __future__ import annotations

import pytest

import tracesql
from conftest import DATASETS, corpus_path

HTA = dict(class_scheme="hta", analysis_window="hta", time_unit_ns=1000)
TOLERANCE_PP = 0.1


def hta_numbers(run) -> dict[int, dict]:
    tb = tracesql.query("temporal_breakdown", run, **HTA)
    ov = tracesql.query("overlap", run, **HTA).set_index("rank")
    out = {}
    for row in tb.itertuples():
        out[row.rank] = {
            "kernel_time_us": row.window_ns / 1000,
            "idle_time_pctg": row.idle_pct,
            "compute_time_pctg": row.compute_pct,
            "non_compute_time_pctg": row.non_compute_pct,
            "comp_comm_overlap_pctg": ov.loc[row.rank, "overlap_pct"],
        }
    return out


def parse_reference(text: str, section: str) -> dict[int, dict]:
    """Rows of a pandas table printed after `=== <section>` in an HTA reference file, keyed by rank."""
    block = text.split(f"=== {section}", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    header = block[0].split()
    rows = {}
    for line in block[1:]:
        values = dict(zip(header, line.split()[1:]))
        rows[int(values["rank"])] = {k: float(v) for k, v in values.items()}
    return rows


def assert_agrees(ours: dict, temporal: dict, overlap: dict):
    assert sorted(ours) == sorted(temporal)
    for rank, ref in temporal.items():
        mine = ours[rank]
        for key in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"):
            assert abs(mine[key] - ref[key]) <= TOLERANCE_PP, (rank, key, mine[key], ref[key])
        ref_overlap = overlap[rank]["comp_comm_overlap_pctg"]
        if ref_overlap != ref_overlap:  # HTA prints NaN where there is no communication
            assert mine["comp_comm_overlap_pctg"] != mine["comp_comm_overlap_pctg"]
        else:
            assert abs(mine["comp_comm_overlap_pctg"] - ref_overlap) <= TOLERANCE_PP, (rank, mine, ref_overlap)


def test_bundled_trace_filter_matches_hta_exactly(ingested):
    """Two ranks of a 128-rank job, bundled: HTA 0.5.0 printed these numbers (trace_filter_hta050.txt)."""
    ours = hta_numbers(ingested(DATASETS / "hta_trace_filter"))
    assert ours[0] == {"kernel_time_us": 600058.0, "idle_time_pctg": 53.56, "compute_time_pctg": 17.71,
                       "non_compute_time_pctg": 28.74, "comp_comm_overlap_pctg": 11.81}
    assert ours[1] == {"kernel_time_us": 600674.0, "idle_time_pctg": 54.72, "compute_time_pctg": 22.57,
                       "non_compute_time_pctg": 22.72, "comp_comm_overlap_pctg": 20.05}


REFERENCE_SETS = {
    "trace_filter": "trace_filter",
    "trace_diff_control": "trace_diff/control",
    "nccl_parser_config": "nccl_parser_config",
    "negative_queue_length_values_check": "negative_queue_length_values_check",
    "df_index_resolver": "df_index_resolver",
    "mtia_trace_single_rank": "mtia_trace_single_rank",
}


@pytest.mark.corpus
@pytest.mark.parametrize("name", REFERENCE_SETS)
def test_corpus_matches_hta_reference(name, ingested):
    reference = corpus_path("reference", "hta", f"{name}_hta050.txt").read_text()
    run = ingested(corpus_path("hta", "tests", "data", REFERENCE_SETS[name]))
    temporal = parse_reference(reference, "get_temporal_breakdown")
    overlap = parse_reference(reference, "get_comm_comp_overlap")
    assert_agrees(hta_numbers(run), temporal, overlap)


def test_defaults_differ_from_hta_where_documented(ingested):
    """The default window is every device event; HTA drops the last step. On trace_filter that window is
    twice as long, and the default communication rules also count nothing HTA does not (NCCL only here)."""
    run = ingested(DATASETS / "hta_trace_filter")
    default = tracesql.query("temporal_breakdown", run).set_index("rank")
    hta = tracesql.query("temporal_breakdown", run, **HTA).set_index("rank")
    assert default.loc[0, "window_ns"] == 1_222_847_000 and hta.loc[0, "window_ns"] == 600_058_000
    parts = default[["compute_ns", "exposed_comm_ns", "exposed_memory_ns", "idle_ns"]].sum(axis=1)
    assert (parts == default["window_ns"]).all()  # the four parts add up to the window, exactly
