"""The longest path through one window's dependency graph: the SQL function `critical_path_walk`.

`critical_path_events` (tracesql/functions/80_critical_path.sql) gathers, per rank and window, the events and
the facts the graph needs (each device event's launch, its stream's queue length when launched and when it
started, the kernel a stream-wait or an event synchronize waits for); this function builds the graph HTA 0.5's
`critical_path_analysis` builds from them and returns the edges of its longest path. A DuckDB function of
plain Python because a longest path is a walk in topological order that SQL can only do with one recursive step
per node.

The graph. Each op (host cpu_op, runtime or driver call) and each device event is two nodes, its start and its
end; an edge's weight is the time between its nodes unless said otherwise.
- Host, per thread, in nesting order: an op's start to the start of its first child op, one child's end to the
  next child's start, the last child's end to the op's end (an op without child ops: start to end); the piece
  belongs to the op it lies in (between two children: to the children's enclosing range, an op or an
  annotation). A blocking call (cudaStreamSynchronize, cudaMemcpy, cudaEventQuery, ...) weighs 0 from its
  last node to its end: the wait is the device's. The end of one top-level op leads to the start of the next
  with weight 0 (dependency).
- Device, per stream in start order: each event's start to end (gpu_compute_bound; communication kernels
  gpu_communication_bound); an event that waits on no earlier work (its stream's queue held only it when
  launched, nothing when it started, and the previous event on the stream and any event it waits for ended
  before its launch) hangs off its launch (launch delay: gpu_kernel_launch_overhead), else off the previous
  event on its stream (the gap: gpu_kernel_kernel_overhead).
- Synchronisation, weight 0: the last event on a stream (stream synchronize) or on every stream (device
  synchronize) or the event a CUDA event recorded (event synchronize) to the end of the host call that waited;
  the event a cudaStreamWaitEvent waited for to the next event launched on the waiting stream.
Weights of -1 (a child ending 1 ns after its parent: rounding) count 0 in the path and -1 in its total, as HTA.
HTA's path is one rank's: its graph holds one rank's window.

The what-if replay takes the windows of one step (or annotation instance) on every rank together, one graph, and
adds the edges across ranks HTA's has not: a collective completes when the last rank has arrived. Each rank's
communication kernels of one matched collective (`collectives`' match key: process group, kind, sequence number)
run from its first kernel's start (its arrival) to its last one's end (the completion); every other rank's arrival
leads to that completion, owned by the completing kernel (edge 'collective'). The replay of a window adds an edge from the window's start to every node nothing leads to and from
every node that leads nowhere to the window's end (or the last node's time, if later), gives each device event
an edge from its launch and from the previous event on its stream, and weighs every edge its time, except where
a node waits for several things: only the one that came last weighs its time (see Plan.weights). Work launched
before the window holds the window's at fixed times: a device event queued behind it waits for its stream to be
free when it was (stream_free), a blocking call that waited for it ends no earlier (_waits). Each rank's own
window ends the paths of its nodes: the longest path to each rank's end is that rank's time (from the earliest
window start; the what_if macro subtracts its own start's offset). Unchanged, it is the window's measured time. Changes: each event's `scale` multiplies the time of every piece
that belongs to it (a synchronisation with scale 0 is removed, a host call with scale 0 waits for nothing),
`gaps_scale` the launch delays and the gaps between kernels; with gaps_scale NULL nothing changes: the unchanged
replay ignores every scale (the what_if macro walks the what-if's events so, as its unchanged replay).

A walk is built once per graph (Plan: the graph's edges in arrays and the order of its walk, which depend on
the events and their times, not on the weights) and walked for each what-if's scales: the findings rules replay
every step, each with its own change, on one graph. The unchanged walks (every rule walks them again) and the
plans of unchanged graphs are kept by a digest of their input; a changed walk is one what-if's, not kept.
"""

from __future__ import annotations

import bisect
import gc
import hashlib
import heapq
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: One event of the window. role: 'range' (a host range that holds ops but is no node: annotations, Python
#: functions), 'op', 'blocking_op' (an op whose end waits for the device), 'blocked_launch' (a launch call that
#: waited for room in a full launch queue: an op for HTA's path, a blocking op for the replay), 'device', 'communication' (a
#: communication kernel), 'stream_sync', 'context_sync', 'event_sync'. launch: the slice_id of the host call
#: that launched a device event, or that waited (syncs). waits_on: the device event a device event (stream
#: wait) or an event synchronize waits for. stream_free: the end of the event before a device event on its
#: stream, in the whole trace (it may have been launched before the window); of a host call, the end of the last
#: device work that ended while it ran. rank: the event's rank (ids, threads, streams are per rank); collective:
#: of a communication kernel, its collective instance across ranks (a digest of its match key), else NULL.
EVENT_FIELDS = (
    ("id", pa.int64()), ("role", pa.string()), ("ts", pa.int64()), ("dur", pa.int64()), ("pid", pa.int64()),
    ("tid", pa.int64()), ("stream", pa.int64()), ("launch", pa.int64()), ("queue_at_launch", pa.int64()),
    ("queue_at_start", pa.int64()), ("waits_on", pa.int64()), ("stream_free", pa.int64()), ("scale", pa.float64()),
    ("rank", pa.int64()), ("collective", pa.int64()),
)
#: path_rank: whose path the segment is on (the replay's: one path per rank); rank: the rank of its event
WINDOW_FIELDS = (("rank", pa.int64()), ("ts", pa.int64()), ("te", pa.int64()))
SEGMENT_FIELDS = (
    ("seq", pa.int32()), ("event_id", pa.int64()), ("ts", pa.int64()), ("dur_ns", pa.int64()),
    ("edge", pa.string()), ("bound_by", pa.string()), ("path_rank", pa.int64()), ("rank", pa.int64()),
)
SQL_TYPES = {pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR"}


def _struct_sql(fields) -> str:
    return "STRUCT(" + ", ".join(f"{n} {SQL_TYPES[t]}" for n, t in fields) + ")[]"


EVENT_SQL, WINDOW_SQL, SEGMENT_SQL = (_struct_sql(f) for f in (EVENT_FIELDS, WINDOW_FIELDS, SEGMENT_FIELDS))
SEGMENT_TYPE = pa.list_(pa.struct([pa.field(n, t) for n, t in SEGMENT_FIELDS]))

OPS = ("op", "blocking_op", "blocked_launch")
#: the replay's host calls that wait for the device: their end is held by it (HTA's path: a blocked launch is host time)
WAITING = ("blocking_op", "blocked_launch")
KERNELS = ("device", "communication")
SYNCS = ("stream_sync", "context_sync", "event_sync")


class Graph:
    """Nodes (an event's start or end) and edges, each piece owned by the event it belongs to."""

    def __init__(self):
        self.ts: list[int] = []  # per node
        self.event: list[int] = []  # per node: index of its event
        self.is_start: list[bool] = []
        self.src: list[int] = []  # per edge
        self.dst: list[int] = []
        self.time: list[int] = []  # the time between its nodes
        self.weighs: list[bool] = []  # HTA's weight is that time (else 0)
        self.kind: list[str] = []  # 'op', 'launch', 'kernel_gap', 'dependency', 'sync', 'window'
        self.owner: list[int] = []  # index of the event the piece belongs to (-1: none)
        self.completions: set[int] = set()  # nodes where a collective completes (they wait for every rank)
        self.rank_ends: set[int] = set()  # the replay's end node of each rank's window

    def node(self, ts: int, event: int, is_start: bool) -> int:
        self.ts.append(ts)
        self.event.append(event)
        self.is_start.append(is_start)
        return len(self.ts) - 1

    def edge(self, src: int, dst: int, kind: str, owner: int = -1, weighs: bool = True) -> None:
        self.src.append(src)
        self.dst.append(dst)
        self.time.append(self.ts[dst] - self.ts[src])
        self.weighs.append(weighs)
        self.kind.append(kind)
        self.owner.append(owner)

    def piece(self, src: int, dst: int, enclosing: int, weighs: bool = True) -> None:
        """A host piece: from a start it belongs to that event, up to an end to that one, between two ops to the
        range that encloses them."""
        owner = (self.event[src] if self.is_start[src] else
                 self.event[dst] if not self.is_start[dst] else enclosing)
        self.edge(src, dst, "op", owner, weighs)


def _host(g: Graph, ev: dict, start: list, end: list, replay: bool) -> None:
    # the replay waits in a launch blocked on a full queue as in a blocking call (HTA's path: host time)
    waits = WAITING if replay else ("blocking_op",)
    threads: dict[tuple, list[int]] = {}
    for i, role in enumerate(ev["role"]):
        if role in OPS or role == "range":
            threads.setdefault((ev["rank"][i], ev["pid"][i], ev["tid"][i]), []).append(i)
    for rows in threads.values():
        # nesting: by start, the longer first; an event that starts as another ends follows it
        rows.sort(key=lambda i: (ev["ts"][i], -ev["dur"][i], ev["id"][i]))
        stack: list[int] = []
        parent = {}
        last = last_top = None
        enclosing = -1  # the enclosing range of the op last entered or left
        depth = 0

        def leave(i):
            nonlocal last, last_top, enclosing, depth
            depth -= 1
            if last is not None:
                g.piece(last, end[i], enclosing, weighs=ev["role"][i] not in waits)
            if depth == 0:
                last, last_top = None, end[i]
            else:
                last, enclosing = end[i], parent[i]

        for i in rows:
            while stack and ev["ts"][stack[-1]] + ev["dur"][stack[-1]] <= ev["ts"][i]:
                done = stack.pop()
                if ev["role"][done] in OPS:
                    leave(done)
            parent[i] = stack[-1] if stack else -1
            stack.append(i)
            if ev["role"][i] not in OPS:
                continue
            if depth == 0 and last_top is not None:  # the host time between two top-level ops: their range's
                g.edge(last_top, start[i], "dependency", parent[i], weighs=False)
            depth += 1
            if last is not None:
                g.piece(last, start[i], enclosing)
            last, enclosing = start[i], parent[i]
        while stack:
            done = stack.pop()
            if ev["role"][done] in OPS:
                leave(done)


def _device(g: Graph, ev: dict, start: list, end: list, index: dict, replay: bool) -> None:
    # device events in start order, syncs at their end (a stream sync spans the copy it waits for)
    rows = [i for i, role in enumerate(ev["role"]) if role in KERNELS or role in SYNCS]
    rows.sort(key=lambda i: (ev["ts"][i] + (ev["dur"][i] if ev["role"][i] in SYNCS else 0), ev["id"][i]))
    last_on: dict[tuple, int] = {}  # (rank, stream) -> end node of its last event
    for i in rows:
        role, rank, stream = ev["role"][i], ev["rank"][i], (ev["rank"][i], ev["stream"][i])
        caller = index.get((rank, ev["launch"][i]))
        if role in SYNCS:
            if caller is None or end[caller] is None:
                continue
            if role == "event_sync":
                waited = index.get((rank, ev["waits_on"][i]))
                sources = [end[waited]] if waited is not None and end[waited] is not None else []
            elif role == "context_sync":
                sources = [node for (r, _), node in last_on.items() if r == rank]
            else:
                sources = [last_on.get(stream)]
            for node in sources:
                if node is not None:
                    g.edge(node, end[caller], "sync", caller, weighs=False)
            continue
        g.edge(start[i], end[i], "op", i)
        waited = index.get((rank, ev["waits_on"][i]))
        waited_end = end[waited] if waited is not None else None
        if waited_end is not None:
            g.edge(waited_end, start[i], "sync", i, weighs=False)
        previous = last_on.get(stream)
        launched = start[caller] if caller is not None else None
        if replay:  # each thing it waited for (which one held it up is the replay's business)
            if launched is not None:
                g.edge(launched, start[i], "launch", i)
            if previous is not None:
                g.edge(previous, start[i], "kernel_gap", g.event[previous])
            free = ev["stream_free"][i]
            if free is not None:  # (work on a stream may overlap the next by a few ns: clock rounding)
                free = min(free, ev["ts"][i])
            if (free is not None and launched is not None and g.ts[launched] < free
                    and (previous is None or g.ts[previous] < free)):
                # queued behind work launched before the window: the stream is free at a fixed time, which no
                # change inside the window moves (else the launch edge would carry the queue's wait along)
                g.edge(g.node(free, i, False), start[i], "kernel_gap", -1)
        elif (ev["queue_at_launch"][i] == 1 and ev["queue_at_start"][i] == 0 and launched is not None
                and (previous is None or g.ts[previous] < g.ts[launched])
                and (waited_end is None or g.ts[waited_end] < g.ts[launched])):
            g.edge(launched, start[i], "launch", i)
        else:
            if previous is not None and (waited_end is None or g.ts[waited_end] < g.ts[previous]):
                g.edge(previous, start[i], "kernel_gap", g.event[previous])
        last_on[stream] = end[i]


def _binding(g: Graph) -> tuple[list[bool], dict[int, int]]:
    """Per edge, whether its node waits for several things (contested); per such node, the edge that held it
    up: the one whose source came last."""
    waits = ("launch", "kernel_gap", "sync", "collective")
    contested = [kind in waits or (kind == "op" and (not g.weighs[e] or g.dst[e] in g.completions))
                 or (kind == "window" and g.dst[e] in g.rank_ends) for e, kind in enumerate(g.kind)]
    binding: dict[int, int] = {}
    for e, dst in enumerate(g.dst):
        if contested[e] and (dst not in binding or g.ts[g.src[e]] > g.ts[g.src[binding[dst]]]):
            binding[dst] = e
    return contested, binding


#: edge kinds as the walk's arrays number them
KINDS = ("op", "launch", "kernel_gap", "dependency", "sync", "window", "collective")
GAPS = (KINDS.index("launch"), KINDS.index("kernel_gap"))
SCALED = (KINDS.index("op"), KINDS.index("collective"))
BOUND_BY = {"launch": "gpu_kernel_launch_overhead", "kernel_gap": "gpu_kernel_kernel_overhead"}
#: the class of the other edges, by their event's role: host (ranges and ops), communication, other device work
EVENT_BOUND = ("cpu_bound", "gpu_communication_bound", "gpu_compute_bound")


def _order(g: Graph) -> tuple[list[int], list[int]]:
    """The order of a walk of the graph: its nodes in topological order (Kahn's; of the nodes ready, the earliest
    first), and its edges in the order the walk relaxes them (each node's outgoing edges, by index, when it is
    taken). It depends on the graph and its times only, not on the weights: every what-if of a window shares it."""
    n = len(g.ts)
    outgoing: list[list[int]] = [[] for _ in range(n)]
    indegree = [0] * n
    for e, (a, b) in enumerate(zip(g.src, g.dst)):
        outgoing[a].append(e)
        indegree[b] += 1
    ready = [(g.ts[v], v) for v in range(n) if indegree[v] == 0]
    heapq.heapify(ready)
    nodes, edges = [], []
    while ready:
        _, v = heapq.heappop(ready)
        nodes.append(v)
        edges.extend(outgoing[v])
        for e in outgoing[v]:
            b = g.dst[e]
            indegree[b] -= 1
            if indegree[b] == 0:
                heapq.heappush(ready, (g.ts[b], b))
    return nodes, edges


class Plan:
    """A window's graph as its walks need it, in arrays: its edges, their order, and what the replay's weights
    start from. Built once per graph (build), walked for each what-if's scales (segments): the replays of one
    window by the findings rules differ in their scales only, unless a change removes synchronisations."""

    def __init__(self, ev: dict, windows: list[dict] | None, changed: bool):
        """changed: whether the replay is walked with the events' scales (a gaps_scale): then a synchronisation
        with scale 0 is removed and a host call with scale 0 waits for nothing; else the scales are ignored."""
        if changed:  # removed synchronisations: scale 0
            keep = [i for i, (role, scale) in enumerate(zip(ev["role"], ev["scale"]))
                    if role not in SYNCS or scale != 0]
            ev = {name: [values[i] for i in keep] for name, values in ev.items()}
            self.keep = np.array(keep, dtype=np.int64)
        else:
            self.keep = None
        g, ends = build(ev, windows, changed)
        self.empty = not g.src
        self.replay = windows is not None
        self.ends = [ev["rank"][0]] if ends is None else list(ends)
        self.end_nodes = None if ends is None else list(ends.values())
        nodes, edges = _order(g)
        self.node_count = len(g.ts)
        self.nodes = np.array(nodes, dtype=np.int32)
        self.order = np.array(edges, dtype=np.int32)
        self.src, self.dst = np.array(g.src, dtype=np.int32), np.array(g.dst, dtype=np.int32)
        self.time = np.array(g.time, dtype=np.int64)
        self.kind = np.array([KINDS.index(kind) for kind in g.kind], dtype=np.int8)
        self.owner = np.array(g.owner, dtype=np.int32)
        self.weighs = np.array(g.weighs, dtype=bool)
        self.src_ts = np.array(g.ts, dtype=np.int64)[self.src] if g.src else np.zeros(0, dtype=np.int64)
        if self.replay:
            # where a node waits for several things, the edges that did not hold it up weigh 0 (see weights)
            contested, binding = _binding(g)
            self.held = np.array([not c or binding[d] == e for e, (c, d) in enumerate(zip(contested, g.dst))],
                                 dtype=bool)
        self.event_id = np.array(ev["id"], dtype=np.int64)
        self.event_rank = np.array(ev["rank"], dtype=np.int64)
        self.event_bound = np.array([0 if role in OPS or role == "range" else 1 if role == "communication" else 2
                                     for role in ev["role"]], dtype=np.int8)

    def weights(self, scales: list, gaps_scale: float | None) -> np.ndarray:
        """HTA's weights (not a replay), or the replay's: every edge weighs its time, changed by the what-if,
        except where a node waits for several things (a device event for its launch, the previous event on its
        stream and an event it waits for; a blocking call's end for the host and the device work it synchronises
        with): there only what came last, what held it up, weighs its time; the others weigh 0 (they still
        order). A negative time (clocks of host and device apart, rounding) counts as the trace has it."""
        time = self.time.astype(np.float64)
        if not self.replay:
            return np.where(self.weighs, np.maximum(time, 0), 0.0)
        if gaps_scale is None:
            return np.where(self.held, time, 0.0)
        if self.keep is not None:
            scales = [scales[i] for i in self.keep]
        scale = np.array([1.0 if s is None else s for s in scales], dtype=np.float64)
        changed = np.where(np.isin(self.kind, GAPS), time * gaps_scale,
                           np.where(np.isin(self.kind, SCALED), time * scale[self.owner], time))
        return np.where(self.held, changed, 0.0)

    def segments(self, scales: list, gaps_scale: float | None) -> list[dict]:
        """The segments of the critical path with these scales (per event) and gaps_scale, in order."""
        if self.empty:
            return []
        weight = self.weights(scales, gaps_scale).tolist()
        src, dst = self.src.tolist(), self.dst.tolist()
        # the longest path: each node's distance and the edge it came by, of equal paths the first found
        dist = [0.0] * self.node_count
        via = [-1] * len(dist)
        for e in self.order.tolist():
            b, d = dst[e], dist[src[e]] + weight[e]
            if via[b] < 0 or d > dist[b]:
                dist[b], via[b] = d, e
        if self.end_nodes is None:  # the longest path of all: of the nodes as long, the first taken
            reached = np.array(dist)[self.nodes]
            ends = [int(self.nodes[int(np.argmax(reached))])] if len(reached) else []
        else:
            ends = self.end_nodes
        kind, owner, time, weighs = self.kind.tolist(), self.owner.tolist(), self.time.tolist(), self.weighs.tolist()
        src_ts = self.src_ts.tolist()
        event_id, event_rank, event_bound = self.event_id.tolist(), self.event_rank.tolist(), self.event_bound.tolist()
        segments = []
        for path_rank, v in zip(self.ends, ends):
            edges = []
            while via[v] >= 0:
                edges.append(via[v])
                v = src[via[v]]
            first_seq = len(segments)
            for e in reversed(edges):
                name, by = KINDS[kind[e]], owner[e]
                if weight[e] == 0 and (self.replay or not weighs[e]):
                    continue
                bound_by = BOUND_BY.get(name) or EVENT_BOUND[event_bound[by] if by >= 0 else 0]
                # HTA counts a -1 (a child ending 1 ns after its parent: rounding) as -1 in the total, 0 in the path
                dur = time[e] if not self.replay and time[e] < 0 else round(weight[e])
                segments.append({"seq": len(segments) - first_seq,
                                 "event_id": event_id[by] if by >= 0 else None,
                                 "ts": src_ts[e], "dur_ns": dur, "edge": name, "bound_by": bound_by,
                                 "path_rank": path_rank, "rank": event_rank[by] if by >= 0 else path_rank})
        return segments


def _wakers(g: Graph, ev: dict, unanchored: list[int], count: int) -> dict[int, int]:
    """For the replay: the host node that each first op of a thread (nothing leads to it) hangs off, the latest
    one of another thread of its rank before it: the work that woke it, as far as the trace tells (the autograd thread
    starts when the main thread calls backward). Unchanged, the edge lasts the time between them, as the
    window's start would; with earlier work made faster, the thread starts earlier."""
    host = sorted((g.ts[v], v) for v in range(count) if g.event[v] >= 0 and ev["role"][g.event[v]] in OPS)
    thread = [None] * len(g.ts)
    for _, v in host:
        thread[v] = (ev["rank"][g.event[v]], ev["pid"][g.event[v]], ev["tid"][g.event[v]])
    times = [ts for ts, _ in host]
    woken = {}
    for v in unanchored:
        if thread[v] is None:
            continue
        for k in range(bisect.bisect_right(times, g.ts[v]) - 1, -1, -1):
            u = host[k][1]
            if thread[u] != thread[v] and thread[u][0] == thread[v][0]:
                woken[v] = u
                break
    return woken


def _waits(g: Graph, ev: dict, end: list, changed: bool) -> None:
    """For the replay: a blocking call (or a launch blocked on a full queue) ends no earlier than the last device
    work that ended while it ran (stream_free): the window's, an edge from its end (so that a blocking call the
    trace recorded without a `cuda_sync` event still waits for the device, and a blocked launch for the queue to
    drain), or work launched before the window, a fixed time no change inside the window moves; unless the
    changed replay removes the call's time (scale 0)."""
    ends = {(ev["rank"][i], g.ts[end[i]]): end[i] for i, role in enumerate(ev["role"])
            if role in KERNELS and end[i] is not None}
    for i, role in enumerate(ev["role"]):
        free = ev["stream_free"][i]
        if role in WAITING and free is not None and not (changed and ev["scale"][i] == 0):
            # -1: a fixed time hangs off the window's start
            waited = ends.get((ev["rank"][i], free))
            waited = g.node(free, -1, False) if waited is None else waited
            g.edge(waited, end[i], "sync", i, weighs=False)


def _collectives(g: Graph, ev: dict, start: list, end: list) -> None:
    """For the replay: each rank's completion of a collective instance waits for every other rank's arrival (its
    first kernel's start); the edge is the completing kernel's (a slower rank's arrival lengthens it)."""
    calls: dict[int, dict[int, tuple[int, int]]] = {}  # instance -> rank -> (arrival node, completion node)
    for i, key in enumerate(ev["collective"]):
        if key is None or ev["role"][i] != "communication":
            continue
        arrival, completion = calls.setdefault(key, {}).get(ev["rank"][i], (start[i], end[i]))
        calls[key][ev["rank"][i]] = (min(arrival, start[i], key=g.ts.__getitem__),
                                     max(completion, end[i], key=g.ts.__getitem__))
    for ranks in calls.values():
        for rank, (_, completion) in ranks.items():
            for other, (arrival, _) in ranks.items():
                # clocks of other hosts may be off: an arrival after the completion tells nothing
                if other != rank and g.ts[arrival] <= g.ts[completion]:
                    g.edge(arrival, completion, "collective", g.event[completion])
                    g.completions.add(completion)


def path(ev: dict, windows: list[dict] | None = None, gaps_scale: float | None = None) -> list[dict]:
    """The segments of the critical path, in order. windows None: HTA's path of one rank's window (edges that
    weigh 0 left out). Windows (each rank's: rank, ts, te): the what-if replay of them together, each rank's path
    from the earliest window start to the later of its window's end and the end of its last work: every edge
    weighs its time, changed by the events' scales and gaps_scale if given."""
    return Plan(ev, windows, gaps_scale is not None).segments(ev["scale"], gaps_scale)


def build(ev: dict, windows: list[dict] | None = None, changed: bool = False) -> tuple[Graph, dict | None]:
    """The dependency graph of the events (see the module's doc), and with windows (the replay's) each rank's
    end node; changed: the replay's host calls with scale 0 wait for nothing (else the scales are ignored)."""
    g = Graph()
    count = len(ev["id"])
    start, end = [None] * count, [None] * count
    nodes = sorted((ev["ts"][i] + (ev["dur"][i] if at_end else 0), at_end, i)
                   for i, role in enumerate(ev["role"]) if role in OPS or role in KERNELS for at_end in (0, 1))
    for t, at_end, i in nodes:
        (end if at_end else start)[i] = g.node(t, i, not at_end)
    index = {event: i for i, event in enumerate(zip(ev["rank"], ev["id"]))}
    _host(g, ev, start, end, replay=windows is not None)
    _device(g, ev, start, end, index, replay=windows is not None)
    ends = None
    if windows is not None:
        _waits(g, ev, end, changed)
        _collectives(g, ev, start, end)
        # the windows' edges: the earliest start to each first node; each last node to its rank's range end (the
        # window's end: its time after them is the range's own, fixed), or, after that, to the rank's end, where
        # only the latest weighs (device work that ends after the range ends when it does, not at a fixed time
        # after the host's last op)
        count, has_in, has_out = len(g.ts), set(g.dst), set(g.src)
        first = g.node(min(w["ts"] for w in windows), -1, True)
        range_end = {w["rank"]: w["te"] for w in windows}
        last_ts = dict(range_end)
        for v in range(count):
            if g.event[v] >= 0:
                rank = ev["rank"][g.event[v]]
                last_ts[rank] = max(last_ts[rank], g.ts[v])
        ends = {rank: g.node(ts, -1, False) for rank, ts in last_ts.items()}
        g.rank_ends.update(ends.values())
        range_nodes = {rank: g.node(te, -1, False) for rank, te in range_end.items()}
        for rank, node in range_nodes.items():
            g.edge(node, ends[rank], "window")
        woken = _wakers(g, ev, [v for v in range(count) if v not in has_in], count)
        for v in range(count):
            if v not in has_in:
                g.edge(woken.get(v, first), v, "window")
            if v not in has_out:
                rank = ev["rank"][g.event[v]]
                g.edge(v, range_nodes[rank] if g.ts[v] <= range_end[rank] else ends[rank], "window")
    return g, ends


def walk(events: pa.Array, windows: pa.Array, gaps_scale: pa.Array) -> pa.Array:
    """The DuckDB function (Arrow), per row: a window's events -> its path's segments; HTA's path when windows
    is NULL, else the replay of those windows (each rank's), with the what-if's changes unless gaps_scale is
    NULL."""
    out = []
    for rows, spans, gaps in zip(_rows(events), windows.to_pylist(), gaps_scale.to_pylist()):
        if rows is None:
            out.append(pa.nulls(1, SEGMENT_TYPE))
            continue
        if spans is not None:  # ties between equal paths follow the windows' order too: by rank, as the events
            spans = sorted(spans, key=lambda w: w["rank"])
        scales = rows.field("scale")
        if gaps == 1 and (scales.fill_null(1.0).to_numpy() == 1).all():
            gaps = None  # no change: the unchanged replay (one walk for both)
        graph = _digest(spans, rows)
        if gaps is not None:  # one what-if's own walk (each findings rule's): walked, not kept
            out.append(pa.array([_without_gc(_walk_row, rows, spans, gaps, graph)], type=SEGMENT_TYPE))
            continue
        # the unchanged replay and HTA's path ignore the scales: every what-if's (each rule's) are one walk
        key = graph.digest()
        walked = _WALKED.pop(key, None)
        if walked is None:
            walked = pa.array([_without_gc(_walk_row, rows, spans, gaps, graph)], type=SEGMENT_TYPE)
            if len(_WALKED) >= WALKED_SIZE:
                del _WALKED[next(iter(_WALKED))]
        _WALKED[key] = walked  # the latest used last
        out.append(walked)
    return pa.concat_arrays(out) if out else pa.array([], type=SEGMENT_TYPE)


def _rows(events: pa.Array | pa.ChunkedArray):
    """Each row's events (None where NULL), chunk by chunk, each a slice of its chunk's events (offsets index
    them): one column at a time, far quicker than dicts, and a run's every window is never in Python objects at
    once. (Combining the chunks first copied every event of the call: 14 % of findings' time at 24×.)"""
    for chunk in events.chunks if isinstance(events, pa.ChunkedArray) else [events]:
        flat, offsets, valid = chunk.values, chunk.offsets.to_pylist(), chunk.is_valid().to_pylist()
        for row, is_valid in enumerate(valid):
            yield _in_order(flat.slice(offsets[row], offsets[row + 1] - offsets[row])) if is_valid else None


def _in_order(rows: pa.StructArray) -> pa.StructArray:
    """The events by rank, then id: the order the walk breaks ties between equal paths by, whatever order the
    list came in (SQL's list aggregates keep none unless told, at a cost; a replay's lists of several ranks come
    in any order of the ranks)."""
    rank, event_id = rows.field("rank").to_numpy(zero_copy_only=False), rows.field("id").to_numpy()
    order = np.lexsort((event_id, rank))
    if (order[1:] > order[:-1]).all():
        return rows
    # the walk's fields only (taking the others, names among them, cost more than the sort)
    order = pa.array(order)
    return pa.StructArray.from_arrays([rows.field(name).take(order) for name, _ in EVENT_FIELDS],
                                      fields=[rows.type.field(name) for name, _ in EVENT_FIELDS])


def _walk_row(rows: pa.StructArray, spans: list | None, gaps: float | None, graph) -> list[dict]:
    """One window's path: of the graph its walks share when a replay of it was planned (the replays of one step
    by the findings rules: their changes scale its edges), else of a new plan."""
    if spans is None:  # HTA's path: walked once per window
        ev = {name: rows.field(name).to_pylist() for name, _ in EVENT_FIELDS}
        return path(ev, spans, gaps)
    scales = rows.field("scale")
    if gaps is not None:  # what changes the graph itself: synchronisations removed, host calls that wait no more
        zero = pc.fill_null(pc.equal(scales, 0.0), False)
        removed = pc.and_(zero, pc.is_in(rows.field("role"), value_set=pa.array(WAITING + SYNCS)))
        if pc.any(removed).as_py():  # a graph of this what-if's own, walked once
            ev = {name: rows.field(name).to_pylist() for name, _ in EVENT_FIELDS}
            return Plan(ev, spans, True).segments(ev["scale"], gaps)
    key = graph.digest()
    plan = _PLANS.pop(key, None)
    if plan is None:
        plan = Plan({name: rows.field(name).to_pylist() for name, _ in EVENT_FIELDS}, spans, gaps is not None)
        if len(_PLANS) >= PLANS_SIZE:
            del _PLANS[next(iter(_PLANS))]
    _PLANS[key] = plan  # the latest used last
    return plan.segments(scales.to_pylist(), gaps)


def _column_bytes(column: pa.Array) -> bytes:
    """A column's values as bytes, with its null mask: nulls are filled first (the bytes under a null slot differ
    between calls)."""
    if pa.types.is_string(column.type):
        column = column.dictionary_encode()
        prefix = pickle.dumps(column.dictionary.to_pylist())
        column = column.indices
    else:
        prefix = b""
    if column.null_count:
        mask = np.packbits(column.is_null().to_numpy(zero_copy_only=False)).tobytes()
        return prefix + b"\1" + mask + column.fill_null(0).to_numpy().tobytes()
    return prefix + b"\0" + column.to_numpy().tobytes()


def _digest(spans: list | None, rows: pa.StructArray):
    """A digest (hashlib's, to be continued) of a window's windows and events but their scales, read column by
    column from Arrow (reading them into Python lists first took 3 times the walk's own time at 24×, 50 ms a
    window)."""
    digest = hashlib.blake2b(pickle.dumps((spans, len(rows))), digest_size=16)
    for name, _ in EVENT_FIELDS:
        if name != "scale":
            digest.update(_column_bytes(rows.field(name)))
    return digest


def _without_gc(function, *args):
    """function(*args) with Python's cyclic garbage collector paused: a walk allocates a few lists per node and
    edge and frees none of them until it returns, and the collector's passes over them took 30 % of its time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return function(*args)
    finally:
        if enabled:
            gc.enable()


#: The latest unchanged walks used (the unchanged replay, HTA's path), by a digest of their input, each as its
#: Arrow row (a tenth of the memory of the segments as Python objects): a what-if whose change changes nothing
#: walks its steps' unchanged replay, and the findings rules host_op and idle_bubbles walk HTA's path of the steps
#: `findings` walked for all rules first (tracesql/findings.py). A changed walk is one what-if's and is not kept
#: (each rule's own N walked once: 1.2 MB each at 24x).
_WALKED: dict[bytes, pa.Array] = {}
WALKED_SIZE = 1024
#: The latest replays' plans (graph and walk order), by a digest of their graph's input: each findings rule
#: replays every step with its change, which scales the edges of the graph the unchanged replay built (~2 MB a
#: step of 25 k events; 256: twice the 24× tile's 120 steps). A change that removes synchronisations or waits
#: walks a graph of its own, once, not kept.
_PLANS: dict[bytes, Plan] = {}
PLANS_SIZE = 256


def register(con) -> None:
    """Create `critical_path_walk(events, windows, gaps_scale)` on `con`."""
    con.create_function("critical_path_walk", walk, [EVENT_SQL, WINDOW_SQL, "DOUBLE"], SEGMENT_SQL,
                        type="arrow", side_effects=False, null_handling="special")
