"""The critical path's relaxation loop (tracesql/critical_path.py, Plan.distances) and the trace of a path back
from its end (Plan._ways), compiled where many walks pay for the compiler's start.

`relax` relaxes each edge once, in the walk's order (every edge into a node before any edge out of it), so a
node's distance is final before it is read; of equal paths the first found is kept. In Python it walks lists
(Plan._distances_in_order). `tracesql findings` walks every step a dozen times: it loads the same function
compiled by numba (`load`, in a thread while DuckDB computes the steps' events), and every walk then takes it
(`compiled`): ~0.1 ms a step of the 24x tile (~50 k edges) against 5 ms in arrays and Python. Whole-number
weights are summed as int64, others as doubles in the same order as in Python: the results are the same, bit
for bit. Other commands do not load it: importing numba and reading the compiled code from its disk cache
takes ~0.4 s, a fifth of a one-step critical path.
"""

from __future__ import annotations

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


def load() -> None:
    """Compile `relax` and `trace` with numba (or read them from numba's cache on disk) for the arguments the
    walks give (weights in int64 and float64) and make them `compiled`'s. Without numba, or where it cannot
    compile (no compiler for the platform, no cache it may write), nothing: the walks stay in Python, as fast as
    any other command's."""
    global _compiled, _compiled_trace
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
    except Exception:  # (ImportError, numba's errors: an accelerator, not a result)
        return
    _compiled, _compiled_trace = compiled, compiled_trace


def compiled():
    """`relax` compiled, once `load` has loaded it; else None."""
    return _compiled


def compiled_trace():
    """`trace` compiled, once `load` has loaded it; else None."""
    return _compiled_trace


_compiled = _compiled_trace = None
