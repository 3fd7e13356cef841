"""No row reports a rate above the device's peak without saying so (issue 25): on every bundled run and every
corpus trace (skipped without the corpus), each row of roofline (FLOP/s, bytes/s), mfu (MFU, HFU) and collectives
(bus bandwidth against the link) whose rate exceeds the peak it is set against says 'exceeds the device's peak'
in its `warning` column. Each query runs with the peaks the trace's device gives, and with a named device's
(H100-SXM, rated at fp32: every run gets peaks, so the check applies to all of them). On the corpus the
trace's-device runs are test_corpus's own runs of those queries (OWN_DEVICE is its parameters for them): the
check reads their rows there instead of running the queries again here."""

from __future__ import annotations

import pytest

import tracesql
from conftest import CORPUS, DATASETS
from tracesql import queries
from tracesql.readers import trace_suffixes

EXCEEDS = "exceeds the device's peak"
#: query -> parameters, with the peaks of the trace's device: every roofline row, MFU as well as HFU
OWN_DEVICE = {
    "roofline": {"top": 1000},
    "mfu": {"model_flops_per_step": 1e13},
    "collectives": {},
}
#: the same with a named device's peaks; roofline at an explicit dtype (fp32, below the ops' bf16/fp16 peaks)
NAMED_DEVICE = {
    "roofline": {"top": 1000, "dtype": "fp32", "device": "H100-SXM"},
    "mfu": {"model_flops_per_step": 1e13, "device": "H100-SXM"},
    "collectives": {"device": "H100-SXM"},
}


def rates(query: str, row: dict) -> list[tuple]:
    """(achieved, peak) of each rate the row reports against a peak."""
    if query == "roofline":
        return [(row["achieved_flops_per_s"], row["peak_flops_per_s"]),
                (row["achieved_bytes_per_s"], row["peak_bytes_per_s"])]
    if query == "mfu":
        return [(row["mfu"], 1), (row["hfu"], 1)]
    busbw = row["busbw_gbps"] * 1e9 if row["busbw_gbps"] is not None else None
    return [(busbw, row["link_bytes_per_s"])]


def assert_above_peak_is_warned(name: str, params: dict, found) -> None:
    """Each row of `found` (query `name`'s result) with a rate above its peak says so in `warning`."""
    cols = [c[0] for c in found.description]
    for values in found.fetchall():
        row = dict(zip(cols, values))
        above = [(a, p) for a, p in rates(name, row) if a is not None and p is not None and a > p]
        assert not above or EXCEEDS in (row["warning"] or ""), (name, params, row)


def traces():
    bundled = [pytest.param(p, True, id=f"datasets/{p.name}") for p in sorted(DATASETS.iterdir())
               if p.is_dir() and p.name != "generators"]
    corpus = [pytest.param(p, False, id=f"corpus/{p.relative_to(CORPUS)}", marks=pytest.mark.corpus)
              for p in sorted(CORPUS.rglob("*")) if p.is_file() and p.name.endswith(trace_suffixes())] \
        if CORPUS.is_dir() else []
    return bundled + corpus


@pytest.mark.slow
@pytest.mark.parametrize("trace, own_device_here", traces())
def test_no_rate_above_peak_without_warning(trace, own_device_here, ingested):
    con = tracesql.connect(ingested(trace))
    cases = [*(OWN_DEVICE.items() if own_device_here else ()), *NAMED_DEVICE.items()]  # corpus: test_corpus's
    for name, params in cases:
        assert_above_peak_is_warned(name, params, queries.run(con, queries.find(name), params))


def test_tpu_async_copies_are_costed_over_their_span(ingested):
    """The issue's case: a TPU copy-start (1-2 µs) was credited with its whole 5.37 GB transfer, 925.6 PB/s, 56
    million % of the roofline. Now each copy-start's time is its async span, from its start to the end of the
    copy-done that completes it (recomputed here from the slices), the copy-dones are its wait (not costed
    again), and no rate exceeds TPU v6e's peak."""
    con = tracesql.connect(ingested(DATASETS / "xprof_tpu_inference"))
    found = queries.run(con, queries.find("roofline"), {"dtype": "bf16", "top": 100})
    cols = [c[0] for c in found.description]
    roof = {r[cols.index("name")]: dict(zip(cols, r)) for r in found.fetchall()}
    assert not any(n.startswith("copy-done") for n in roof)
    assert all(r["roofline_pct"] <= 100 and r["warning"] is None for r in roof.values())
    # the spans, independently: each copy-start execution to the end of the next execution of its copy-done
    # (XLA's pairs: copy-start.N with copy-done.N here) on the same core
    events = con.execute("SELECT device_id, name, ts, ts + dur FROM slices WHERE kind = 'kernel' "
                         "AND starts_with(name, 'copy-') ORDER BY device_id, ts").fetchall()
    spans: dict[str, int] = {}
    for i, (device, name, ts, _) in enumerate(events):
        if name.startswith("copy-start"):
            done = name.replace("start", "done")
            end = next(e for d, n, _, e in events[i + 1:] if d == device and n == done)
            spans[name] = spans.get(name, 0) + end - ts
    assert {n: roof[n]["device_ns"] for n in spans} == spans
    assert roof["copy-start.4"]["device_ns"] == spans["copy-start.4"] and 0.2e12 < spans["copy-start.4"] < 0.3e12
    # bytes over that time: a transfer to or from host memory, far below HBM's 1.64 TB/s
    assert all(r["achieved_bytes_per_s"] < 30e9 for n, r in roof.items() if n.startswith("copy-start"))
