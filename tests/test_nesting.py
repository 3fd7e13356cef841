"""normalize's nesting (numpy, a run of tracks at a time) against a stack of open events walked one slice at a
time, written independently here: parent, depth, innermost enclosing op and collective call, op depth, step, and
each op's span of positions, on random tracks with what makes nesting go wrong (partial overlaps, zero-length
events, equal starts and ends, tracks split across batches, a track with no name)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tracesql import normalize


def stack_walk(rows: dict, steps: dict) -> tuple[list[tuple], list[tuple]]:
    """(per slice in order: parent, depth, op, op depth, call, step), (op, position, position after its subtree).
    An event that starts inside the top of the stack but ends after it is not its child, and closes it."""
    out, spans, stack = [], [], []  # stack: (end, slice_id, position, is_op, is_call)
    n = len(rows["slice_id"])
    for pos in range(n + 1):
        while stack and (pos == n or rows["track"][pos] != rows["track"][pos - 1]
                         or stack[-1][0] <= rows["ts"][pos] and not stack[-1][0] == rows["ts"][pos] == rows["end_ts"][pos]
                         or stack[-1][0] < rows["end_ts"][pos]):
            end, sid, at, is_op, _ = stack.pop()
            if is_op:
                spans.append((sid, at, pos))
        if pos == n:
            break
        ops = [s for s in stack if s[3]]
        calls = [s for s in stack if s[4]]
        t = rows["ts"][pos]
        inside = [k for k in range(len(steps["ts"])) if steps["ts"][k] <= t < steps["end_ts"][k]]
        # the step that starts last at or before t, if t is inside it
        last = max((k for k in range(len(steps["ts"])) if steps["ts"][k] <= t), default=None)
        out.append((stack[-1][1] if stack else None, len(stack), ops[-1][1] if ops else None, len(ops),
                    calls[-1][1] if calls else None, int(steps["step"][last]) if last in inside else None))
        stack.append((rows["end_ts"][pos], rows["slice_id"][pos], pos, rows["is_op"][pos], rows["is_call"][pos]))
    return out, sorted(spans, key=lambda s: s[1])


def random_tracks(rng) -> pa.Table:
    n = int(rng.integers(1, 300))
    track = np.sort(rng.integers(0, 4, n))
    ts = rng.integers(0, 40, n) * int(rng.choice([1, 10]))  # a small range: starts and ends coincide often
    dur = rng.integers(0, 25, n) * rng.integers(0, 2, n)  # half of them zero-length
    table = pa.table({"rank": np.zeros(n, np.int32), "slice_id": rng.permutation(n) + 100,
                      "track": [None if t == 3 else f"t{t}" for t in track],
                      "ts": ts, "end_ts": ts + dur, "is_op": rng.random(n) < 0.5, "is_call": rng.random(n) < 0.2,
                      "dur": dur, "self_time_child": rng.random(n) < 0.5, "device_time": rng.random(n) < 0.5})
    order = pc.sort_indices(table, [("track", "ascending", "at_end"), ("ts", "ascending"), ("dur", "descending"),
                                    ("slice_id", "ascending")])
    return table.take(order)


@pytest.mark.parametrize("seed", range(4))
def test_nesting_matches_a_stack_walk(seed):
    rng = np.random.default_rng(seed)
    partial_overlaps = 0
    for _ in range(60):
        table = random_tracks(rng)
        starts = np.sort(rng.integers(0, 300, 3))
        steps = {"rank": np.zeros(3, np.int32), "ts": starts, "end_ts": starts + rng.integers(1, 80, 3),
                 "step": np.arange(3)}
        spans = []
        nest = pa.Table.from_batches(list(normalize._nest(iter(table.to_batches(max_chunksize=int(rng.integers(1, 50)))),
                                                          steps, spans.append)))
        rows = table.to_pydict()
        want, want_spans = stack_walk(rows, steps)
        got = list(zip(nest["parent_id"].to_pylist(), nest["depth"].to_pylist(), nest["op_id"].to_pylist(),
                       nest["op_depth"].to_pylist(), nest["call_id"].to_pylist(), nest["step"].to_pylist()))
        assert got == want
        assert nest["slice_id"].to_pylist() == rows["slice_id"] and nest["pos"].to_pylist() == list(range(len(got)))
        got_spans = pa.Table.from_batches(spans).sort_by("pos").drop_columns(["rank"]) if spans else None
        assert (list(zip(*got_spans.to_pydict().values())) if spans else []) == want_spans
        partial_overlaps += sum(1 for i in range(1, len(got)) if rows["track"][i] == rows["track"][i - 1]
                                and rows["ts"][i] < rows["end_ts"][i - 1] < rows["end_ts"][i])
    assert partial_overlaps > 100  # the case the stack's rule is for is exercised


@pytest.mark.parametrize("seed", range(5))
def test_child_time_is_the_union_of_the_childrens_intervals(seed):
    """_child_time (a running maximum, a batch at a time) against merging each parent's intervals: overlapping
    and nested siblings, equal starts, zero-length children, parents whose children span batches."""
    rng = np.random.default_rng(seed)
    n = 400
    parent = np.sort(rng.integers(0, 40, n))
    ts = rng.integers(0, 1000, n) + (1 << 60)  # epoch-scale times
    te = ts + rng.choice([0, 1, 5, 50, 300], n)
    order = np.lexsort((te, ts, parent))
    parent, ts, te = parent[order], ts[order], te[order]
    expected = {}
    for p in np.unique(parent):
        covered, reach = 0, None
        for a, b in zip(ts[parent == p].tolist(), te[parent == p].tolist()):  # by start: merge into the union
            covered += max(b - max(a, reach), 0) if reach is not None else b - a
            reach = b if reach is None else max(reach, b)
        expected[int(p)] = covered
    batch = int(rng.integers(3, 30))
    batches = [pa.record_batch({"rank": np.zeros(len(parent[i:i + batch]), np.int32), "parent_id": parent[i:i + batch],
                                "ts": ts[i:i + batch], "te": te[i:i + batch]})
               for i in range(0, n, batch)]
    got = {}
    for out in normalize._child_time(batches):
        for p, ns in zip(out["slice_id"].to_pylist(), out["ns"].to_pylist()):
            got[p] = got.get(p, 0) + ns  # a parent split across batches: a row per batch
    assert got == expected
    assert sum(expected.values()) > 0


@pytest.mark.parametrize("seed", range(3))
def test_ranks_nest_apart(seed):
    """Several ranks' slices in one pass (a batch of archive members: normalize.normalize_batch) nest as each
    rank's alone, though their tracks, slice ids and step times are the same: no parent, op, call or step of one
    rank reaches another's events."""
    rng = np.random.default_rng(seed)
    tables, steps, alone = [], [], []
    columns = ["rank", "slice_id", "parent_id", "depth", "op_id", "op_depth", "call_id", "step"]
    for rank in range(3):
        table = random_tracks(rng)
        table = table.set_column(0, "rank", pa.array(np.full(table.num_rows, rank, np.int32)))
        starts = np.sort(rng.integers(0, 300, 3))
        rank_steps = {"rank": np.full(3, rank, np.int32), "ts": starts, "end_ts": starts + rng.integers(1, 80, 3),
                      "step": np.arange(3) + 10 * rank}
        alone.append(pa.Table.from_batches(list(normalize._nest(iter(table.to_batches()), rank_steps,
                                                                lambda _: None))).select(columns))
        tables.append(table)
        steps.append(rank_steps)
    together = pa.Table.from_batches(list(normalize._nest(
        iter(pa.concat_tables(tables).to_batches(max_chunksize=int(rng.integers(1, 50)))),
        {k: np.concatenate([s[k] for s in steps]) for k in steps[0]}, lambda _: None)))
    assert together.select(columns).to_pylist() == pa.concat_tables(alone).to_pylist()
    assert len(set(together["slice_id"].to_pylist())) < together.num_rows  # ids repeat across the ranks


def test_child_time_keeps_ranks_apart():
    """The same parent id on two ranks (a batch's members) is two parents, also when a batch ends between them."""
    rows = {"rank": np.array([0, 0, 1, 1], np.int32), "parent_id": np.array([5, 5, 5, 5]),
            "ts": np.array([0, 10, 0, 0]), "te": np.array([10, 20, 5, 30])}
    for cut in (4, 1, 2, 3):
        batches = [pa.record_batch({k: v[:cut] for k, v in rows.items()}),
                   pa.record_batch({k: v[cut:] for k, v in rows.items()})]
        got = {}
        for out in normalize._child_time(batches):
            for r, p, ns in zip(*(out[c].to_pylist() for c in ("rank", "slice_id", "ns"))):
                got[r, p] = got.get((r, p), 0) + ns
        assert got == {(0, 5): 20, (1, 5): 30}
