"""Collectives (busbw, matching across ranks, stragglers) and memory (peaks, curve, ops), checked against a
brute-force computation over the raw JSON of real traces."""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict

import pytest

import tracesql
from conftest import DATASETS, corpus_path
from tracesql import queries

STRAGGLER = DATASETS / "torch_gloo_4rank_straggler"  # rank 2 made late on purpose (see its SOURCE.md)
GLOO_2 = DATASETS / "torch_gloo_2rank"


def _query(name, run, **params):
    return queries.run(tracesql.connect(run), queries.find(name), params).df()


def _ns(us: float) -> int:
    """Kineto µs -> integer ns exactly as the reader converts (integer part and rounded fraction apart)."""
    whole = math.floor(us)
    return whole * 1000 + round((us - whole) * 1000)


def _trace(path):
    """(rank, base time ns, events) of a raw trace file, as json.loads sees it (rank 0 when not recorded)."""
    data = json.loads(gzip.open(path).read())
    rank = data.get("distributedInfo", {}).get("rank", 0)
    return rank, int(data.get("baseTimeNanoseconds") or 0), data["traceEvents"]


# --- busbw_factor -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 128])
def test_busbw_factor_is_nccl_tests(ingested, n):
    con = tracesql.connect(ingested(GLOO_2))
    expected = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_to_all": (n - 1) / n,
        "broadcast": 1.0, "reduce": 1.0, "send": 1.0, "recv": 1.0, "send_recv": 1.0,
        "barrier": None, "gather": None, "scatter": None, "no_such_collective": None,
    }
    for collective, factor in expected.items():
        got = con.execute("SELECT busbw_factor(?, ?)", [collective, n]).fetchone()[0]
        assert got == pytest.approx(factor) if factor is not None else got is None, (collective, n)


def test_busbw_factor_without_group_size(ingested):
    """Size-independent factors stay known when the group size is not; the others become NULL."""
    con = tracesql.connect(ingested(GLOO_2))
    got = con.execute("SELECT busbw_factor('broadcast', NULL), busbw_factor('send', NULL), "
                      "busbw_factor('all_reduce', NULL), busbw_factor('all_gather', 0)").fetchone()
    assert got == (1.0, 1.0, None, None)


# --- collectives and stragglers on a real 4-rank trace --------------------------------------------------------------

def _raw_calls(folder):
    """Per rank, its c10d calls in time order as json.loads sees them: (name, start ns, duration ns, input dims)."""
    calls = {}
    for path in sorted(folder.glob("*.json.gz")):
        rank, base, events = _trace(path)
        ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
               and e["name"].startswith("c10d::")]
        calls[rank] = sorted(((e["name"], _ns(e["ts"]) + base, _ns(e["dur"]), e["args"].get("Input Dims"))
                              for e in ops), key=lambda c: c[1])
    return calls


def _raw_instances(folder):
    """The k-th call of a kind on every rank is instance k of that kind (one process group and no recorded
    sequence numbers: tracesql counts each kind's calls apart): skews, last rank, min duration; by start."""
    calls = _raw_calls(folder)
    ranks = sorted(calls)
    numbered: dict[tuple, dict] = {}
    for r in ranks:
        count: dict[str, int] = {}
        for call in calls[r]:
            k = count.get(call[0], 0)
            numbered.setdefault((call[0], k), {})[r] = call
            count[call[0]] = k + 1
    instances = []
    for (name, seq), per_rank in numbered.items():
        assert sorted(per_rank) == ranks, "every rank made the same calls"
        earliest = min(c[1] for c in per_rank.values())
        last = max(ranks, key=lambda r: (per_rank[r][1], r))
        instances.append({
            "seq": seq, "name": name, "start_ns": earliest, "last_rank": last,
            "skew": {r: per_rank[r][1] - earliest for r in ranks},
            "dur": {r: per_rank[r][2] for r in ranks}, "dims": per_rank[ranks[0]][3],
        })
    return ranks, sorted(instances, key=lambda i: i["start_ns"])


def test_collectives_match_brute_force_over_raw_json(ingested):
    ranks, raw = _raw_instances(STRAGGLER)
    df = _query("collectives", ingested(STRAGGLER)).sort_values("start_ns").reset_index(drop=True)
    assert ranks == [0, 1, 2, 3] and len(raw) == len(df) == 27  # 3 steps × (4 DDP all_reduces + 5 explicit)
    for row, inst in zip(df.itertuples(), raw):
        assert row.seq == inst["seq"] and row.timing == "host" and row.consistent
        assert row.ranks_seen == 4 and row.group_size == 4  # no group metadata: the world size
        assert list(row.ranks) == ranks
        assert list(row.start_skew_ns) == [inst["skew"][r] for r in ranks]
        assert row.start_ns == inst["start_ns"] and row.last_rank == inst["last_rank"]
        assert row.max_skew_ns == max(inst["skew"].values())
        assert row.duration_ns == min(inst["dur"].values()) and row.max_duration_ns == max(inst["dur"].values())
    # all_to_all_single of 4·world int64: 128 bytes; algbw = bytes / min duration; busbw × (n−1)/n
    a2a = df[df.collective == "all_to_all"]
    assert len(a2a) == 3
    for row in a2a.itertuples():
        inst = next(i for i in raw if i["name"] == "c10d::alltoall_base_" and i["seq"] == row.seq)
        assert inst["dims"][0] == [16]
        assert row.size_bytes == 16 * 8
        assert row.algbw_gbps == pytest.approx(128 / min(inst["dur"].values()))
        assert row.busbw_gbps == pytest.approx(row.algbw_gbps * 3 / 4)
    # gloo records no dtype for tensor lists: the DDP all_reduces have no size, hence no bandwidth (NULL, not 0)
    all_reduce = df[df.collective == "all_reduce"]
    assert len(all_reduce) == 12 and all_reduce.size_bytes.isna().all() and all_reduce.busbw_gbps.isna().all()


def test_stragglers_match_brute_force_and_find_the_slow_rank(ingested):
    ranks, raw = _raw_instances(STRAGGLER)
    expected = {}
    for r in ranks:
        lateness = [inst["skew"][r] for inst in raw]
        expected[r] = {
            "instances": len(raw), "times_last": sum(inst["last_rank"] == r for inst in raw),
            "mean_lateness_ns": sum(lateness) / len(raw), "max_lateness_ns": max(lateness),
            "wait_ns": sum(inst["dur"][r] - min(inst["dur"].values()) for inst in raw),
        }
    df = _query("collective_stragglers", ingested(STRAGGLER))
    assert sorted(df["rank"]) == ranks
    for row in df.itertuples():
        e = expected[row.rank]
        assert (row.instances, row.times_last, row.max_lateness_ns, row.wait_ns) == (
            e["instances"], e["times_last"], e["max_lateness_ns"], e["wait_ns"])
        assert row.mean_lateness_ns == pytest.approx(e["mean_lateness_ns"])
        assert row.last_share == pytest.approx(e["times_last"] / e["instances"])
    order = sorted(ranks, key=lambda r: (-expected[r]["times_last"], -expected[r]["mean_lateness_ns"], r))
    assert list(df.sort_values("straggler_rank")["rank"]) == order
    # the injected straggler (5 ms late before each explicit collective and each forward) is found
    top = df[df.straggler_rank == 1].iloc[0]
    assert top["rank"] == 2 and top.last_share > 0.5
    assert top.mean_lateness_ns > 2 * df[df["rank"] != 2].mean_lateness_ns.max()


def test_misaligned_sequences_are_flagged_and_left_out_of_stragglers(ingested):
    """trace_filter's two ranks were cut at different points of a 128-rank job: their first calls differ (rank 0:
    an all_to_all of int64, rank 1: of uint8), so matching by sequence pairs different calls."""
    run = ingested(DATASETS / "hta_trace_filter")
    df = _query("collectives", run)
    first = df[df.seq == 0].iloc[0]
    assert first.collective == "all_to_all" and not first.consistent and first.group_size == 128
    stragglers = _query("collective_stragglers", run)
    assert set(stragglers.instances) == {int(df.consistent.sum())}


def test_wait_records_are_not_collectives(ingested):
    """nccl_parser_config's record_param_comms include `wait`: left out; the rest keep their recorded group."""
    df = _query("collectives", ingested(DATASETS / "hta_nccl_parser_config"))
    assert set(df.collective) == {"broadcast", "all_reduce"}
    assert (df.timing == "device").all() and (df.group_size == 2).all() and (df.pg_name == "0").all()
    # 2 ranks: all_reduce's factor 2(n−1)/n = 1, so busbw = algbw; algbw = size / device duration
    assert (df.busbw_gbps == df.algbw_gbps).all()
    assert (df.algbw_gbps == df.size_bytes / df.duration_ns).all()


# --- memory -----------------------------------------------------------------------------------------------------

def _raw_memory(path):
    """Per device: the `[memory]` events in time order as (ts ns, file index, allocated, reserved, bytes, addr)."""
    _, base, events = _trace(path)
    devices = defaultdict(list)
    for i, e in enumerate(events):
        if e.get("name") == "[memory]":
            a = e["args"]
            device = ({0: "cpu", 1: "gpu"}.get(a.get("Device Type"), "other"), a.get("Device Id"))
            devices[device].append((_ns(e["ts"]) + base, i, a["Total Allocated"], a["Total Reserved"],
                                    a["Bytes"], a["Addr"]))
    return {d: sorted(evs) for d, evs in devices.items()}


def _memory_sources():
    return [GLOO_2 / "rank-0.pt.trace.json.gz", GLOO_2 / "rank-1.pt.trace.json.gz"]


def _check_peaks(df, rank, devices):
    for (device_type, device_id), evs in devices.items():
        row = df[(df["rank"] == rank) & (df.device_type == device_type) & (df.device_id == device_id)].iloc[0]
        peak_a = max(e[2] for e in evs)
        peak_r = max(e[3] for e in evs)
        assert row.events == len(evs)
        assert row.peak_allocated_bytes == peak_a and row.peak_allocated_ts == next(e[0] for e in evs if e[2] == peak_a)
        assert row.final_allocated_bytes == evs[-1][2]
        if device_type == "cpu":  # PyTorch's CPU allocator has no cache: Total Reserved 0 is no figure
            assert peak_r == 0 and row[["peak_reserved_bytes", "peak_reserved_ts", "final_reserved_bytes"]].isna().all()
            continue
        assert row.peak_reserved_bytes == peak_r and row.peak_reserved_ts == next(e[0] for e in evs if e[3] == peak_r)
        assert row.final_reserved_bytes == evs[-1][3]


def test_memory_peaks_match_raw_events(ingested):
    df = _query("memory", ingested(GLOO_2))
    for rank, path in enumerate(_memory_sources()):
        devices = _raw_memory(path)
        assert set(devices) == {("cpu", -1)}
        _check_peaks(df, rank, devices)
    # CPU: no cache, no reserved figure (NULL; before: 0)
    assert (df.peak_allocated_bytes == 390_640).all() and df.peak_reserved_bytes.isna().all()
    # the op that allocated at the peak (the framework op on the thread; XPlane's allocator events name it too)
    assert (df.peak_op == "aten::sum").all()


def test_gpu_memory_peaks_match_raw_events(ingested):
    path = corpus_path("tracelens", "tests", "traces", "h100", "gaunernst_bert-small-uncased__1016001.json.gz")
    df = _query("memory", ingested(path))
    devices = _raw_memory(path)
    assert ("gpu", 0) in devices
    _check_peaks(df, 0, devices)
    gpu = df[df.device_type == "gpu"].iloc[0]
    assert gpu.peak_reserved_bytes >= gpu.peak_allocated_bytes > 0


def _raw_curve(evs, points):
    """Brute force of memory_curve: the highest level the step function reaches in each of `points` intervals."""
    t0, span = evs[0][0], evs[-1][0] - evs[0][0]
    out = []
    level = None  # (allocated, reserved) carried into the interval
    for p in range(points):
        inside = [e for e in evs if (min(points - 1, (e[0] - t0) * points // span) if span else 0) == p]
        alloc = [e[2] for e in inside] + ([level[0]] if level else [])
        res = [e[3] for e in inside] + ([level[1]] if level else [])
        out.append((p, t0 + span * p // points, max(alloc), max(res), len(inside)))
        if inside:
            level = (inside[-1][2], inside[-1][3])
    return out


@pytest.mark.parametrize("points", [1, 7, 100])
def test_memory_curve_matches_brute_force(ingested, points):
    df = _query("memory_curve", ingested(GLOO_2), points=points)
    for rank, path in enumerate(_memory_sources()):
        evs = _raw_memory(path)[("cpu", -1)]
        got = df[df["rank"] == rank][["point", "ts", "allocated_bytes", "reserved_bytes", "events"]]
        assert got.reserved_bytes.isna().all()  # the CPU's Total Reserved 0 is no figure
        raw = [(p, ts, allocated, events) for p, ts, allocated, _, events in _raw_curve(evs, points)]
        assert [tuple(int(v) for v in r) for r in got.drop(columns="reserved_bytes").itertuples(index=False)] == raw
        assert got.allocated_bytes.max() == max(e[2] for e in evs)  # downsampling keeps the peak


def test_memory_ops_live_at_peak_and_totals_match_raw_events(ingested):
    run = ingested(GLOO_2)
    self_level = _query("memory_ops", run, top=10_000)
    top_level = _query("memory_ops", run, top=10_000, op_level="top")
    for rank, path in enumerate(_memory_sources()):
        evs = _raw_memory(path)[("cpu", -1)]
        peak = max(e[2] for e in evs)
        peak_i = next(i for i, e in enumerate(evs) if e[2] == peak)
        live = 0
        for i, e in enumerate(evs):
            if e[4] > 0 and i <= peak_i:
                freed = next((j for j in range(i + 1, len(evs)) if evs[j][5] == e[5]), None)
                live += e[4] if freed is None or freed > peak_i else 0
        allocated = sum(e[4] for e in evs if e[4] > 0)
        baseline = evs[0][2] - evs[0][4]  # allocated before the profiler started
        for df in (self_level, top_level):
            mine = df[df["rank"] == rank]
            assert mine.live_at_peak_bytes.sum() == live and mine.allocated_bytes.sum() == allocated
            assert mine.allocations.sum() == sum(e[4] > 0 for e in evs)
        assert baseline == 0 and live == peak  # nothing was held before the window: the ops explain the peak
    # the innermost op is mostly the factory (aten::empty); its top-level ops say which model call allocated
    def empty_bytes(df):
        return df[df.op_name == "aten::empty"].allocated_bytes.sum()

    assert self_level.iloc[0].op_name == "aten::empty" and empty_bytes(top_level) < empty_bytes(self_level) / 10
