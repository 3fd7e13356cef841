"""CUDA/HIP-graph replays attributed to the ops that captured them.

A graph replay is one host call (cudaGraphLaunch, hipGraphLaunch) whose correlation id every replayed kernel
carries: the trace of the replay does not say which op launched each kernel. vLLM and SGLang also profile the
capture (`capture_traces/` beside the profile): there, between cudaStreamBeginCapture and cudaStreamEndCapture on
the capturing thread, each kernel launch (its `kernel` arg names the kernel) runs inside the op that launched it,
with that op's recorded shapes. This module matches each replay to a capture region by kernel names — the k-th
replayed kernel of a name is the k-th launch of that name in the region, so a replay that runs the graph's streams
in another order still matches — and adds, per matched replay, copies of the capturing ops (and the ops they nest
in, inside the region) on a host track of their own, each timed over the replayed kernels it launched: normalize
then gives each replayed kernel its copy as op (TraceData.graph_ops). The ops that launched no kernel are not
copied; what cost formulas read of them is kept on the copies: the buffers each op allocated (its aten::empty
calls and those of the ops nested in it, which vLLM's MoE formula reads). See docs/guides/serving.md.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import cached_property

import pyarrow as pa
import pyarrow.compute as pc

from ..schema import LAUNCH_KINDS

GRAPH_LAUNCH = "GraphLaunch"  # cudaGraphLaunch, hipGraphLaunch, cuGraphLaunch, hipGraphLaunch_spt
BEGIN_CAPTURE, END_CAPTURE = "StreamBeginCapture", "StreamEndCapture"
#: Batch sizes that names give: 'bs_32_rank0.json.gz', 'step[DECODE bs=32]', 'capture_32_DECODE', 'execute_32_...'
BATCH_SIZE = re.compile(r"(?:\bbs|batch_size|capture|execute)[=_: ]?(\d+)", re.IGNORECASE)
#: The capture op's args that say what it computed (not which event it was): replays of captures whose ops agree
#: on them are attributed alike
_SIGNATURE_ARGS = ("Input Dims", "Input type", "Concrete Inputs", "Input Strides")
#: The capture's allocations (shape and dtype as Kineto records them: its `Concrete Inputs`) kept on the copies
ALLOCATION, ALLOCATIONS_ARG = "aten::empty", "graph_capture_allocations"
TRACK_SUFFIX = " / graph replay"
GRAPH_OPS_SCHEMA = pa.schema([("slice_id", pa.int64()), ("op_id", pa.int64())])


@dataclass
class Launch:
    kernel: str
    grid: list | None
    chain: list[int]  # the capture ops it ran in, outermost first (indexes into Capture.ops)


@dataclass
class Capture:
    source: str  # the capture file's name
    ops: list[dict]  # name, category, ts, dur, args (dict), allocations (its and its nested ops' aten::empty)
    launches: list[Launch]
    batch_sizes: set[int]
    names: Counter = field(init=False)

    def __post_init__(self):
        self.names = Counter(launch.kernel for launch in self.launches)

    @cached_property
    def signature(self) -> tuple:
        return tuple((launch.kernel, tuple((self.ops[i]["name"], *(json.dumps(self.ops[i]["args"].get(a))
                                                                     for a in _SIGNATURE_ARGS))
                                           for i in launch.chain))
                     for launch in self.launches)


def captures_of(data, source: str) -> list[Capture]:
    """The capture regions of one capture trace (its TraceData), each with its launches and their ops."""
    wanted = pc.is_in(data.slices["kind"].cast(pa.string()), pa.array([*LAUNCH_KINDS, "cpu_op", "user_annotation"]))
    rows = data.slices.filter(wanted).select(["kind", "category", "name", "ts", "dur", "track", "args"]).to_pylist()
    by_track = defaultdict(list)
    for row in rows:
        by_track[row["track"]].append(row)
    out = []
    for track_rows in by_track.values():
        track_rows.sort(key=lambda r: (r["ts"], -r["dur"]))
        starts = [r["ts"] for r in track_rows]
        annotations = [r for r in track_rows if r["kind"] == "user_annotation"]
        begins = [r for r in track_rows if r["kind"] in LAUNCH_KINDS and BEGIN_CAPTURE in r["name"]]
        ends = [r for r in track_rows if r["kind"] in LAUNCH_KINDS and END_CAPTURE in r["name"]]
        for begin in begins:
            end = next((e for e in ends if e["ts"] >= begin["ts"]), None)
            if end is not None:
                start, stop = begin["ts"], end["ts"] + end["dur"]
                inside = track_rows[bisect_left(starts, start):bisect_right(starts, stop)]
                out.append(_region(inside, annotations, start, stop, source))
    return [c for c in out if c.launches]


def _region(rows: list[dict], annotations: list[dict], start: int, stop: int, source: str) -> Capture:
    """The launches of one capture region (rows: its track's that start in it, by start) and the ops they ran
    in; its batch sizes from the file's name and the annotations around it."""
    ops, launches, stack = [], [], []  # stack: (index into ops, end) of the ops enclosing the current row
    batch_sizes = {int(n) for n in BATCH_SIZE.findall(source)}
    for row in annotations:
        if row["ts"] <= start and row["ts"] + row["dur"] >= stop:
            batch_sizes |= {int(n) for n in BATCH_SIZE.findall(row["name"])}
    for row in rows:
        if row["kind"] == "user_annotation" or row["ts"] + row["dur"] > stop:
            continue
        while stack and stack[-1][1] < row["ts"] + row["dur"]:
            stack.pop()
        if row["kind"] == "cpu_op":
            ops.append({**row, "args": json.loads(row["args"] or "{}"), "allocations": []})
            if row["name"] == ALLOCATION:  # (size and dtype: the first two Concrete Inputs)
                for i, _ in stack:
                    ops[i]["allocations"].append(ops[-1]["args"].get("Concrete Inputs", [])[:2])
            stack.append((len(ops) - 1, row["ts"] + row["dur"]))
            continue
        args = json.loads(row["args"] or "{}")
        if isinstance(args.get("kernel"), str):
            launches.append(Launch(args["kernel"], args.get("grid"), [i for i, _ in stack]))
    return Capture(source, ops, launches, batch_sizes)


def attribute(data, read_captures) -> None:
    """Match each graph replay of `data` (a reader's TraceData) to a capture region (`read_captures(rank)` ->
    [Capture], called only when `data` has a graph launch) and add the copies of its ops (data.slices) and the
    kernel -> op links (data.graph_ops); replays no region matches are counted in data.notes."""
    slices = data.slices
    kind = slices["kind"].cast(pa.string())
    is_launch = pc.and_(pc.is_in(kind, pa.array(LAUNCH_KINDS)),
                        pc.match_substring(slices["name"].cast(pa.string()), GRAPH_LAUNCH))
    graph_launches = slices.filter(pc.and_(is_launch, pc.is_valid(slices["correlation"])))
    if not graph_launches.num_rows:
        return
    launches = {r["correlation"]: r for r in
                graph_launches.select(["correlation", "ts", "pid", "tid", "track"]).to_pylist()}
    replayed = slices.filter(pc.and_(pc.equal(kind, "kernel"),
                                     pc.is_in(slices["correlation"], pa.array(list(launches), pa.int64()))))
    captures = read_captures(data.rank)
    kernels = defaultdict(list)
    for row in replayed.select(["slice_id", "name", "ts", "dur", "correlation", "args"]).to_pylist():
        kernels[row["correlation"]].append(row)
    copies, links, unmatched = [], [], Counter()
    next_id = (pc.max(slices["slice_id"]).as_py() or 0) + 1
    tids = {}  # launching track -> the thread id of its replay track
    lowest_tid = min(pc.min(slices["tid"]).as_py() or 0, 0)
    annotations = []  # the user annotations, read when a batch size is needed
    for correlation, replay in sorted(kernels.items()):
        replay.sort(key=lambda r: (r["ts"], r["slice_id"]))
        launch = launches[correlation]
        capture, why = _match(replay, captures, lambda: _batch_sizes(slices, launch, annotations))
        if capture is None:
            unmatched[why] += len(replay)
            continue
        tid = tids.setdefault(launch["track"], lowest_tid - 1 - len(tids))
        made, linked = _copies(replay, capture, launch, tid, correlation, next_id)
        copies += made
        links += linked
        next_id += len(made)
    if copies:
        from .common import slices_from_columns

        added = slices_from_columns({name: [c.get(name) for c in copies] for name in slices.column_names})
        data.slices = pa.concat_tables([slices, added.cast(slices.schema)])
        data.graph_ops = pa.table({"slice_id": [k for k, _ in links], "op_id": [o for _, o in links]},
                                  GRAPH_OPS_SCHEMA)
    for why, n in unmatched.items():
        data.notes.append(f"{n:,} graph-replayed kernels keep the graph launch as their op: {why}")


def _batch_sizes(slices: pa.Table, launch: dict, annotations: list) -> set[int]:
    """The batch sizes the annotations around a graph launch give ('step[DECODE bs=32]'); `annotations`: the
    trace's user annotations that name a number, filled on the first call."""
    if not annotations:
        named = slices.filter(pc.and_(pc.equal(slices["kind"].cast(pa.string()), "user_annotation"),
                                      pc.match_substring_regex(slices["name"].cast(pa.string()), r"\d")))
        annotations += named.select(["name", "ts", "dur", "track"]).to_pylist() or [None]
    return {int(n) for r in annotations if r and r["track"] == launch["track"]
            and r["ts"] <= launch["ts"] <= r["ts"] + r["dur"] for n in BATCH_SIZE.findall(r["name"])}


def _match(replay: list[dict], captures: list[Capture], batch_sizes) -> tuple[Capture | None, str]:
    """The capture region a replay ran (or None and why not): one with a launch for every replayed kernel, of
    the same name, and the fewest launches the replay lacks; among several, the one whose grids agree, then the
    one whose batch size the annotations around the launch give; several left whose ops agree: the first."""
    if not captures:
        return None, "the capture traces hold no capture region of this rank"
    names = Counter(r["name"] for r in replay)
    fits = [c for c in captures if all(c.names[n] >= k for n, k in names.items())]
    if not fits:
        return None, "no capture region launches all their kernels"
    least = min(c.names.total() for c in fits)
    fits = [c for c in fits if c.names.total() == least]
    if len(fits) > 1:
        fits = [c for c in fits if _grids_agree(replay, c)] or fits
    if len(fits) > 1:
        sizes = batch_sizes()
        fits = [c for c in fits if c.batch_sizes & sizes] or fits
    if len(fits) > 1 and len({c.signature for c in fits}) > 1:
        return None, f"{len(fits)} capture regions launch the same kernels and no batch size tells them apart"
    return fits[0], ""


def _pairs(replay: list[dict], capture: Capture):
    """(replayed kernel, its launch in the capture): the k-th kernel of a name with the k-th launch of it."""
    by_name = defaultdict(list)
    for launch in capture.launches:
        by_name[launch.kernel].append(launch)
    seen = Counter()
    for kernel in replay:
        yield kernel, by_name[kernel["name"]][seen[kernel["name"]]]
        seen[kernel["name"]] += 1


def _grids_agree(replay: list[dict], capture: Capture) -> bool:
    """No replayed kernel that records its grid has another one than its launch in the capture."""
    for kernel, launch in _pairs(replay, capture):
        grid = json.loads(kernel["args"] or "{}").get("grid") if kernel["args"] and '"grid"' in kernel["args"] \
            else None
        if grid is not None and launch.grid is not None and grid != launch.grid:
            return False
    return True


def _copies(replay: list[dict], capture: Capture, launch: dict, tid: int, correlation: int,
            first_id: int) -> tuple[list[dict], list[tuple[int, int]]]:
    """The copies of the capture ops a replay ran (slices rows, ids from first_id, in the capture's order so that
    an op comes before the ops nested in it) and the (kernel, op copy) links."""
    spans: dict[int, list[int]] = {}
    innermost = []
    for kernel, captured in _pairs(replay, capture):
        end = kernel["ts"] + kernel["dur"]
        for i in captured.chain:
            span = spans.setdefault(i, [kernel["ts"], end])
            span[0], span[1] = min(span[0], kernel["ts"]), max(span[1], end)
        innermost.append((kernel["slice_id"], captured.chain[-1] if captured.chain else None))
    ids = {i: first_id + n for n, i in enumerate(sorted(spans))}
    copies = [{"slice_id": ids[i], "kind": "cpu_op", "category": capture.ops[i]["category"],
               "name": capture.ops[i]["name"], "ts": ts, "dur": end - ts, "pid": launch["pid"], "tid": tid,
               "track": launch["track"] + TRACK_SUFFIX, "correlation": correlation,  # (normalize: its step)
               "args": json.dumps({**capture.ops[i]["args"], "graph_capture": capture.source,
                                   "graph_launch": correlation,
                                   **({ALLOCATIONS_ARG: capture.ops[i]["allocations"]}
                                      if capture.ops[i]["allocations"] else {})})}
              for i, (ts, end) in spans.items()]
    return copies, [(k, ids[i]) for k, i in innermost if i is not None]
