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
plans of unchanged graphs are kept by a digest of their input; a changed walk is one what-if's, not kept. A
findings change that makes no edge longer and leaves every rank's unchanged path as it was is not walked: each
rank's length is the unchanged one (Plan.lengths).
The graph is built in numpy arrays, not node by node: a step has ~23 k events and ~50 k edges, and the
per-node Python of the first version took ~0.18 CPU-s a step. The longest path too, where the weights are whole
numbers (HTA's path, the unchanged replay, a what-if that scales by 0 or 1: Plan.distances): ~80 % of a replay's
nodes have one edge leading to them and lie at a fixed offset from the last node up their line that has several
(pointer jumping), and only the edges into those (~9 k of ~50 k) are relaxed one by one; whole numbers sum exactly
in any order, so the result is the one-by-one walk's, bit for bit. What stays a loop of Python: the longest path
of fractional weights (one relaxation per edge, in the walk's order: float sums in another order round
otherwise), the edges into nodes several edges lead to, the few stretches of Kahn's order where an edge leads to
an earlier node (_taken), a thread whose events do not nest (longest_path.nest), and the syncs. `tracesql findings`,
which walks every step a dozen times, loads the relaxation compiled (tracesql/longest_path.py) and walks every
longest path one edge at a time with it: the same results, 50 times faster.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import gc
import heapq
import pickle
import sys
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from . import longest_path

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
#: a segment's edge and bound_by as the walk returns them: codes of their names (KINDS, SEGMENT_BOUND), which
#: DuckDB reads as VARCHAR (the strings built per segment took 0.6 CPU-s of findings' walks at 24x)
NAMED = pa.dictionary(pa.int8(), pa.string())
SEGMENT_FIELDS = (
    ("seq", pa.int32()), ("event_id", pa.int64()), ("ts", pa.int64()), ("dur_ns", pa.int64()),
    ("edge", NAMED), ("bound_by", NAMED), ("path_rank", pa.int64()), ("rank", pa.int64()),
)
SQL_TYPES = {pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.float64(): "DOUBLE", pa.string(): "VARCHAR",
             pa.bool_(): "BOOLEAN", NAMED: "VARCHAR"}


def _struct_sql(fields) -> str:
    return "STRUCT(" + ", ".join(f"{n} {SQL_TYPES[t]}" for n, t in fields) + ")[]"


EVENT_SQL, WINDOW_SQL, SEGMENT_SQL = (_struct_sql(f) for f in (EVENT_FIELDS, WINDOW_FIELDS, SEGMENT_FIELDS))
SEGMENT_TYPE = pa.list_(pa.struct([pa.field(n, t) for n, t in SEGMENT_FIELDS]))

OPS = ("op", "blocking_op", "blocked_launch")
#: the replay's host calls that wait for the device: their end is held by it (HTA's path: a blocked launch is host time)
WAITING = ("blocking_op", "blocked_launch")
KERNELS = ("device", "communication")
SYNCS = ("stream_sync", "context_sync", "event_sync")


#: the events' roles as the graph's arrays number them (-1: none of them)
ROLES = ("range",) + OPS + KERNELS + SYNCS
RANGE, OP, BLOCKING_OP, BLOCKED_LAUNCH, DEVICE, COMMUNICATION, STREAM_SYNC, CONTEXT_SYNC, EVENT_SYNC = range(len(ROLES))
ROLE_CODES = {role: code for code, role in enumerate(ROLES)}
#: a missing integer (launch, waits_on, stream_free, ...) in the graph's arrays
NULL = np.iinfo(np.int64).min
WAITING_CODES, SYNC_CODES = [ROLE_CODES[role] for role in WAITING], [ROLE_CODES[role] for role in SYNCS]

#: edge kinds as the graph's arrays number them
KINDS = ("op", "launch", "kernel_gap", "dependency", "sync", "window", "collective")
OP_EDGE, LAUNCH, KERNEL_GAP, DEPENDENCY, SYNC, WINDOW, COLLECTIVE = range(len(KINDS))
BOUND_BY = {"launch": "gpu_kernel_launch_overhead", "kernel_gap": "gpu_kernel_kernel_overhead"}
#: the class of the other edges, by their event's role: host (ranges and ops), communication, other device work
EVENT_BOUND = ("cpu_bound", "gpu_communication_bound", "gpu_compute_bound")


def _arrays(ev) -> dict[str, np.ndarray]:
    """The events' columns (EVENT_FIELDS; a dict of lists or an Arrow StructArray) as numpy arrays, which the graph
    is built from: roles as codes (ROLES), a missing integer as NULL, a missing scale as NaN."""
    if isinstance(ev, dict) and isinstance(ev.get("role"), np.ndarray):
        return ev
    arrays = {}
    for name, type_ in EVENT_FIELDS:
        column = ev.field(name) if isinstance(ev, pa.StructArray) else ev[name]
        if name == "role":
            if isinstance(column, pa.Array):
                arrays[name] = _role_codes(column)
            else:
                arrays[name] = np.array([ROLE_CODES.get(r, -1) for r in column], dtype=np.int8)
        elif type_ == pa.float64():
            arrays[name] = (column.to_numpy(zero_copy_only=False).astype(np.float64) if isinstance(column, pa.Array)
                            else np.array(column, dtype=np.float64))
        elif isinstance(column, pa.Array):
            arrays[name] = _int64s(column)
        else:
            arrays[name] = np.array([NULL if v is None else v for v in column], dtype=np.int64)
    return arrays


def _int64s(column: pa.Array) -> np.ndarray:
    """An int64 column as numpy, a missing value as NULL: read from its buffers (pyarrow's fill_null took ~1 ms a
    column of a 24x window, 14 ms of its 13 columns)."""
    if column.null_count == 0:
        return column.to_numpy()
    validity, data = column.buffers()[:2]
    start, count = column.offset, len(column)
    bits = np.frombuffer(validity, dtype=np.uint8)[start // 8:(start + count + 7) // 8]
    valid = np.unpackbits(bits, bitorder="little")[start % 8:start % 8 + count].view(bool)
    return np.where(valid, np.frombuffer(data, dtype=np.int64)[start:start + count], NULL)


def _of(codes: np.ndarray, some, count: int) -> np.ndarray:
    """Per code (0 to count - 1, or -1: none), whether it is one of `some` (np.isin's sort took ~0.2 ms an array of
    a 24x window)."""
    table = np.zeros(count + 1, dtype=bool)  # (-1 reads the last: none)
    table[list(some)] = True
    return table[codes]


def _role_codes(roles: pa.Array) -> np.ndarray:
    """The roles (strings) as codes (ROLES; -1: none of them)."""
    roles = roles.dictionary_encode()
    codes = np.array([ROLE_CODES.get(r, -1) for r in roles.dictionary.to_pylist()] + [-1], np.int8)
    return codes[roles.indices.fill_null(len(codes) - 1).to_numpy()]


class Graph:
    """Nodes (an event's start or end) and edges, each piece owned by the event it belongs to. Nodes are arrays
    (ts, event, is_start), added many at once (nodes); edges come one at a time (edge, into `pending`'s lists) or
    many at once (edges: arrays), and are read as arrays (src, dst, kind, owner, weighs)."""

    def __init__(self, ts: np.ndarray, event: np.ndarray, is_start: np.ndarray):
        self.ts, self.event, self.is_start = ts, event, is_start  # per node; event: index of its event (-1: none)
        #: the edges added one at a time since the last arrays: src, dst, kind (KINDS), owner (index of the event
        #: the piece belongs to, -1: none), weighs (HTA's weight is the time between its nodes, else 0)
        self.pending: tuple[list, list, list, list, list] = ([], [], [], [], [])
        self._chunks: list[tuple] = []  # the edges before, as arrays
        self.completions: set[int] = set()  # nodes where a collective completes (they wait for every rank)
        self.rank_ends: set[int] = set()  # the replay's end node of each rank's window

    def nodes(self, ts, event, is_start: bool) -> np.ndarray:
        """New nodes (ts: an array; event: an array or one for all): their numbers."""
        first = len(self.ts)
        ts = np.asarray(ts, dtype=np.int64)
        self.ts = np.concatenate([self.ts, ts])
        self.event = np.concatenate([self.event, np.broadcast_to(np.asarray(event, dtype=np.int64), ts.shape)])
        self.is_start = np.concatenate([self.is_start, np.full(len(ts), is_start)])
        return np.arange(first, len(self.ts))

    def node(self, ts: int, event: int, is_start: bool) -> int:
        return int(self.nodes([ts], event, is_start)[0])

    def edge(self, src: int, dst: int, kind: int, owner: int = -1, weighs: bool = True) -> None:
        for column, value in zip(self.pending, (src, dst, kind, owner, weighs)):
            column.append(value)

    def edges(self, src, dst, kind, owner, weighs) -> None:
        """Many edges at once, after those before (arrays, or scalars for all)."""
        self._columns()
        src = np.asarray(src, dtype=np.int64)
        self._chunks.append(tuple(np.broadcast_to(np.asarray(values, dtype=t), src.shape) for values, t in
                                  zip((src, dst, kind, owner, weighs), EDGE_TYPES)))

    def _columns(self) -> tuple:
        if self.pending[0]:
            self._chunks.append(tuple(np.array(values, dtype=t) for values, t in zip(self.pending, EDGE_TYPES)))
            self.pending = ([], [], [], [], [])
        if len(self._chunks) != 1:
            self._chunks = [tuple(np.concatenate([chunk[k] for chunk in self._chunks]) if self._chunks
                                  else np.zeros(0, dtype=t) for k, t in enumerate(EDGE_TYPES))]
        return self._chunks[0]

    src = property(lambda self: self._columns()[0])
    dst = property(lambda self: self._columns()[1])
    kind = property(lambda self: self._columns()[2])
    owner = property(lambda self: self._columns()[3])
    weighs = property(lambda self: self._columns()[4])


EDGE_TYPES = (np.int64, np.int64, np.int8, np.int64, bool)


def _threads(ev: dict) -> np.ndarray:
    """Per host event (op or range), its thread (rank, pid, tid), numbered in the order the host events first show
    them; -1 for other events."""
    role = ev["role"]
    host = np.flatnonzero((role >= RANGE) & (role <= BLOCKED_LAUNCH))
    thread = np.full(len(role), -1, dtype=np.int64)
    if not len(host):
        return thread
    rank, pid, tid = ev["rank"][host], ev["pid"][host], ev["tid"][host]
    order = np.lexsort((tid, pid, rank))  # (of one thread, the first shown first)
    new = np.ones(len(host), dtype=bool)
    new[1:] = (np.diff(rank[order]) != 0) | (np.diff(pid[order]) != 0) | (np.diff(tid[order]) != 0)
    group = np.cumsum(new) - 1
    number = np.empty(int(group[-1]) + 1, dtype=np.int64)
    number[np.argsort(order[new])] = np.arange(len(number))
    thread[host[order]] = number[group]
    return thread


class _Shape:
    """What every graph of one list of events shares (walk_ahead builds HTA's and the unchanged replay's of each
    one-rank step: 0.5 of the 2 CPU-s of its builds at 24x): the ops' and device events' nodes in time order (an
    end after a start at the same time, then by event: Graph's arguments), each event's start and end node (-1:
    none), each host event's thread (_threads), the host's edges (_nesting) but their weights, and what _device
    finds of the events alone (_device_layout's, once a graph of them is built)."""

    def __init__(self, ev: dict):
        role, count = ev["role"], len(ev["role"])
        rows = np.flatnonzero((role >= OP) & (role <= COMMUNICATION))
        times = np.concatenate([ev["ts"][rows], ev["ts"][rows] + ev["dur"][rows]])
        at_end = np.repeat(np.array([False, True]), len(rows))
        events = np.concatenate([rows, rows])
        order = np.lexsort((events, at_end, times))
        events, at_end = events[order], at_end[order]
        self.nodes = (times[order], events, ~at_end)
        self.start, self.end = np.full(count, -1, dtype=np.int64), np.full(count, -1, dtype=np.int64)
        self.start[events[~at_end]] = np.flatnonzero(~at_end)
        self.end[events[at_end]] = np.flatnonzero(at_end)
        self.thread = _threads(ev)
        self.host = _nesting(ev, self.start, self.end, self.thread)
        self.device = None  # (_device_layout's, once a graph of them is built)

    def of_rows(self, rows: np.ndarray) -> _Shape:
        """The shape of the events' rows `rows` (in order), where those left out are neither nodes nor host events
        (synchronisations a change removes: Plan): this one, its events renumbered (what building it took 1.3 of
        the 4.2 s of findings' first changes at 24x)."""
        number = np.full(len(self.start), -1, dtype=np.int64)
        number[rows] = np.arange(len(rows))
        shape = object.__new__(_Shape)
        times, events, starts = self.nodes
        shape.nodes = (times, number[events], starts)
        shape.start, shape.end, shape.thread = self.start[rows], self.end[rows], self.thread[rows]
        shape.host, shape.device = None, None
        if self.host is not None:
            (src, dst, kind, owner, enters, dependency, reached, edge_thread), stacked = self.host
            shape.host = ((src, dst, kind, np.where(owner >= 0, number[owner], -1), enters, dependency,
                           number[reached], edge_thread), stacked)
        return shape


def _shape(ev: dict) -> _Shape:
    """The _Shape of the events (_arrays'), kept for the latest events the thread walked (by identity: a build of
    the same events again, HTA's path after the replay or the other way, finds it)."""
    kept = getattr(_latest_shape, "kept", None)
    if kept is not None and kept[0] is ev:
        return kept[1]
    shape = _Shape(ev)
    _latest_shape.kept = (ev, shape)
    return shape


#: Per thread, the latest events walked and their _Shape (kept)
_latest_shape = threading.local()


def _host(g: Graph, ev: dict, shape: _Shape, replay: bool) -> None:
    """The host's edges (_nesting's), each weighing its time but a waiting call's last piece (its wait is the
    device's; the replay's waiting calls are its blocked launches too) and a dependency."""
    waits = _of(ev["role"], [BLOCKING_OP, BLOCKED_LAUNCH] if replay else [BLOCKING_OP], len(ROLES))
    if shape.host is not None:
        (src, dst, kind, owner, enters, dependency, reached, _), _ = shape.host
        g.edges(src, dst, kind, owner, np.where(enters, ~dependency, ~waits[reached]))


def _nesting(ev: dict, start: np.ndarray, end: np.ndarray, thread: np.ndarray) -> tuple | None:
    """The host's edges, thread by thread (in the order they show): the columns of those of the threads whose
    events nest (src, dst, kind, owner; to weigh them: whether the edge enters an op, whether it is a dependency,
    the event whose node it reaches; and its thread), and the threads whose events do not nest; None without host
    events. The
    events of a thread, ops and ranges, in nesting order (by start, the longer first; an event that starts as
    another ends follows it) are entered and left as a stack does: before an event is entered, those on top of
    the stack that ended by its start are left.
    Where each event ends within the one it was entered in, that is a sort of the entries and exits (an event is
    left before the first event that starts at or after its end is entered, the inner first), done in arrays; a
    thread where one does not (a child that ends after its parent: rounding) is walked as a stack
    (longest_path.nest, which says what the edges are: between two ops entered or left one after the other), and
    every thread is, once `tracesql findings` has compiled it."""
    role = ev["role"]
    host = np.flatnonzero(thread >= 0)
    host = host[np.lexsort((ev["id"][host], -ev["dur"][host], ev["ts"][host], thread[host]))]
    n = len(host)
    if not n:
        return None
    nest = longest_path.compiled_nest()
    if nest is not None:  # (compiled, once `tracesql findings` has loaded it: every thread walked as a stack)
        return _stack_edges(nest, host, ev, start, end, thread), []
    host_thread, ts = thread[host], ev["ts"][host]
    ends = ts + ev["dur"][host]
    first = np.flatnonzero(np.concatenate([[True], host_thread[1:] != host_thread[:-1]]))
    last = np.append(first[1:], n)
    # where each event is left: before the first of its thread that starts at or after its end (the thread's end)
    left_at = np.empty(n, dtype=np.int64)
    for a, b in zip(first.tolist(), last.tolist()):
        left_at[a:b] = a + np.searchsorted(ts[a:b], ends[a:b], "left")
    index = np.arange(n)
    left_at = np.maximum(left_at, index + 1)
    # the entries and exits in order: by the event entered next, exits first, the inner (later entered) first
    # (one key of the three: each below n + 1; all differ)
    visits = np.argsort((np.concatenate([index, left_at]) * 2 + np.repeat([1, 0], n)) * (n + 1)
                        + np.concatenate([np.full(n, n), n - index]))
    entered = visits < n
    visited = np.where(entered, visits, visits - n)
    depth = np.cumsum(np.where(entered, 1, -1))  # after each visit
    at = np.empty(2 * n, dtype=np.int64)
    at[visits] = np.arange(2 * n)
    enter_at, leave_at = at[:n], at[n:]
    level = depth[enter_at]
    # as a stack: each event left at the depth it was entered at, never below it in between
    deepest = np.minimum.reduceat(depth, np.stack([enter_at, leave_at], axis=1).reshape(-1))[::2]
    stacked = np.zeros(len(first), dtype=bool)
    stacked[np.searchsorted(first, index[(depth[leave_at] + 1 != level) | (deepest < level)], "right") - 1] = True
    # each event's parent: the last event entered before it one level up
    key = level * (2 * n + 1) + enter_at  # (enter_at below 2 * n: all differ)
    by_level = np.argsort(key)
    key = key[by_level]
    above = by_level[np.maximum(np.searchsorted(key, (level - 1) * (2 * n + 1) + enter_at) - 1, 0)]
    parent = np.where(level > 1, host[above], -1)
    # the ops' entries and exits; between one and the next of its thread, an edge
    ops = (role[host[visited]] >= OP)
    entered, visited = entered[ops], visited[ops]
    event, visit_thread, visit_parent = host[visited], host_thread[visited], parent[visited]
    open_ops = np.cumsum(np.where(entered, 1, -1))
    node = np.where(entered, start[event], end[event])
    a, b = slice(0, -1), slice(1, None)
    # the end of a top-level op to the start of the next: a dependency, their range's
    dependency = entered[b] & ~entered[a] & (open_ops[a] == 0)
    # a piece: of the op whose start it leaves, else of the op whose end it reaches, else of the ops' range
    owner = np.where(dependency, visit_parent[b], np.where(entered[a], event[a],
                                                           np.where(entered[b], visit_parent[a], event[b])))
    edges = np.flatnonzero(visit_thread[a] == visit_thread[b])
    edges = edges[~stacked[visit_thread[edges]]]
    columns = (node[a][edges], node[b][edges], np.where(dependency, DEPENDENCY, OP_EDGE)[edges], owner[edges],
               entered[b][edges], dependency[edges], event[b][edges], visit_thread[edges])
    if not stacked.any():
        return columns, []
    # the threads whose events do not nest, walked as a stack (longest_path.nest, here in Python: a few threads),
    # their edges among the others' thread by thread
    walked = _stack_edges(longest_path.nest, np.concatenate(
        [host[a:b] for is_stacked, a, b in zip(stacked.tolist(), first.tolist(), last.tolist()) if is_stacked]),
        ev, start, end, thread)
    columns = tuple(np.concatenate(pair) for pair in zip(columns, walked))
    order = np.argsort(columns[-1], kind="stable")
    return tuple(column[order] for column in columns), np.flatnonzero(stacked).tolist()


def _stack_edges(nest, host: np.ndarray, ev: dict, start: np.ndarray, end: np.ndarray, thread: np.ndarray) -> tuple:
    """_nesting's columns of the threads of the host rows `host` (in nesting order, thread by thread), each
    walked as a stack by `nest` (longest_path.nest, compiled or not)."""
    role = ev["role"]
    edges = tuple(np.empty(2 * len(host), dtype=t) for t in (np.int64,) * 4 + (np.bool_,) * 2 + (np.int64,) * 2)
    count = nest(host, thread, ev["ts"], ev["ts"] + ev["dur"], (role >= OP) & (role <= BLOCKED_LAUNCH), start, end,
                 OP_EDGE, DEPENDENCY, np.empty(len(role), dtype=np.int64), np.empty(len(host), dtype=np.int64), edges)
    return tuple(column[:count] for column in edges)


def _index(ev: dict, *ids: np.ndarray) -> list[np.ndarray]:
    """For each of `ids`, per event, the index of the event of its rank with that id (of several, the last),
    else -1."""
    rank, event_id = ev["rank"], ev["id"]
    found = [np.full(len(rank), -1, dtype=np.int64) for _ in ids]
    order = np.lexsort((np.arange(len(rank)), event_id, rank))
    sorted_rank, sorted_id = rank[order], event_id[order]
    for r in np.unique(rank):
        lo, hi = np.searchsorted(sorted_rank, r, "left"), np.searchsorted(sorted_rank, r, "right")
        for wanted, out in zip(ids, found):
            asked = np.flatnonzero((rank == r) & (wanted != NULL))
            at = np.searchsorted(sorted_id[lo:hi], wanted[asked], "right") - 1
            hit = (at >= 0) & (sorted_id[lo:hi][np.maximum(at, 0)] == wanted[asked])
            out[asked[hit]] = order[lo:hi][at[hit]]
    return found


def _device(g: Graph, ev: dict, shape: _Shape, replay: bool) -> None:
    """The device's edges, event by event in start order (syncs at their end: a stream sync spans the copy it
    waits for), each event's in the order the module's doc gives them, in arrays: a kernel's previous event is the
    last one before it on its stream; a sync's, the last one on its stream (on each stream of its rank, in the
    order they first ran work) before it."""
    kernels, i, previous, previous_event, waited_end, launched, sync_edges = _device_layout(ev, shape)
    node_ts, start, end = g.ts, shape.start, shape.end

    def ts_of(nodes):  # their times (-1: no node, its time not read)
        return node_ts[np.maximum(nodes, 0)]

    # (position, order within the event, src, dst, kind, owner, weighs) of each edge
    edges = [(kernels, 0, start[i], end[i], OP_EDGE, i, True),
             (kernels, 1, waited_end, start[i], SYNC, i, False, waited_end >= 0)]
    if replay:  # each thing it waited for (which one held it up is the replay's business)
        free = ev["stream_free"][i]
        free = np.where(free != NULL, np.minimum(free, ev["ts"][i]), NULL)
        # queued behind work launched before the window: the stream is free at a fixed time, which no change
        # inside the window moves (else the launch edge would carry the queue's wait along)
        queued = ((free != NULL) & (launched >= 0) & (ts_of(launched) < free)
                  & ((previous < 0) | (ts_of(previous) < free)))
        free_nodes = np.full(len(kernels), -1, dtype=np.int64)
        free_nodes[queued] = g.nodes(free[queued], i[queued], False)
        edges += [(kernels, 2, launched, start[i], LAUNCH, i, True, launched >= 0),
                  (kernels, 3, previous, start[i], KERNEL_GAP, previous_event, True, previous >= 0),
                  (kernels, 4, free_nodes, start[i], KERNEL_GAP, -1, True, queued)]
    else:
        launch = ((ev["queue_at_launch"][i] == 1) & (ev["queue_at_start"][i] == 0) & (launched >= 0)
                  & ((previous < 0) | (ts_of(previous) < ts_of(launched)))
                  & ((waited_end < 0) | (ts_of(waited_end) < ts_of(launched))))
        edges += [(kernels, 2, launched, start[i], LAUNCH, i, True, launch),
                  (kernels, 3, previous, start[i], KERNEL_GAP, previous_event, True,
                   ~launch & (previous >= 0) & ((waited_end < 0) | (ts_of(waited_end) < ts_of(previous))))]
    edges += sync_edges
    columns = [[], [], [], [], [], [], []]
    for position, sub, src, dst, kind, owner, weighs, *kept in edges:
        kept = kept[0] if kept else np.ones(len(position), dtype=bool)
        for column, values in zip(columns, (position, sub, src, dst, kind, owner, weighs)):
            column.append(np.broadcast_to(values, position.shape)[kept])
    position, sub, src, dst, kind, owner, weighs = (np.concatenate(c) for c in columns)
    order = np.lexsort((sub, position))
    g.edges(src[order], dst[order], kind[order], owner[order], weighs[order])


def _device_layout(ev: dict, shape: _Shape) -> tuple:
    """What _device finds of the events alone, the same in every graph of them (kept on their _Shape: HTA's path
    and the unchanged replay of a one-rank step build both, 0.9 ms a build at 24x): the kernels (their places
    among the device rows in start order), their events, the nodes of the end of each one's previous kernel on its
    stream, of that kernel's event, of the end of the event it waits for and of its launch's start (-1: none), and
    the syncs' edges."""
    if shape.device is not None:
        return shape.device
    role, start, end = ev["role"], shape.start, shape.end
    rows = np.flatnonzero((role >= DEVICE) & (role <= EVENT_SYNC))
    at = ev["ts"][rows] + np.where(role[rows] >= STREAM_SYNC, ev["dur"][rows], 0)
    rows = rows[np.lexsort((ev["id"][rows], at))]
    caller, waited = (found[rows] for found in _index(ev, ev["launch"], ev["waits_on"]))
    kernel = role[rows] < STREAM_SYNC
    # each kernel's previous one on its stream: streams numbered in the order they first ran a kernel
    kernels = np.flatnonzero(kernel)
    rank, stream = ev["rank"][rows[kernels]], ev["stream"][rows[kernels]]
    by_stream = kernels[np.lexsort((kernels, stream, rank))]
    same = np.zeros(len(by_stream), dtype=bool)
    same[1:] = (ev["rank"][rows[by_stream[1:]]] == ev["rank"][rows[by_stream[:-1]]]) & (
        ev["stream"][rows[by_stream[1:]]] == ev["stream"][rows[by_stream[:-1]]])
    previous_row = np.full(len(rows), -1, dtype=np.int64)
    previous_row[by_stream[1:][same[1:]]] = by_stream[:-1][same[1:]]
    i = rows[kernels]
    previous = np.where(previous_row[kernels] >= 0, end[rows[np.maximum(previous_row[kernels], 0)]], -1)
    previous_event = rows[np.maximum(previous_row[kernels], 0)]
    waited_end = np.where(waited[kernels] >= 0, end[np.maximum(waited[kernels], 0)], -1)
    launched = np.where(caller[kernels] >= 0, start[np.maximum(caller[kernels], 0)], -1)
    shape.device = (kernels, i, previous, previous_event, waited_end, launched,
                    _syncs(ev, rows, kernel, caller, waited, end, by_stream, same))
    return shape.device


def _syncs(ev: dict, rows, kernel, caller, waited, end, by_stream, same) -> list[tuple]:
    """The edges of the syncs among the device rows (_device's, as its tuples): from the work each waited for (the
    last kernel before it on its stream, on each stream of its rank, or the event it waits for) to the end of the
    host call that waited."""
    syncs = np.flatnonzero(~kernel & (caller >= 0))
    syncs = syncs[end[np.maximum(caller[syncs], 0)] >= 0]
    if not len(syncs):
        return []
    # each stream's kernels (their positions among the rows), the streams in the order they first ran one
    bounds = np.flatnonzero(~same).tolist() + [len(by_stream)]
    streams = sorted(((int(ev["rank"][rows[by_stream[a]]]), int(ev["stream"][rows[by_stream[a]]])),
                      by_stream[a:b].tolist()) for a, b in zip(bounds[:-1], bounds[1:]))
    streams = dict(sorted(streams, key=lambda item: item[1][0]))
    edges = []
    for p in syncs.tolist():
        event, called = rows[p], int(caller[p])
        rank, role = int(ev["rank"][event]), ev["role"][event]
        if role == EVENT_SYNC:
            sources = [end[waited[p]]] if waited[p] >= 0 and end[waited[p]] >= 0 else []
        else:
            sources = []
            for key in ([key for key in streams if key[0] == rank] if role == CONTEXT_SYNC
                        else [(rank, int(ev["stream"][event]))]):
                before = bisect.bisect_left(streams.get(key, []), p)
                if before:
                    sources.append(end[rows[streams[key][before - 1]]])
        for sub, node in enumerate(sources):
            edges.append((np.array([p]), sub, node, end[called], SYNC, called, False))
    return edges


def _binding(g: Graph) -> tuple[np.ndarray, np.ndarray]:
    """Per edge, whether its node waits for several things (contested); per node, the edge that held it up (-1:
    none): of its contested edges, the one whose source came last (of those as late, the first)."""
    kind, dst, src = g.kind, g.dst, g.src
    ts = g.ts
    contested = (_of(kind, (LAUNCH, KERNEL_GAP, SYNC, COLLECTIVE), len(KINDS))
                 | ((kind == OP_EDGE) & (~g.weighs | _of(dst, list(g.completions), len(ts))))
                 | ((kind == WINDOW) & _of(dst, list(g.rank_ends), len(ts))))
    edges = np.flatnonzero(contested)
    # per node, its contested edges by their source's time, the latest first, then by index: the first of each node
    edges = edges[np.lexsort((edges, -ts[src[edges]], dst[edges]))]
    first = np.ones(len(edges), dtype=bool)
    first[1:] = dst[edges][1:] != dst[edges][:-1]
    binding = np.full(len(ts), -1, dtype=np.int64)
    binding[dst[edges[first]]] = edges[first]
    return contested, binding


def _order(ts: np.ndarray, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The order of a walk of the graph: its nodes in topological order (Kahn's; of the nodes ready, the earliest
    first, by time, then number), and its edges in the order the walk relaxes them (each node's outgoing edges, by
    index, when it is taken). It depends on the graph and its times only, not on the weights: every what-if of a
    window shares it. Nearly every edge leads to a later node: where none leads back, that order is the nodes' by
    time and number (the earliest node not taken has all its sources taken), a sort; _taken walks the few
    stretches where one does."""
    n = len(ts)
    nodes = np.argsort(ts, kind="stable")
    position = np.empty(n, dtype=np.int64)
    position[nodes] = np.arange(n)
    back = position[src] >= position[dst]
    if back.any():
        kahn = longest_path.compiled_kahn()  # (compiled, once `tracesql findings` has loaded it)
        if kahn is not None:
            taken = np.empty(n, dtype=np.int64)
            nodes = taken[:kahn(nodes, position, src, dst, np.unique(position[dst[back]]), taken)]
        else:
            nodes = _taken(nodes, position, src, dst, back)
        position = np.full(n, n, dtype=np.int64)  # (nodes on a cycle are never taken, nor their edges)
        position[nodes] = np.arange(len(nodes))
    edges = np.argsort(position[src], kind="stable")
    return nodes, edges[position[src][edges] < n]


def _taken(nodes: np.ndarray, position: np.ndarray, src: np.ndarray, dst: np.ndarray, back: np.ndarray) -> np.ndarray:
    """Kahn's order of the nodes (of those ready, the earliest: the first in `nodes`, by time and number), where
    some edges (back) lead to a node as early or earlier. Up to the first node such an edge leads to, every node is
    ready in its turn: taken in a slice; from there, node by node, the nodes not ready deferred until their sources
    are taken, until none waits, and again a slice up to the next such node."""
    n = len(nodes)
    # each node's sources and targets (read for the few nodes of the stretches only)
    by_dst, by_src = np.argsort(dst, kind="stable"), np.argsort(src, kind="stable")
    first_in = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))])
    first_out = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))])
    sources, targets = src[by_dst], dst[by_src]
    stops = np.unique(position[dst[back]]).tolist()
    taken: list = []
    cursor = 0
    for stop in stops + [n]:
        if stop < cursor:
            continue
        taken.append(nodes[cursor:stop])  # every node before the cursor taken, none waiting: each ready in turn
        cursor = stop
        if cursor >= n:
            break
        stretch, here, waiting, ready = cursor, set(), {}, []  # waiting: node -> its sources not taken
        while True:
            v = -1
            while cursor < n and not (ready and ready[0] < cursor):  # the next node in turn, unless it waits
                c = int(nodes[cursor])
                missing = sum(1 for a in sources[first_in[c]:first_in[c + 1]].tolist()
                              if position[a] >= stretch and a not in here)
                cursor += 1
                if not missing:
                    v = c
                    break
                waiting[c] = missing  # deferred
            if v < 0 and ready:  # else a deferred node now ready and earlier
                v = int(nodes[heapq.heappop(ready)])
            elif v < 0:
                break  # (the rest wait on a cycle)
            taken.append([v])
            here.add(v)
            for b in targets[first_out[v]:first_out[v + 1]].tolist():
                if b in waiting:
                    waiting[b] -= 1
                    if not waiting[b]:
                        del waiting[b]
                        heapq.heappush(ready, int(position[b]))
            if not waiting and not ready:
                break
    return np.concatenate([np.asarray(part, dtype=np.int64) for part in taken]) if taken else nodes[:0]


class Plan:
    """A window's graph as its walks need it, in arrays: its edges (numbered in the order the walk relaxes
    them), and what the replay's weights start from. Built once per graph (build), walked for each what-if's scales (segments): the replays of one
    window by the findings rules differ in their scales only, unless a change removes synchronisations."""

    def __init__(self, ev, windows: list[dict] | None, changed: bool, shape: _Shape | None = None):
        """changed: whether the replay is walked with the events' scales (a gaps_scale): then a synchronisation
        with scale 0 is removed and a host call with scale 0 waits for nothing; else the scales are ignored.
        shape: the events' _Shape, if known (of all of them: the unchanged plan's, `shape`)."""
        ev = _arrays(ev)
        if changed:  # removed synchronisations: scale 0
            self.keep = np.flatnonzero((ev["role"] < STREAM_SYNC) | (ev["scale"] != 0))
            if shape is not None and len(self.keep) < len(ev["role"]):
                shape = shape.of_rows(self.keep)
            ev = {name: values[self.keep] for name, values in ev.items()}
        else:
            self.keep = None
        shape = _shape(ev) if shape is None else shape
        g, ends = build(ev, windows, changed, shape)
        # (its events' shape: a replay's plan kept for the step's changes lends it to the one that removes its
        # synchronisations, _plan)
        self.shape = shape
        self.empty = not len(g.src)
        self.replay = windows is not None
        self.ends = [int(ev["rank"][0])] if ends is None else list(ends)
        self.end_nodes = None if ends is None else list(ends.values())
        self.node_count = len(g.ts)
        node_ts = g.ts
        self.src, self.dst = g.src, g.dst
        self.nodes, order = _order(node_ts, self.src, self.dst)
        self.time = node_ts[self.dst] - node_ts[self.src]
        self.kind, self.owner, self.weighs = g.kind, g.owner, g.weighs
        self.src_ts = node_ts[self.src]
        if self.replay:
            # where a node waits for several things, the edges that did not hold it up weigh 0 (see weights)
            contested, binding = _binding(g)
            self.held = ~contested | (binding[self.dst] == np.arange(len(self.dst)))
        self.event_id = ev["id"]
        self.event_rank = ev["rank"]
        self.event_bound = np.where(ev["role"] <= BLOCKED_LAUNCH, 0,
                                    np.where(ev["role"] == COMMUNICATION, 1, 2)).astype(np.int8)
        # the edges renumbered in the walk's order (those it never relaxes, on a cycle, left out); kept for every
        # step's replay: node and edge numbers in 32 bits (120 plans at 24x ~150 MB less)
        self.src, self.dst, self.time, self.kind, self.owner, self.weighs, self.src_ts = (
            a[order] for a in (self.src, self.dst, self.time, self.kind, self.owner, self.weighs, self.src_ts))
        if self.replay:
            self.held = self.held[order]
        self.src, self.dst, self.owner, self.nodes = (a.astype(np.int32) for a in (self.src, self.dst, self.owner,
                                                                                 self.nodes))
        # for _whole_distances: per node, the edge that alone leads to it (-1: none or several), and the edges
        # into the nodes several lead to
        single = np.bincount(self.dst, minlength=self.node_count)[self.dst] == 1
        self.single_in = np.full(self.node_count, -1, dtype=np.int32)
        self.single_in[self.dst[single]] = np.flatnonzero(single)
        self.joins = np.flatnonzero(~single).astype(np.int32)
        # the unchanged replay's path (its edges) and each rank's length, once walked: what lengths compares a
        # change with (None: not walked, or some rank's path has no segment or is of length 0)
        self.unchanged = None

    def weights(self, scales, gaps_scale: float | None) -> np.ndarray:
        """HTA's weights (not a replay), or the replay's: every edge weighs its time, changed by the what-if,
        except where a node waits for several things (a device event for its launch, the previous event on its
        stream and an event it waits for; a blocking call's end for the host and the device work it synchronises
        with): there only what came last, what held it up, weighs its time; the others weigh 0 (they still
        order). A negative time (clocks of host and device apart, rounding) counts as the trace has it."""
        time = self.time.astype(np.float64)
        if not self.replay:
            return np.where(self.weighs, np.maximum(time, 0), 0.0)
        if gaps_scale is None:
            return self._unchanged()
        scale = self._scale(scales)
        kind = self.kind  # gaps scale by gaps_scale, an event's pieces and its collectives' edges by its scale
        changed = np.where((kind == LAUNCH) | (kind == KERNEL_GAP), time * gaps_scale,
                           np.where((kind == OP_EDGE) | (kind == COLLECTIVE), time * scale[self.owner], time))
        return np.where(self.held, changed, 0.0)

    def columns(self, scales, gaps_scale: float | None) -> dict[str, np.ndarray]:
        """The segments of the critical path with these scales (per event) and gaps_scale, in order, as columns
        (SEGMENT_FIELDS; event_id -1 and has_event false where a segment belongs to no event, edge and bound_by
        as codes into KINDS and SEGMENT_BOUND)."""
        weight = np.zeros(0) if self.empty else self.weights(scales, gaps_scale)
        c = self._columns(weight)
        if self.replay and gaps_scale is None and self.unchanged is None:
            lengths = _lengths(c)
            if set(lengths) == set(self.ends) and all(lengths.values()):
                self.unchanged = (c["edges"], lengths)
        return c

    def _columns(self, weight: np.ndarray) -> dict[str, np.ndarray]:
        """columns with these weights (an edge each), and the path's edges (`edges`)."""
        if self.empty:
            edges, path_rank = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        else:
            edges, path_rank = self._longest(weight)
        by = self.owner[edges]
        has_event = by >= 0
        event = np.where(has_event, by, 0)
        kind = self.kind[edges]
        time = self.time[edges]
        # HTA counts a -1 (a child ending 1 ns after its parent: rounding) as -1 in the total, 0 in the path
        dur = np.rint(weight[edges]).astype(np.int64)
        if not self.replay:
            dur = np.where(time < 0, time, dur)
        starts = np.flatnonzero(np.concatenate([[True], path_rank[1:] != path_rank[:-1]])) if len(edges) else edges
        seq = np.arange(len(edges)) - np.repeat(starts, np.diff(np.append(starts, len(edges))))
        return {"seq": seq, "event_id": np.where(has_event, self.event_id[event], -1), "has_event": has_event,
                "ts": self.src_ts[edges], "dur_ns": dur, "edge": kind,
                "bound_by": np.where(kind == LAUNCH, 3, np.where(kind == KERNEL_GAP, 4, self.event_bound[event])),
                "path_rank": path_rank, "rank": np.where(has_event, self.event_rank[event], path_rank),
                "edges": edges}

    def lengths(self, scales, gaps_scale: float) -> dict[int, int]:
        """Each rank's replayed length with these scales and gaps_scale (the sum of its path's dur_ns, what the
        what_if macro predicts; ranks without a segment left out), for replay_lengths. Without a walk where it
        cannot differ from the unchanged replay's (walked before on this plan): when the change's weights are
        whole, none above its unchanged weight and each as it was on every rank's unchanged path, no path grew
        and the unchanged path of each rank is as long as before, so each rank's longest path is as long (ties
        between paths decide which path, not its length). `findings` on the 24x tile: 480 of its 1,320 walks
        (11 changes x 120 steps) were so, 0.3 CPU-s in all (a walk there: 6.6 ms)."""
        weight, whole, none_longer = self._weighed(scales, gaps_scale)
        if self.unchanged is not None and whole and none_longer:
            path, lengths = self.unchanged
            if (weight[path] == self._unchanged(path)).all():
                return dict(lengths)
        if not self.empty and whole:
            # a path of whole weights is as long as the distance to its end (it starts where nothing leads, at
            # 0): no need to list its edges (_ways, 2 of a walk's 7 ms at 24x), unless a rank's is 0 or less (it
            # may have no segment: left out)
            reached = self.distances(weight, whole=True)[0][self.end_nodes]
            if (reached > 0).all():
                return dict(zip(self.ends, reached.tolist()))
        return _lengths(self._columns(weight))

    def _weighed(self, scales, gaps_scale: float) -> tuple[np.ndarray, bool, bool]:
        """The replay's weights with these scales and gaps_scale (weights), whether they are whole (_whole) and
        whether none is above its unchanged weight; compiled (longest_path.weigh) once `findings` has loaded it."""
        if self.empty:
            return np.zeros(0), True, True
        weigh = longest_path.compiled_weigh()
        if weigh is None:
            weight = self.weights(scales, gaps_scale)
            return weight, self._whole(weight), bool((weight <= self._unchanged()).all())
        weight = np.empty(len(self.time))
        whole, none_longer, total = weigh(self.time, self.kind, self.owner, self.held, self._scale(scales),
                                          float(gaps_scale), SCALED_KINDS, GAP_KINDS, weight)
        return weight, whole and total < EXACT_SUM, none_longer

    def _unchanged(self, edges=slice(None)) -> np.ndarray:
        """The unchanged replay's weights of these edges (all by default): each its time where it held its node up,
        else 0."""
        return np.where(self.held[edges], self.time[edges], 0.0)

    def _scale(self, scales) -> np.ndarray:
        """Each event's scale of this plan's events (a missing one, None or NaN: 1)."""
        scale = np.array(scales, dtype=np.float64)
        if self.keep is not None:
            scale = scale[self.keep]
        return np.where(np.isnan(scale), 1.0, scale)

    def _longest(self, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The edges of each path (HTA's: the longest of all; the replay's: each rank's) with these weights, in
        order, those that weigh 0 left out (HTA's keeps those whose time is 0), and the rank whose path each is."""
        dist, via = self.distances(weight)
        if self.end_nodes is None:  # the longest path of all: of the nodes as long, the first taken
            reached = dist[self.nodes]
            ends = [int(self.nodes[int(np.argmax(reached))])] if len(reached) else []
        else:
            ends = self.end_nodes
        paths, ranks = [], []
        for path_rank, edges in zip(self.ends, self._ways(via, ends)):
            paths.append(edges[(weight[edges] != 0) | (self.weighs[edges] & (not self.replay))])
            ranks.append(np.full(len(paths[-1]), path_rank, dtype=np.int64))
        if not paths:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(paths), np.concatenate(ranks)

    def _ways(self, via: np.ndarray, ends: list[int]) -> list[np.ndarray]:
        """The edges of the path to each of `ends`, by `via` (each node's edge to it), in order: each end's
        ancestors, listed by doubling (each round adds those 2**k to 2**(k+1) - 1 edges up, by the ancestors
        2**k up of every node, itself a round of the one before), in one pass of arrays per round (following the
        edges back one node at a time in Python took 3 ms a step of ~25 k edges). The edges are numbered in the
        walk's order, in which each edge of a path comes after the one before it: sorted, they are in order.
        Or, once `tracesql findings` has loaded it, each path traced back edge by edge, compiled (longest_path)."""
        trace = longest_path.compiled_trace()
        if trace is not None:
            edges = np.empty(self.node_count, dtype=np.int64)
            return [edges[:trace(via, self.src, end, edges)][::-1].copy() for end in ends]
        node = np.arange(self.node_count)
        up = np.where(via >= 0, self.src[np.maximum(via, 0)], node)  # (a node nothing leads to: itself)
        found = [[np.array([v])] if via[v] >= 0 else [] for v in ends]
        latest = [part[0] if part else node[:0] for part in found]
        while any(len(nodes) for nodes in latest):
            for k, nodes in enumerate(latest):
                nodes = up[np.concatenate(found[k])] if len(nodes) else nodes
                latest[k] = nodes[via[nodes] >= 0]
                found[k].append(latest[k])
            up = up[up]
        return [np.sort(via[np.concatenate(nodes)]) if nodes else node[:0] for nodes in found]

    def distances(self, weight: np.ndarray, whole: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per node, the length of the longest path to it (a node nothing leads to: 0; one something leads to: the
        longest, even if negative) and the edge it came by (-1: none): of the edges as long, the first in the
        walk's order. Whole-number weights (HTA's path, the unchanged replay, a what-if that scales by 0 or 1) are
        summed in arrays (_whole_distances: exact, as any sum of whole numbers below 2**53), others one edge at a
        time in the walk's order (_distances_in_order), whose float sums the arrays would round otherwise; or both
        one edge at a time by the loop compiled, once `tracesql findings` has loaded it (longest_path), in int64
        or float64: the same results. whole: force one way (a test compares them)."""
        if whole is None:
            whole = self._whole(weight)
        relax = longest_path.compiled()
        if relax is not None:
            dist = np.zeros(self.node_count, dtype=np.int64 if whole else np.float64)
            via = np.full(self.node_count, -1, dtype=np.int64)
            relax(self.src, self.dst, weight.astype(dist.dtype), dist, via)
            return dist, via
        return self._whole_distances(weight.astype(np.int64)) if whole else self._distances_in_order(weight)

    @staticmethod
    def _whole(weight: np.ndarray) -> bool:
        """Whether distances sums `weight` in arrays (whole numbers, every path's sum exact)."""
        return bool((weight == np.rint(weight)).all()) and float(np.abs(weight).sum()) < EXACT_SUM

    def _distances_in_order(self, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """distances, one relaxation per edge in the walk's order: each node's distance and the edge it came by,
        of equal paths the first found."""
        dist = [0.0] * self.node_count
        via = [-1] * len(dist)
        longest_path.relax(self.src.tolist(), self.dst.tolist(), weight.tolist(), dist, via)
        return np.array(dist), np.array(via, dtype=np.int64)

    def _whole_distances(self, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """distances of whole-number weights (int64), in arrays but for the few nodes several edges lead to. A node
        one edge leads to (~80 % of a replay's, every node of HTA's path) lies at a fixed offset from its anchor:
        the first node up its line of such edges that several edges or none lead to; anchors and offsets by
        pointer jumping (a pass per doubling of the lines' length). Then the edges into the nodes several edges
        lead to are relaxed in the walk's order, each from its source's anchor (a node taken before the source,
        its distance known by then), the first of the longest kept; every node's distance is its anchor's plus
        its offset."""
        src, dst, single_in, joins = self.src, self.dst, self.single_in, self.joins
        count = self.node_count
        alone = single_in >= 0
        anchor = np.where(alone, src[single_in], np.arange(count))
        offset = np.where(alone, weight[single_in], 0)
        while True:
            up = anchor[anchor]
            if (up == anchor).all():
                break
            offset += offset[anchor]
            anchor = up
        joined = np.zeros(count, dtype=bool)
        joined[dst[joins]] = True
        # the nodes several edges lead to numbered from 1, the distances of their anchors (0: any other anchor's)
        number = np.cumsum(joined) * joined
        top = [0] + [UNREACHED] * int(joined.sum())
        came = {}
        for a, d, b, e in zip(number[anchor[src[joins]]].tolist(), (offset[src[joins]] + weight[joins]).tolist(),
                              number[dst[joins]].tolist(), joins.tolist()):
            d += top[a]
            if d > top[b]:
                top[b], came[b] = d, e
        via = single_in.astype(np.int64)
        if came:
            via[np.flatnonzero(joined)[np.fromiter(came.keys(), np.int64, len(came)) - 1]] = np.fromiter(
                came.values(), np.int64, len(came))
        return np.array(top, dtype=np.int64)[number[anchor]] + offset, via

    def segments(self, scales, gaps_scale: float | None) -> list[dict]:
        """The segments of the critical path with these scales (per event) and gaps_scale, in order."""
        c = self.columns(scales, gaps_scale)
        return [{"seq": seq, "event_id": event_id if has_event else None, "ts": ts, "dur_ns": dur,
                 "edge": KINDS[kind], "bound_by": SEGMENT_BOUND[bound], "path_rank": path_rank, "rank": rank}
                for seq, event_id, has_event, ts, dur, kind, bound, path_rank, rank in zip(
                    *(c[name].tolist() for name in ("seq", "event_id", "has_event", "ts", "dur_ns", "edge",
                                                    "bound_by", "path_rank", "rank")))]

    def path(self, scales, gaps_scale: float | None) -> pa.Array:
        """segments as the walk returns them: a list (one row) of SEGMENT_TYPE."""
        c = self.columns(scales, gaps_scale)
        fields = SEGMENT_TYPE.value_type
        segments = pa.StructArray.from_arrays(
            [pa.array(c["seq"], pa.int32()), pa.array(c["event_id"], pa.int64(), mask=~c["has_event"]),
             pa.array(c["ts"], pa.int64()), pa.array(c["dur_ns"], pa.int64()),
             pa.DictionaryArray.from_arrays(pa.array(c["edge"].astype(np.int8)), _code_names()[0]),
             pa.DictionaryArray.from_arrays(pa.array(c["bound_by"].astype(np.int8)), _code_names()[1]),
             pa.array(c["path_rank"], pa.int64()), pa.array(c["rank"], pa.int64())],
            fields=[fields.field(i) for i in range(fields.num_fields)])
        return pa.ListArray.from_arrays(pa.array([0, len(segments)], pa.int32()), segments, type=SEGMENT_TYPE)


def _lengths(columns: dict[str, np.ndarray]) -> dict[int, int]:
    """Each rank's path length (its segments' dur_ns summed), in the order of the path's ranks, from columns."""
    path_rank, dur = columns["path_rank"], columns["dur_ns"]
    return {rank: int(dur[path_rank == rank].sum()) for rank in _path_ranks(path_rank)}


def _path_ranks(path_rank: np.ndarray) -> list[int]:
    """The ranks of a path's segments in the order they first come (a path of one rank's: its rank, not read into
    a list: 0.4 ms a path at 24x)."""
    if len(path_rank) and (path_rank == path_rank[0]).all():
        return [int(path_rank[0])]
    return list(dict.fromkeys(path_rank.tolist()))


#: whole-number weights are walked in arrays while every path is shorter than this (sums of whole numbers are exact
#: in any order below 2**53, the loop's float sums as the arrays' int64 ones)
EXACT_SUM = 2.0 ** 52
#: per edge kind (KINDS), whether the replay scales it by its event's scale, and whether by gaps_scale (weights)
SCALED_KINDS = _of(np.arange(len(KINDS)), [OP_EDGE, COLLECTIVE], len(KINDS))
GAP_KINDS = _of(np.arange(len(KINDS)), [LAUNCH, KERNEL_GAP], len(KINDS))
#: the distance of a node several edges lead to before the first is relaxed (below any path's length)
UNREACHED = -(2 ** 62)

#: a segment's bound_by: its event's class (EVENT_BOUND), else its edge's (BOUND_BY)
SEGMENT_BOUND = EVENT_BOUND + (BOUND_BY["launch"], BOUND_BY["kernel_gap"])


@functools.cache
def _code_names() -> tuple[pa.Array, pa.Array]:
    """The names of the segments' codes (NAMED): of their edges (KINDS) and bound_by (SEGMENT_BOUND). Made when
    first walked, not on import: pyarrow's first array imports pandas (0.25 s), which _warm_up does beside the SQL."""
    return pa.array(KINDS, pa.string()), pa.array(SEGMENT_BOUND, pa.string())


def _wakers(g: Graph, ev: dict, thread: np.ndarray, unanchored: np.ndarray, count: int) -> np.ndarray:
    """For the replay: the host node that each first op of a thread (nothing leads to it) hangs off, the latest
    one of another thread of its rank before it: the work that woke it, as far as the trace tells (the autograd thread
    starts when the main thread calls backward). Unchanged, the edge lasts the time between them, as the
    window's start would; with earlier work made faster, the thread starts earlier. Per node of `unanchored`, its
    waker (-1: none, or not a host op's)."""
    node_ts, node_event = g.ts[:count], g.event[:count]
    role = ev["role"][node_event]
    host = np.flatnonzero((node_event >= 0) & (role >= OP) & (role <= BLOCKED_LAUNCH))
    host = host[np.lexsort((host, node_ts[host], ev["rank"][node_event[host]]))]  # by rank, then time and number
    times, host_thread, host_rank = node_ts[host], thread[node_event[host]], ev["rank"][node_event[host]]
    is_host = np.zeros(count, dtype=bool)
    is_host[host] = True
    # the host nodes in runs of one thread of a rank: the latest before a node of another thread is the one
    # before it, unless that is of the node's thread: then the one before the start of its run
    new_run = np.ones(len(host), dtype=bool)
    new_run[1:] = (host_rank[1:] != host_rank[:-1]) | (host_thread[1:] != host_thread[:-1])
    run_start = np.maximum.accumulate(np.where(new_run, np.arange(len(host)), 0))
    woken = np.full(len(unanchored), -1, dtype=np.int64)
    asked = np.flatnonzero(is_host[unanchored])
    v_event = node_event[unanchored[asked]]
    v_rank, v_thread = ev["rank"][v_event], thread[v_event]
    for rank in np.unique(v_rank).tolist():
        lo, hi = np.searchsorted(host_rank, rank, "left"), np.searchsorted(host_rank, rank, "right")
        of_rank = asked[v_rank == rank]
        before = lo + np.searchsorted(times[lo:hi], node_ts[unanchored[of_rank]], "right") - 1
        other = np.where(host_thread[before] != v_thread[v_rank == rank], before, run_start[before] - 1)
        woken[of_rank[other >= lo]] = host[other[other >= lo]]
    return woken


def _waits(g: Graph, ev: dict, end: np.ndarray, changed: bool) -> None:
    """For the replay: a blocking call (or a launch blocked on a full queue) ends no earlier than the last device
    work that ended while it ran (stream_free): the window's, an edge from its end (so that a blocking call the
    trace recorded without a `cuda_sync` event still waits for the device, and a blocked launch for the queue to
    drain), or work launched before the window, a fixed time no change inside the window moves; unless the
    changed replay removes the call's time (scale 0)."""
    role, free = ev["role"], ev["stream_free"]
    waiting = ((role == BLOCKING_OP) | (role == BLOCKED_LAUNCH)) & (free != NULL)
    if changed:
        waiting &= ev["scale"] != 0
    waiting = np.flatnonzero(waiting)
    if not len(waiting):
        return
    # the kernels by rank and end (of those that end together, the last one)
    kernels = np.flatnonzero((role == DEVICE) | (role == COMMUNICATION))
    kernels = kernels[end[kernels] >= 0]
    kernel_rank, kernel_end = ev["rank"][kernels], (ev["ts"] + ev["dur"])[kernels]
    order = np.lexsort((kernels, kernel_end, kernel_rank))
    kernels, kernel_rank, kernel_end = kernels[order], kernel_rank[order], kernel_end[order]
    waited = np.full(len(waiting), -1, dtype=np.int64)
    waiting_rank = ev["rank"][waiting]
    for rank in np.unique(waiting_rank).tolist():
        lo, hi = np.searchsorted(kernel_rank, rank, "left"), np.searchsorted(kernel_rank, rank, "right")
        if lo == hi:
            continue
        asked = np.flatnonzero(waiting_rank == rank)
        at = lo + np.searchsorted(kernel_end[lo:hi], free[waiting[asked]], "right") - 1
        hit = (at >= lo) & (kernel_end[np.maximum(at, 0)] == free[waiting[asked]])
        waited[asked[hit]] = end[kernels[at[hit]]]
    # the others: a fixed time, which hangs off the window's start
    missing = waited < 0
    waited[missing] = g.nodes(free[waiting[missing]], -1, False)
    g.edges(waited, end[waiting], SYNC, waiting, False)


def _collectives(g: Graph, ev: dict, start: np.ndarray, end: np.ndarray) -> None:
    """For the replay: each rank's completion of a collective instance waits for every other rank's arrival (its
    first kernel's start); the edge is the completing kernel's (a slower rank's arrival lengthens it)."""
    # instance -> rank -> (arrival, completion): each a (time, node) of its earliest start and latest end
    calls: dict[int, dict[int, tuple[tuple[int, int], tuple[int, int]]]] = {}
    rows = np.flatnonzero((ev["role"] == COMMUNICATION) & (ev["collective"] != NULL))
    if not len(rows) or (ev["rank"][rows] == ev["rank"][rows[0]]).all():
        return  # (one rank's calls wait for no other's: 1.4 ms a replay of a 24x step, read here one by one)
    for key, rank, first, first_ts, last, last_ts in zip(
            ev["collective"][rows].tolist(), ev["rank"][rows].tolist(), start[rows].tolist(),
            g.ts[start[rows]].tolist(), end[rows].tolist(), g.ts[end[rows]].tolist()):
        arrival, completion = calls.setdefault(key, {}).get(rank, ((first_ts, first), (last_ts, last)))
        # (of as early or as late, the one before)
        calls[key][rank] = (arrival if arrival[0] <= first_ts else (first_ts, first),
                            completion if completion[0] >= last_ts else (last_ts, last))
    for ranks in calls.values():
        for rank, (_, (completion_ts, completion)) in ranks.items():
            for other, ((arrival_ts, arrival), _) in ranks.items():
                # clocks of other hosts may be off: an arrival after the completion tells nothing
                if other != rank and arrival_ts <= completion_ts:
                    g.edge(arrival, completion, COLLECTIVE, int(g.event[completion]))
                    g.completions.add(completion)


def path(ev, windows: list[dict] | None = None, gaps_scale: float | None = None) -> list[dict]:
    """The segments of the critical path, in order. windows None: HTA's path of one rank's window (edges that
    weigh 0 left out). Windows (each rank's: rank, ts, te): the what-if replay of them together, each rank's path
    from the earliest window start to the later of its window's end and the end of its last work: every edge
    weighs its time, changed by the events' scales and gaps_scale if given."""
    ev = _arrays(ev)
    return Plan(ev, windows, gaps_scale is not None).segments(ev["scale"], gaps_scale)


def build(ev, windows: list[dict] | None = None, changed: bool = False,
          shape: _Shape | None = None) -> tuple[Graph, dict | None]:
    """The dependency graph of the events (EVENT_FIELDS: a dict of lists or of _arrays' arrays; see the module's
    doc), and with windows (the replay's) each rank's end node; changed: the replay's host calls with scale 0 wait
    for nothing (else the scales are ignored); shape: the events' _Shape, if known."""
    ev = _arrays(ev)
    shape = _shape(ev) if shape is None else shape
    g = Graph(*shape.nodes)
    start, end, thread = shape.start, shape.end, shape.thread
    _host(g, ev, shape, replay=windows is not None)
    _device(g, ev, shape, replay=windows is not None)
    ends = None
    if windows is not None:
        _waits(g, ev, end, changed)
        _collectives(g, ev, start, end)
        # the windows' edges: the earliest start to each first node; each last node to its rank's range end (the
        # window's end: its time after them is the range's own, fixed), or, after that, to the rank's end, where
        # only the latest weighs (device work that ends after the range ends when it does, not at a fixed time
        # after the host's last op)
        count = len(g.ts)
        has_in, has_out = np.zeros(count, dtype=bool), np.zeros(count, dtype=bool)
        has_in[g.dst], has_out[g.src] = True, True
        node_ts, node_event = g.ts, g.event
        first = g.node(min(w["ts"] for w in windows), -1, True)
        range_end = {w["rank"]: w["te"] for w in windows}
        last_ts = dict(range_end)
        of_event = node_ts[node_event >= 0]
        node_rank = ev["rank"][node_event[node_event >= 0]]
        for rank in last_ts:
            of_rank = of_event[node_rank == rank]
            if len(of_rank):
                last_ts[rank] = max(last_ts[rank], int(of_rank.max()))
        ends = {rank: g.node(ts, -1, False) for rank, ts in last_ts.items()}
        g.rank_ends.update(ends.values())
        range_nodes = {rank: g.node(te, -1, False) for rank, te in range_end.items()}
        for rank, node in range_nodes.items():
            g.edge(node, ends[rank], WINDOW)
        # each node's edges in turn: from what leads to it (its waker, else the window's start), then to its end
        unanchored = np.flatnonzero(~has_in)
        woken = _wakers(g, ev, thread, unanchored, count)
        loose = np.flatnonzero(~has_out)
        window_rank = np.array(list(range_end), dtype=np.int64)
        rank_at = np.argsort(window_rank, kind="stable")
        at = rank_at[np.searchsorted(window_rank, ev["rank"][node_event[loose]], sorter=rank_at)]
        to = np.where(node_ts[loose] <= np.array(list(range_end.values()), dtype=np.int64)[at],
                      np.array(list(range_nodes.values()), dtype=np.int64)[at],
                      np.array([ends[rank] for rank in range_end], dtype=np.int64)[at])
        by_node = np.argsort(np.concatenate([unanchored, loose]), kind="stable")
        g.edges(np.concatenate([np.where(woken >= 0, woken, first), loose])[by_node],
                np.concatenate([unanchored, to])[by_node], WINDOW, -1, True)
    return g, ends


def walk(events: pa.Array, windows: pa.Array, gaps_scale: pa.Array) -> pa.Array:
    """The DuckDB function (Arrow), per row: a window's events -> its path's segments; HTA's path when windows
    is NULL, else the replay of those windows (each rank's), with the what-if's changes unless gaps_scale is
    NULL."""
    out = []
    for ev, spans, gaps in zip(_rows(events), windows.to_pylist(), gaps_scale.to_pylist()):
        if ev is None:
            out.append(pa.nulls(1, SEGMENT_TYPE))
            continue
        spans = _by_rank(spans)
        out.append(_walk_one(ev, spans, gaps, _digest(spans, ev)))
    return pa.concat_arrays(out) if out else pa.array([], type=SEGMENT_TYPE)


def replay_rank_lengths(events: pa.Array, windows: pa.Array, gaps_scale: pa.Array, keys: pa.Array) -> pa.Array:
    """The DuckDB function critical_path_replay_lengths (Arrow), per row: each rank's path of the replay of these
    windows, as walk walks it (or, unchanged, the walk walked ahead that `keys` find, as walked finds it, its
    events not read), summed (_rank_lengths): what the what_if macro reads of a replay, without its segments
    (the 24x tile's 3 M, made into DuckDB's lists and unnested, took 1 CPU-s of findings' unchanged replays)."""
    gaps, spans = gaps_scale.to_pylist(), [_by_rank(w) for w in windows.to_pylist()]
    found = [None if g is not None else _AHEAD.get(_walk_key(k, w)) for k, w, g in zip(keys.to_pylist(), spans, gaps)]
    out = []
    for ev, its_spans, its_gaps, path in zip(_rows(events, skip=[f is not None for f in found]), spans, gaps, found):
        if path is None and ev is not None:
            path = _walk_one(ev, its_spans, its_gaps, _digest(its_spans, ev))
        out.append(None if path is None else _rank_lengths(path))
    return pa.array(out, type=RANK_LENGTHS_TYPE)


def _rank_lengths(path: pa.Array) -> list[dict] | None:
    """A walk's path (a list of one row; NULL: None) per rank whose path it is, in their order: its length (its
    segments' dur_ns summed), the part of it on other ranks' events, and the rank of the longest segment there
    (of equal ones the first; None: none)."""
    if not path.is_valid()[0].as_py():
        return None
    segments = path.flatten()
    path_rank, rank, dur = (segments.field(name).to_numpy() for name in ("path_rank", "rank", "dur_ns"))
    out = []
    for its_rank in _path_ranks(path_rank):
        mine = path_rank == its_rank
        remote = dur[mine & (rank != its_rank)], rank[mine & (rank != its_rank)]
        out.append({"rank": its_rank, "length_ns": int(dur[mine].sum()), "remote_ns": int(remote[0].sum()),
                    "remote_rank": int(remote[1][np.argmax(remote[0])]) if len(remote[0]) else None})
    return out


#: critical_path_replay_lengths' rows (replay_rank_lengths)
RANK_LENGTHS_FIELDS = (("rank", pa.int64()), ("length_ns", pa.int64()), ("remote_ns", pa.int64()),
                       ("remote_rank", pa.int64()))
RANK_LENGTHS_TYPE = pa.list_(pa.struct([pa.field(n, t) for n, t in RANK_LENGTHS_FIELDS]))


def is_walked_ahead(keys: pa.Array) -> pa.Array:
    """The DuckDB function (Arrow) critical_path_walked_ahead, per window's walk_key: whether its HTA path and its
    step's unchanged replay are walked ahead (walk_ahead walks a step's together: the what_if macro then reads the
    path from step_critical_paths_walked, and critical_path_replay_lengths finds the replay)."""
    return pa.array([_walk_key([key], None) in _AHEAD for key in keys.to_pylist()], pa.bool_())


def _walk_key(keys: list | None, spans: list | None) -> tuple | None:
    """What an unchanged walk walked ahead is found by: its events' keys and its windows (None: no key)."""
    if keys is None or None in keys:
        return None
    return tuple(keys), None if spans is None else tuple((w["rank"], w["ts"], w["te"]) for w in spans)


@contextlib.contextmanager
def walked_ahead(walks: dict):
    """While the block runs, critical_path_replay_lengths finds these walks (walk_ahead's, by _walk_key) and
    critical_path_walked_ahead says their windows are walked ahead: for as long as `tracesql findings` runs its
    rules (not kept by recency as other walks are, _WALKED: a window said to be walked ahead is found)."""
    with _KEEPING:
        _AHEAD.update(walks)
    try:
        yield
    finally:
        with _KEEPING:
            for key in walks:
                _AHEAD.pop(key, None)


#: critical_path_event_lists' events: the walk's fields, and what the what-if's changes look at (change_scales)
LISTED_FIELDS = EVENT_FIELDS + (("name", pa.string()), ("op_role", pa.string()), ("sync_call", pa.bool_()),
                                ("straggles", pa.bool_()))
SCALES_SQL = "STRUCT(scales DOUBLE[], reroled BOOLEAN)"


class ListedEvents:
    """critical_path_event_lists' events (lists: an Arrow list array, or chunked) as change_scales reads them,
    chunk by chunk, each column read once for all the changes priced of them (`tracesql findings` prices a dozen
    of one run's): per chunk its rows' offsets into its events, and their roles as codes (and which are syncs and
    kernels), names as a dictionary (each distinct name matched once), sync_call and straggles as booleans, each
    read when first asked for."""

    def __init__(self, events: pa.Array | pa.ChunkedArray):
        self.chunks = [_ListedChunk(chunk) for chunk in (events.chunks if isinstance(events, pa.ChunkedArray)
                                                          else [events])]


class _ListedChunk:
    def __init__(self, chunk: pa.ListArray):
        offsets = chunk.offsets.to_numpy().astype(np.int64)
        self.events = chunk.values.slice(offsets[0], offsets[-1] - offsets[0])
        self.offsets = offsets - offsets[0]

    @functools.cached_property
    def role(self) -> np.ndarray:
        return _role_codes(self.events.field("role"))

    @functools.cached_property
    def syncs(self) -> np.ndarray:
        return _of(self.role, SYNC_CODES, len(ROLES))

    @functools.cached_property
    def kernels(self) -> np.ndarray:
        return _of(self.role, [DEVICE, COMMUNICATION], len(ROLES))

    @functools.cached_property
    def names(self) -> pa.DictionaryArray:
        return self.events.field("name").dictionary_encode()

    @functools.cached_property
    def sync_call(self) -> np.ndarray:
        return _true(self.events.field("sync_call"))

    @functools.cached_property
    def straggles(self) -> np.ndarray:
        return _true(self.events.field("straggles"))


def change_scales(events: ListedEvents | pa.Array | pa.ChunkedArray, faster: str | None, faster_pct: float | None,
                  hide_communication: int, remove_syncs: int, straggler_scale: np.ndarray | None = None,
                  straggler_on_host: np.ndarray | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """Per row of `events` (lists of critical_path_event_lists' events, or ListedEvents of them), the scale of each
    of its events under a what-if's change (NaN: none) and whether `faster` names a range of it (reroled: the
    change makes it an op). An event's scale is the first of these that holds:
    - a synchronisation: 0 if remove_syncs = 1, else none;
    - a communication kernel, with hide_communication = 1: 0;
    - a host call that waits for the device (sync_call), with remove_syncs = 1: 0;
    - its name matches `faster` (a regular expression, RE2 as DuckDB's): 1 - faster_pct / 100 (NULL: none);
    - the row's straggler_scale (NaN: none) if the event straggles, on the host if the row's straggler_on_host,
      else on the device.
    What critical_path_scales gives (by critical_path_event_scales) and `tracesql findings` computes of its event
    lists for each of its rules' changes. In arrays, each distinct name matched once: a CASE per event in SQL
    took 0.3-1.2 CPU-s a change over the 24x tile's 2.75 M events."""
    listed = events if isinstance(events, ListedEvents) else ListedEvents(events)
    scales, reroled, first = [], [], 0
    for chunk in listed.chunks:
        offsets, role = chunk.offsets, chunk.role
        scale = np.full(len(role), np.nan)
        decided = chunk.syncs.copy()
        if remove_syncs == 1:
            scale[decided] = 0
        kernel = chunk.kernels
        if hide_communication == 1:
            _decide(scale, decided, role == COMMUNICATION, 0)
        if remove_syncs == 1:
            _decide(scale, decided, ~kernel & chunk.sync_call, 0)
        rows = len(offsets) - 1
        if faster is not None:
            names = chunk.names
            try:
                matched = np.append(_true(pc.match_substring_regex(names.dictionary, faster)), False)
            except pa.ArrowInvalid as e:
                raise ValueError(f"faster = {faster!r} is not a regular expression: {e}") from None
            hit = matched[names.indices.fill_null(len(matched) - 1).to_numpy()]
            _decide(scale, decided, hit, np.nan if faster_pct is None else 1 - faster_pct / 100)
            reroled.append(np.add.reduceat(np.append(hit & (role == RANGE), False), offsets[:-1]) > 0
                           if rows else np.zeros(0, bool))
            reroled[-1][offsets[:-1] == offsets[1:]] = False  # (an empty list's reduceat reads the next row's)
        else:
            reroled.append(np.zeros(rows, bool))
        if straggler_scale is not None and rows:
            row_of = np.repeat(np.arange(first, first + rows), np.diff(offsets))
            its = straggler_scale[row_of]
            _decide(scale, decided, chunk.straggles & ~np.isnan(its) & (straggler_on_host[row_of] == ~kernel), its)
        scales += [scale[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
        first += rows
    return scales, np.concatenate(reroled) if reroled else np.zeros(0, bool)


def _decide(scale: np.ndarray, decided: np.ndarray, holds: np.ndarray, value) -> None:
    """The scale of the events not decided yet where `holds`: value (a number, or per event)."""
    chosen = holds & ~decided
    scale[chosen] = value[chosen] if isinstance(value, np.ndarray) else value
    decided |= chosen


def _true(values: pa.Array) -> np.ndarray:
    """Booleans as numpy, NULL false (as a SQL condition takes it)."""
    return values.fill_null(False).to_numpy(zero_copy_only=False)


def event_scales(events, faster, faster_pct, hide_communication, remove_syncs, straggler_scale,
                 straggler_on_host) -> pa.Array:
    """The SQL function critical_path_event_scales: change_scales of each row, as (scales, reroled); the
    change's arguments per row (critical_path_scales gives every row the same; rows whose differ are computed
    apart). A NULL list of events has NULL scales."""
    events = events.combine_chunks() if isinstance(events, pa.ChunkedArray) else events
    changes = list(zip(*(a.to_pylist() for a in (faster, faster_pct, hide_communication, remove_syncs))))
    straggler_scale = straggler_scale.to_numpy(zero_copy_only=False).astype(np.float64)
    straggler_on_host = _true(straggler_on_host)
    scales, reroled = [None] * len(events), np.zeros(len(events), bool)
    for change in dict.fromkeys(changes):
        rows = [i for i, c in enumerate(changes) if c == change]
        some = events if len(rows) == len(events) else events.take(pa.array(rows, pa.int64()))
        its_scales, its_reroled = change_scales(some, *change,
                                                straggler_scale[rows], straggler_on_host[rows])
        for i, row in enumerate(rows):
            scales[row] = its_scales[i]
        reroled[rows] = its_reroled
    valid = events.is_valid().to_numpy(zero_copy_only=False)
    values = np.concatenate(scales) if scales else np.zeros(0)
    lists = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum([len(s) for s in scales])]), pa.int32()),
                                     pa.array(values, pa.float64(), mask=np.isnan(values)), mask=pa.array(~valid))
    return pa.StructArray.from_arrays([lists, pa.array(reroled)], names=["scales", "reroled"],
                                      mask=pa.array(~valid))


def replay_lengths(lists: pa.Table, scales: list[list[np.ndarray]], gaps_scales: list[float],
                   arrays: list | None = None) -> Shared:
    """Each change's predicted time of every window of `lists` (`tracesql findings`: its rules' changes priced at
    once): critical_path_event_lists' rows (no change made a range an op); scales: per row of `lists`, each
    change's scales of its events (change_scales', NaN: none); gaps_scales: each change's. Each
    step is replayed as the what_if macro replays it (one rank's window, or a step's ranks' together: _steps), its
    graph planned once for all the changes, each change walked as critical_path_walk walks it unless it cannot
    change a length (Plan.lengths), step by step in the threads that work on it (Shared: `findings` walks them
    in a thread while DuckDB runs SQL, then on both). Its result: per change (its number in gaps_scales) and
    window with a path, run_id, rank, window_name, instance and predicted_ns, the rank's path length from the
    step's earliest window start less its own start's offset. arrays: the lists' events as walk_ahead read them
    (its `keep`), not read again."""
    return Shared(_steps(lists, scales, arrays=arrays), functools.partial(_step_lengths, gaps_scales=gaps_scales),
                  lambda steps: pa.Table.from_pylist([row for rows in steps for row in rows], schema=PREDICTED_SCHEMA))


def _step_lengths(step, gaps_scales: list[float]) -> list[dict]:
    """One step of replay_lengths: its rows."""
    windows, _, ev, spans = step
    graph = _digest(spans, ev)
    start = min(row["window_ts"] for row in windows)
    rows = []
    for change, gaps in enumerate(gaps_scales):
        changed = {name: values for name, values in ev.items() if name != "change_scales"}
        changed["scale"] = ev["change_scales"][:, change]
        lengths = _without_gc(lambda: _plan(changed, spans, gaps, graph).lengths(changed["scale"], gaps))
        rows += [{"change": change, "run_id": row["run_id"], "rank": row["rank"],
                  "window_name": row["window_name"], "instance": row["instance"],
                  "predicted_ns": lengths[row["rank"]] - (row["window_ts"] - start)}
                 for row in windows if row["rank"] in lengths]
    return rows


#: replay_lengths' rows
PREDICTED_SCHEMA = pa.schema([("change", pa.int32()), ("run_id", pa.string()), ("rank", pa.int32()),
                              ("window_name", pa.string()), ("instance", pa.int32()), ("predicted_ns", pa.int64())])


class Shared:
    """Items (an iterable) worked on by whichever threads call `work`, each item by one, and the results combined
    in the items' order (`result`): `tracesql findings` walks in a thread while DuckDB runs SQL, and its main
    thread walks too once that SQL is done (two threads walk a step's graphs in 0.7 of one's time: numpy lets go
    of the interpreter's lock in its array operations)."""

    def __init__(self, items, function, combine):
        self._items, self._lock, self._done = enumerate(items), threading.Lock(), {}
        self._function, self._combine = function, combine

    def work(self) -> None:
        """Work on the items no thread took yet, one at a time, until none is left."""
        while True:
            with self._lock:
                taken = next(self._items, None)
            if taken is None:
                return
            self._done[taken[0]] = self._function(taken[1])

    def result(self):
        """combine(each item's result, in the items' order): once every thread's work returned."""
        return self._combine([self._done[i] for i in range(len(self._done))])


def walk_ahead(lists: pa.Table, keep: list | None = None) -> Shared:
    """Walk each window's HTA path and each step's unchanged replay of critical_path_event_lists' rows (`lists`,
    with their walk_key), each as the what_if macro's critical_path_walk call of it will ask (_steps), kept too
    (_WALKED, with the replays' plans, _PLANS), step by step in the threads that work on it (Shared).
    `tracesql findings` runs this in a thread while DuckDB runs the rules' first statements: the walks (Python,
    on one core) then overlap that SQL (on the other), and what_if finds them walked (walked_ahead). Its result:
    the HTA paths as step_critical_paths' rows (run_id, rank, instance, s) and the walks by the keys
    critical_path_replay_lengths and critical_path_walked_ahead find them by (_walk_key). keep: a list the
    lists' events are kept in as they are read (_rows), for replay_lengths."""
    return Shared(_steps(lists, keep=keep), _walk_step_ahead, _walked_ahead)


def _walk_step_ahead(step) -> tuple[list, dict]:
    """One step of walk_ahead: its windows' HTA paths (step_critical_paths' rows, a batch each) and its walks by
    their keys."""
    windows, window_events, ev, spans = step
    paths, walks = [], {}
    for row, one in zip(windows, window_events):
        path = _walk_one(one, None, None, _digest(None, one))
        segments = path.flatten()
        # (the window's columns repeated for its segments, in arrays; a batch of its own, not copied into one)
        count = np.zeros(len(segments), dtype=np.int32)
        paths.append(pa.RecordBatch.from_arrays(
            [pa.DictionaryArray.from_arrays(count, [row["run_id"]]), pa.array(count + row["rank"], pa.int32()),
             pa.array(count + row["instance"], pa.int32()), segments], schema=_PATHS_SCHEMA))
        walks[_walk_key([row["walk_key"]], None)] = path
    walks[_walk_key([row["walk_key"] for row in sorted(windows, key=lambda row: row["rank"])], spans)] = (
        _walk_one(ev, spans, None, _digest(spans, ev)))
    return paths, walks


def _walked_ahead(steps: list) -> tuple[pa.Table, dict]:
    """walk_ahead's result of its steps' (_walk_step_ahead's)."""
    walks = {key: walk for _, its_walks in steps for key, walk in its_walks.items()}
    walks.pop(None, None)  # (rows without a key: found by their events' digest only)
    # (the windows' batches as one table, not copied: concatenated, 0.3 s at 24x)
    return pa.Table.from_batches([path for paths, _ in steps for path in paths], schema=_PATHS_SCHEMA), walks


#: The columns of step_critical_paths (walk_ahead's paths)
_PATHS_SCHEMA = pa.schema([("run_id", pa.dictionary(pa.int32(), pa.string())), ("rank", pa.int32()),
                           ("instance", pa.int32()), ("s", SEGMENT_TYPE.value_type)])


def _steps(lists: pa.Table, scales: list[list[np.ndarray]] | None = None, arrays: list | None = None,
           keep: list | None = None):
    """Per step of critical_path_event_lists' rows (`lists`: run_id, rank, window_name, instance, step, window_ts,
    window_te, events, walk_key; scales: replay_lengths', _rows' change_scales; arrays, keep: _rows'), as the
    what_if macro replays it:
    its windows' rows (dicts but events), their events (_rows' arrays), the events of the replay (one rank's, or
    the step's ranks' together, in (rank, id) order) and its windows by rank (spans)."""
    steps: dict[tuple, list] = {}
    rows = lists.select(["run_id", "rank", "window_name", "instance", "step", "window_ts", "window_te",
                         "walk_key"]).to_pylist()
    events = _rows(lists.column("events"), scales, arrays=arrays, keep=keep)
    for row, ev in zip(rows, events):
        if ev is not None:
            step = row["instance"] if row["step"] is None else row["step"]
            steps.setdefault((row["run_id"], row["window_name"], step), []).append((row, ev))
    for windows in steps.values():
        spans = _by_rank([{"rank": row["rank"], "ts": row["window_ts"], "te": row["window_te"]} for row, _ in windows])
        ev = windows[0][1] if len(windows) == 1 else _in_order(
            {name: np.concatenate([e[name] for _, e in windows]) for name in windows[0][1]})
        yield [row for row, _ in windows], [e for _, e in windows], ev, spans


def _by_rank(spans: list | None) -> list | None:
    """The windows by rank: ties between equal paths follow the windows' order too, as the events'."""
    return None if spans is None else sorted(spans, key=lambda w: w["rank"])


def _walk_one(ev: dict, spans: list | None, gaps: float | None, graph) -> pa.Array:
    """One row of walk: its path's segments (a list of one row), kept when unchanged (_WALKED)."""
    if gaps == 1 and (np.nan_to_num(ev["scale"], nan=1.0) == 1).all():
        gaps = None  # no change: the unchanged replay (one walk for both)
    if gaps is not None:  # one what-if's own walk (each findings rule's): walked, not kept
        return _without_gc(_walk_row, ev, spans, gaps, graph)
    # the unchanged replay and HTA's path ignore the scales: every what-if's (each rule's) are one walk
    return _kept(_WALKED, WALKED_SIZE, graph.digest(), lambda: _without_gc(_walk_row, ev, spans, gaps, graph))


def _rows(events: pa.Array | pa.ChunkedArray, scales: list[list[np.ndarray]] | None = None,
          skip: list[bool] | None = None, arrays: list | None = None, keep: list | None = None):
    """Each row's events (None where NULL) as the graph's arrays (_arrays), chunk by chunk, each from a slice of
    its chunk's events (offsets index them): one column at a time, far quicker than dicts, and a run's every
    window is never in Python objects at once. (Combining the chunks first copied every event of the call: 14 % of
    findings' time at 24×.) scales (replay_lengths'): per row, each change's scales of its events, added as
    change_scales, one column per change (NaN: none), in the events' order. skip: per row, whether it is
    yielded as None, not read (its walk is found already). keep: a list each row's arrays are appended to, with
    the order they were taken in from the list (None: its own), for a later call to take as `arrays` instead of
    reading `events` again (`tracesql findings` reads its lists in walk_ahead, then in replay_lengths for each
    batch of changes: 0.45 CPU-s a read at 24x, most of it ordering the events)."""
    if arrays is not None:
        for row, (ev, order) in enumerate(arrays):
            if ev is not None and scales is not None:
                ev = ev | _reordered({"change_scales": np.column_stack(scales[row])}, order)
            yield ev
        return
    row = 0
    for chunk in events.chunks if isinstance(events, pa.ChunkedArray) else [events]:
        flat, offsets, valid = chunk.values, chunk.offsets.to_pylist(), chunk.is_valid().to_pylist()
        for i, is_valid in enumerate(valid):
            if not is_valid or (skip is not None and skip[row]):
                ev = order = None
            else:
                ev = _arrays(flat.slice(offsets[i], offsets[i + 1] - offsets[i]))
                if scales is not None:
                    ev["change_scales"] = np.column_stack(scales[row])
                order = _order_of(ev)
                ev = _reordered(ev, order)
            if keep is not None:
                keep.append((ev, order))
            yield ev
            row += 1


def _in_order(ev: dict) -> dict:
    """The events by rank, then id (_order_of)."""
    return _reordered(ev, _order_of(ev))


def _reordered(ev: dict, order: np.ndarray | None) -> dict:
    """Each of the events' columns taken in `order` (None: as they are)."""
    return ev if order is None else {name: values[order] for name, values in ev.items()}


def _order_of(ev: dict) -> np.ndarray | None:
    """The order of the events by rank, then id (None: in it already): the order the walk breaks ties between
    equal paths by, whatever order the list came in (SQL's list aggregates keep none unless told, at a cost; a
    replay's lists of several ranks come in any order of the ranks)."""
    rank, event_id = ev["rank"], ev["id"]
    later_rank = rank[1:] > rank[:-1]
    if (later_rank | ((rank[1:] == rank[:-1]) & (event_id[1:] >= event_id[:-1]))).all():
        return None
    return np.lexsort((event_id, rank))


def _walk_row(ev: dict, spans: list | None, gaps: float | None, graph) -> pa.Array:
    """One window's path (a list of one row): of the graph its walks share when a replay of it was planned (the
    replays of one step by the findings rules: their changes scale its edges), else of a new plan."""
    if spans is None:  # HTA's path: walked once per window
        return Plan(ev, spans, gaps is not None).path(ev["scale"], gaps)
    return _plan(ev, spans, gaps, graph).path(ev["scale"], gaps)


def _plan(ev: dict, spans: list, gaps: float | None, graph) -> Plan:
    """The plan of a replay: of the graph a step's replays share (kept, _PLANS), unless the what-if changes the
    graph itself (synchronisations removed, host calls that wait no more): then a graph of its own, walked once."""
    if gaps is not None and _of(ev["role"][ev["scale"] == 0], WAITING_CODES + SYNC_CODES, len(ROLES)).any():
        unchanged = _PLANS.get(graph.digest())  # (its shape is this graph's, but the syncs removed)
        return Plan(ev, spans, True, None if unchanged is None else unchanged.shape)
    return _kept(_PLANS, PLANS_SIZE, graph.digest(), lambda: Plan(ev, spans, gaps is not None))


def _kept(cache: dict, size: int, key: bytes, make):
    """cache[key], made (make()) and kept if missing, the latest used last, the least recently used dropped
    beyond `size`. `tracesql findings` walks in a thread while DuckDB's calls walk too: the cache is changed
    under a lock (two threads may make one value; the later one's is kept)."""
    with _KEEPING:
        value = cache.pop(key, None)
    if value is None:
        value = make()
    _keep(cache, size, key, value)
    return value


def _keep(cache: dict, size: int, key, value) -> None:
    """cache[key] = value, the latest used last, the least recently used dropped beyond `size` (under the lock)."""
    with _KEEPING:
        cache.pop(key, None)
        while len(cache) >= size:
            del cache[next(iter(cache))]
        cache[key] = value


def _digest(spans: list | None, ev: dict):
    """A digest (XXH3-128, to be continued) of a window's windows and events but their scales, from the graph's
    arrays (reading them into Python lists first took 3 times the walk's own time at 24×, 50 ms a window; BLAKE2b
    of the arrays took 2.5 ms a window, 0.5–0.75 CPU-s a findings rule)."""
    digest = xxhash.xxh3_128(pickle.dumps((spans, len(ev["id"]))))
    for name, _ in EVENT_FIELDS:
        if name != "scale":
            digest.update(np.ascontiguousarray(ev[name]).data)
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


#: Held while the kept walks and plans change (_kept)
_KEEPING = threading.Lock()
#: The latest unchanged walks used (the unchanged replay, HTA's path), by a digest of their input, each as its
#: Arrow row (a tenth of the memory of the segments as Python objects): a what-if whose change changes nothing
#: walks its steps' unchanged replay, and a step's HTA path asked again in a session is looked up (the findings
#: rules host_op and idle_bubbles read theirs from one walk, findings_paths: tracesql/findings.py). A changed walk is one what-if's and is not kept
#: (each rule's own N walked once: 1.2 MB each at 24x).
_WALKED: dict[bytes, pa.Array] = {}
WALKED_SIZE = 1024
#: The latest replays' plans (graph and walk order), by a digest of their graph's input: each findings rule
#: replays every step with its change, which scales the edges of the graph the unchanged replay built (~2 MB a
#: step of 25 k events; 256: twice the 24× tile's 120 steps). A change that removes synchronisations or waits
#: walks a graph of its own, once, not kept.
_PLANS: dict[bytes, Plan] = {}
PLANS_SIZE = 256
#: The unchanged walks walked ahead (walk_ahead) while `tracesql findings` holds them (walked_ahead), by the keys
#: of their events and their windows (_walk_key): what critical_path_replay_lengths finds them by
_AHEAD: dict[tuple, pa.Array] = {}


def register(con) -> None:
    """Create `critical_path_walk(events, windows, gaps_scale)`, `critical_path_replay_lengths(events, windows,
    gaps_scale, keys)`, `critical_path_walked_ahead(walk_key)` and `critical_path_event_scales(...)` on `con`; and
    warm up what the
    walks' first arrays import (_warm_up) in a thread, while the SQL before them runs."""
    if "pandas" not in sys.modules:
        threading.Thread(target=_warm_up, name="tracesql-warm-up").start()
    con.create_function("critical_path_event_scales", event_scales,
                        [_struct_sql(LISTED_FIELDS), "VARCHAR", "DOUBLE", "INTEGER", "INTEGER", "DOUBLE", "BOOLEAN"],
                        SCALES_SQL, type="arrow", side_effects=False, null_handling="special")
    con.create_function("critical_path_walk", walk, [EVENT_SQL, WINDOW_SQL, "DOUBLE"], SEGMENT_SQL,
                        type="arrow", side_effects=False, null_handling="special")
    # (side effects: what it finds changes as the walks are kept)
    con.create_function("critical_path_replay_lengths", replay_rank_lengths,
                        [EVENT_SQL, WINDOW_SQL, "DOUBLE", "UBIGINT[]"], _struct_sql(RANK_LENGTHS_FIELDS), type="arrow",
                        side_effects=True, null_handling="special")
    con.create_function("critical_path_walked_ahead", is_walked_ahead, ["UBIGINT"], "BOOLEAN",
                        type="arrow", side_effects=True, null_handling="special")


def _warm_up() -> None:
    """pyarrow's first array from Python or to NumPy imports pandas (0.25 s here): done here, in a thread, while
    DuckDB computes the windows' events (the import holds the GIL, the SQL does not), not when the first walk
    needs it. Where it fails (the process ending: no import then), the walk imports it, as it would have."""
    try:
        _code_names()
    except (ImportError, RuntimeError):  # (RuntimeError: threads may not register for the exit once it began)
        return
