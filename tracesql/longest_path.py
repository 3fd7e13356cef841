"""The critical path's relaxation loop (tracesql/critical_path.py, Plan.distances), the trace of a path back from
its end (Plan._ways), two loops of the graph's build (the host's edges, _nesting; the walk's order where edges
lead back, _taken) and the weights of a priced change (Plan.lengths), compiled where many walks pay for the
compiler's start.

`relax` relaxes each edge once, in the walk's order (every edge into a node before any edge out of it), so a
node's distance is final before it is read; of equal paths the first found is kept. In Python it walks lists
(Plan._distances_in_order). `tracesql findings` walks every step a dozen times: it loads the same function
compiled by numba (`load`, in a thread while DuckDB computes the steps' events), and every walk then takes it
(`compiled`): ~0.1 ms a step of the 24x tile (~50 k edges) against 5 ms in arrays and Python. Whole-number
weights are summed as int64, others as doubles in the same order as in Python: the results are the same, bit
for bit. `nest` and `kahn` are loops where critical_path works in arrays (and in Python for the few threads
whose events do not nest, and the stretches where edges lead back): the same edges and order, ~4 and ~1 ms less a
graph of the 24x tile (tests compare them on real and random graphs); `weigh` the weights of a priced change and
what Plan.lengths checks of them, in one pass (~0.9 ms less a change of a step there). Other commands do not load
them: importing numba and reading the compiled code from its disk cache takes ~0.5 s, a fifth of a one-step
critical path.
"""

from __future__ import annotations

import threading

import numpy as np


def relax(src, dst, weight, dist, via) -> None:
    """dist and via (per node: the longest path's length to it, and the edge it came by, -1: none yet) after
    relaxing each edge (its source and destination node and weight; numbered in the walk's order) in turn."""
    for edge in range(len(src)):
        node = dst[edge]
        reached = dist[src[edge]] + weight[edge]
        if via[node] < 0 or reached > dist[node]:
            dist[node] = reached
            via[node] = edge


def trace(via, src, end, edges) -> int:
    """The edges of the path to node `end` (each node's edge to it: via, -1 for none; each edge's source: src),
    from its last back to its first, into `edges`; how many. (Plan._ways lists them in arrays where this is not
    compiled: a path of ~25 k edges, 2 ms there, 0.05 ms compiled.)"""
    count = 0
    node = end
    while via[node] >= 0:
        edges[count] = via[node]
        node = src[via[node]]
        count += 1
    return count


def kahn(nodes, position, src, dst, stops, taken) -> int:
    """Kahn's order of the graph's nodes into `taken`, as critical_path._taken takes them (of the nodes ready, the
    earliest in `nodes`, the nodes by time and number; position: each node's place there; stops: the places, in
    order, of the nodes an edge leads back to), node by node; how many it took. Up to the next stop every node is
    taken in turn; from there, a node waits while a source of it from the stretch's start on is not taken, and is
    taken once its last one is, before any later node (a heap of places); once none waits, again up to the next
    stop. (critical_path._taken takes the slices between the stretches in arrays and the stretches in Python:
    2 ms a graph of the 24x tile, ~0.1 ms here.)"""
    n, m = len(nodes), len(src)
    first_in, first_out = np.zeros(n + 1, dtype=np.int64), np.zeros(n + 1, dtype=np.int64)
    for e in range(m):
        first_in[dst[e] + 1] += 1
        first_out[src[e] + 1] += 1
    for v in range(n):
        first_in[v + 1] += first_in[v]
        first_out[v + 1] += first_out[v]
    sources, targets = np.empty(m, dtype=np.int64), np.empty(m, dtype=np.int64)
    into, out = first_in[:-1].copy(), first_out[:-1].copy()
    for e in range(m):
        sources[into[dst[e]]] = src[e]
        into[dst[e]] += 1
        targets[out[src[e]]] = dst[e]
        out[src[e]] += 1
    is_taken = np.zeros(n, dtype=np.bool_)
    missing = np.zeros(n, dtype=np.int64)  # of a node waiting in this stretch, its sources not taken
    waits_in = np.full(n, -1, dtype=np.int64)  # the stretch a node waits in (-1: none)
    ready = np.empty(n, dtype=np.int64)  # a heap of the places of the nodes no longer waiting
    count = cursor = 0
    for k in range(len(stops) + 1):
        stop = stops[k] if k < len(stops) else n
        if stop < cursor:
            continue
        while cursor < stop:  # every node before the stop ready in its turn
            taken[count] = nodes[cursor]
            is_taken[nodes[cursor]] = True
            count += 1
            cursor += 1
        if cursor >= n:
            break
        stretch, waiting, size = cursor, 0, 0
        while True:
            v = -1
            while cursor < n and size == 0:  # the next node in turn, unless a node no longer waiting is earlier
                c = nodes[cursor]
                cursor += 1
                its = 0
                for i in range(first_in[c], first_in[c + 1]):
                    if position[sources[i]] >= stretch and not is_taken[sources[i]]:
                        its += 1
                if its == 0:
                    v = c
                    break
                missing[c], waits_in[c] = its, stretch
                waiting += 1
            if v < 0 and size > 0:  # the earliest no longer waiting, its place taken by the heap's last
                v = nodes[ready[0]]
                size -= 1
                last, i = ready[size], 0
                while 2 * i + 1 < size:
                    child = 2 * i + 1
                    if child + 1 < size and ready[child + 1] < ready[child]:
                        child += 1
                    if ready[child] >= last:
                        break
                    ready[i] = ready[child]
                    i = child
                ready[i] = last
            elif v < 0:
                break  # (the rest wait on a cycle)
            taken[count] = v
            is_taken[v] = True
            count += 1
            for i in range(first_out[v], first_out[v + 1]):
                b = targets[i]
                if waits_in[b] == stretch and missing[b] > 0:
                    missing[b] -= 1
                    if missing[b] == 0:  # no longer waiting: onto the heap
                        waiting -= 1
                        i = size
                        while i > 0 and ready[(i - 1) // 2] > position[b]:
                            ready[i] = ready[(i - 1) // 2]
                            i = (i - 1) // 2
                        ready[i] = position[b]
                        size += 1
            if waiting == 0 and size == 0:
                break
    return count


def nest(host, thread, ts, ends, is_op, start, end, op_edge, dependency_edge, parent, stack, edges) -> int:
    """The host's edges, thread by thread, each thread's events walked as a stack (`host`: the host events' rows in
    nesting order, by thread, then start, the longer first; thread, ts, ends, is_op, start and end: per event
    row), into the columns of `edges` (src, dst, kind, owner; whether the edge enters an op, whether it is a
    dependency, the event whose node it reaches; its thread: critical_path._nesting's); how many. parent and
    stack: room for a row each. The ops are entered and left: each op's pieces (its start to the start of its
    first child op, one child's end to the next child's start, the last child's end to its end; a piece belongs
    to the op it lies in, between two children to their enclosing range, an op or an annotation), and the end of
    one top-level op to the start of the next (a dependency, their range's). critical_path._nesting runs it in
    Python for the few threads whose events do not nest and does the others in arrays; compiled (`tracesql
    findings`), it walks every thread: 4 ms a graph of the 24x tile in arrays, ~0.2 ms here."""
    src, dst, kind, owner, enters, dependency, reached, edge_thread = edges
    count, k, n = 0, 0, len(host)
    while k < n:
        its_thread = thread[host[k]]
        j = k
        while j < n and thread[host[j]] == its_thread:
            j += 1
        size = depth = 0
        # the node last entered or left (-1: none, at the top level), the end of the last top-level op, its
        # event, the enclosing range of the op last entered or left
        last = last_top = last_event = enclosing = -1
        last_started = False
        for q in range(k, j + 1):
            i = host[q] if q < j else -1  # (a last row of none leaves every op)
            while size > 0 and (i < 0 or ends[stack[size - 1]] <= ts[i]):
                size -= 1
                done = stack[size]
                if not is_op[done]:
                    continue
                depth -= 1
                if last >= 0:  # leaving an op: the piece up to its end
                    src[count], dst[count], kind[count] = last, end[done], op_edge
                    owner[count] = last_event if last_started else done
                    enters[count], dependency[count] = False, False
                    reached[count], edge_thread[count] = done, its_thread
                    count += 1
                if depth == 0:
                    last, last_top = -1, end[done]
                else:
                    last, last_event, last_started, enclosing = end[done], done, False, parent[done]
            if i < 0:
                break
            parent[i] = stack[size - 1] if size > 0 else -1
            stack[size] = i
            size += 1
            if not is_op[i]:
                continue
            if depth == 0 and last_top >= 0:  # the host time between two top-level ops: their range's
                src[count], dst[count], kind[count], owner[count] = last_top, start[i], dependency_edge, parent[i]
                enters[count], dependency[count], reached[count], edge_thread[count] = True, True, i, its_thread
                count += 1
            depth += 1
            if last >= 0:  # the piece from the last node
                src[count], dst[count], kind[count] = last, start[i], op_edge
                owner[count] = last_event if last_started else enclosing
                enters[count], dependency[count], reached[count], edge_thread[count] = True, False, i, its_thread
                count += 1
            last, last_event, last_started, enclosing = start[i], i, True, parent[i]
        k = j
    return count


def weigh(time, kind, owner, held, scale, gaps_scale, scaled_kinds, gap_kinds, weight):
    """The replay's weight of each edge into `weight` (critical_path.Plan.weights: an edge that held its node up
    weighs its time, a gap's scaled by gaps_scale, an event's piece's by its owner's scale; any other edge 0), and
    whether every weight is a whole number and none is above the edge's unchanged weight (its time where it held
    its node up, else 0), and the sum of their magnitudes: what Plan.lengths decides by, in one pass (in arrays:
    two sets of weights and four passes over them, 0.6 ms a graph of the 24x tile; ~0.1 ms here)."""
    whole, none_longer, total = True, True, 0.0
    for e in range(len(time)):
        unchanged = float(time[e]) if held[e] else 0.0
        w = unchanged
        if held[e]:
            if gap_kinds[kind[e]]:
                w = unchanged * gaps_scale
            elif scaled_kinds[kind[e]]:
                w = unchanged * scale[owner[e]]
        weight[e] = w
        if w > unchanged:
            none_longer = False
        if w != np.floor(w):
            whole = False
        total += abs(w)
    return whole, none_longer, total


def load() -> None:
    """Compile `relax`, `trace`, `kahn`, `nest` and `weigh` with numba (or read them from numba's cache on disk)
    for the arguments the walks give (weights in int64 and float64) and make them `compiled`'s, `compiled_trace`'s,
    and so on. Without numba, or where it cannot compile (no compiler for the platform, no cache it may write),
    nothing: the walks stay in Python, as fast as any other command's."""
    with _LOADING:  # (the CLI starts loading before it connects; `findings` waits for it then)
        _load()


def _load() -> None:
    global _compiled, _compiled_trace, _compiled_kahn, _compiled_nest, _compiled_weigh
    if _compiled is not None:  # (a second `findings` in the process: loaded)
        return
    try:
        import numba

        compiled = numba.njit(cache=True, nogil=True)(relax)
        nodes = np.zeros(1, dtype=np.int32)
        for dtype in (np.int64, np.float64):
            compiled(nodes, nodes, np.zeros(1, dtype=dtype), np.zeros(1, dtype=dtype), np.full(1, -1, dtype=np.int64))
        compiled_trace = numba.njit(cache=True, nogil=True)(trace)
        compiled_trace(np.full(1, -1, dtype=np.int64), nodes, 0, np.zeros(1, dtype=np.int64))
        compiled_kahn = numba.njit(cache=True, nogil=True)(kahn)
        one = np.zeros(1, dtype=np.int64)
        compiled_kahn(one, one, one, one, one[:0], one.copy())
        compiled_nest = numba.njit(cache=True, nogil=True)(nest)
        flag = np.zeros(1, dtype=np.bool_)
        edges = tuple(one.copy() for _ in range(4)) + (flag.copy(), flag.copy(), one.copy(), one.copy())
        compiled_nest(one, one, one, one, flag, one, one, 0, 3, one.copy(), one.copy(), edges)
        compiled_weigh = numba.njit(cache=True, nogil=True)(weigh)
        compiled_weigh(one, np.zeros(1, dtype=np.int8), nodes, flag, np.ones(1), 1.0, flag, flag, np.zeros(1))
    except Exception:  # (ImportError, numba's errors: an accelerator, not a result)
        return
    _compiled, _compiled_trace, _compiled_kahn, _compiled_nest, _compiled_weigh = (
        compiled, compiled_trace, compiled_kahn, compiled_nest, compiled_weigh)


def compiled():
    """`relax` compiled, once `load` has loaded it; else None."""
    return _compiled


def compiled_nest():
    """`nest` compiled, once `load` has loaded it; else None."""
    return _compiled_nest


def compiled_kahn():
    """`kahn` compiled, once `load` has loaded it; else None."""
    return _compiled_kahn


def compiled_trace():
    """`trace` compiled, once `load` has loaded it; else None."""
    return _compiled_trace


def compiled_weigh():
    """`weigh` compiled, once `load` has loaded it; else None."""
    return _compiled_weigh


_compiled = _compiled_trace = _compiled_kahn = _compiled_nest = _compiled_weigh = None
#: Held while `load` loads
_LOADING = threading.Lock()
