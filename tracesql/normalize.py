"""What every source needs after reading: nesting, CPU->device links, steps, and the derived tables.

Input: a reader's TraceData for one file, or those of a batch of small files (archive members, one rank each),
normalized together: every statement runs once over the batch, each rank apart (`rank` is in every key, partition
and join), which a tiny trace needs since planning a statement costs more than its rows. Output: every table of
`schema.TABLES`, as Arrow, for those ranks.
Memory does not grow with the trace: the links are computed by DuckDB under the memory limit (in a scratch
database file for big traces, spilling beyond the limit) and by one streamed Python pass that nests the events
of each track with a stack; what they produce goes to memory-mapped scratch files, like the reader's slices.
"""

from __future__ import annotations

import json
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import db, functions, limits, quality, schema, step_rules
from .arrays import array, strings, to_numpy
from .db import sql_list
from .readers import FileMapping, TraceData
from .readers.graph_capture import GRAPH_OPS_SCHEMA
from .schema import DEVICE_TIME_KINDS, LAUNCH_KINDS  # noqa: F401  (also normalize.X)

DEVICE_WORK_KINDS = ("kernel", "memcpy", "memset", "gpu_annotation", "sync")
SELF_TIME_CHILD_KINDS = ("cpu_op", "user_annotation")
NEST_BATCH = 1 << 16
SCAN_BATCH = 1 << 17
ON_DISK_ROWS = 1 << 21  # traces with more slices link in a scratch database file instead of in memory


def normalize(data: TraceData, run_id: str, rank: int, on_table, threads: int = 1,
              step_pattern: str | None = None) -> dict[str, int]:
    """Every table for one file, handed to `on_table(name, rows) -> row count` as soon as it is defined, to be
    written: `rows` is an Arrow table (the slices: memory-mapped), or, for the large derived tables, a DuckDB
    relation to stream to disk. Returns the row count of each table. `step_pattern`: the user's regular
    expression for step ranges (see step_rules)."""
    return normalize_batch([data], run_id, [rank], on_table, threads, step_pattern)


def normalize_batch(traces: list[TraceData], run_id: str, ranks: list[int], on_table, threads: int = 1,
                    step_pattern: str | None = None) -> dict[str, int]:
    """normalize for several traces (rank `ranks[i]` each, all different) at once: each table of them all is
    handed to `on_table` once, their rows ordered by rank. The pages of the scratch files normalize maps are shed
    with the first trace's (`traces[0].mappings`); a trace's step notes go to its `notes`."""
    slices = _with_ranks([data.slices for data in traces], ranks)
    graph_ops = [(data.graph_ops, rank) for data, rank in zip(traces, ranks) if data.graph_ops is not None]
    with tempfile.TemporaryDirectory(prefix="tracesql-link-") as scratch:
        scratch = Path(scratch)
        on_disk = slices.num_rows > ON_DISK_ROWS
        with db.for_trace(threads, limits.current().memory, scratch / "link.duckdb" if on_disk else None) as con:
            # queries that do not wait for each other run on a second thread (on a cursor): both cores work
            with ThreadPoolExecutor(1, thread_name_prefix="tracesql-normalize") as beside:
                con.register("read_slices", slices)
                con.register("graph_ops", _with_ranks(*zip(*graph_ops)) if graph_ops else
                             _with_ranks([GRAPH_OPS_SCHEMA.empty_table()], [0]))
                links, checks, extra = _link(con, beside, slices, scratch, run_id, traces[0].mappings, step_pattern,
                                             {rank: data.notes for data, rank in zip(traces, ranks)})
                for name in links.column_names:
                    slices = slices.append_column(name, links[name])
                checks = [quality.skipped_rows(data.skipped, data.examples) + checks.get(rank, [])
                          for data, rank in zip(traces, ranks)]
                return _derive(con, beside, extra, slices, checks, traces, run_id, ranks, on_table)


def _with_ranks(tables: list[pa.Table], ranks: list[int]) -> pa.Table:
    """`tables` (of one schema) with a column `rank` (table i's rows: ranks[i]), one after another."""
    ranked = [t.append_column("rank", array(np.full(t.num_rows, rank, np.int32))) for t, rank in zip(tables, ranks)]
    return ranked[0] if len(ranked) == 1 else pa.concat_tables(ranked)


def _link(con, beside: ThreadPoolExecutor, slices: pa.Table, scratch: Path, run_id: str, mappings: list,
          step_pattern: str | None, notes: dict[int, list]) -> tuple[pa.Table, dict[int, list[dict]], Future]:
    """The columns normalize adds to the slices (parent, depth, launch, op, step and run), in the order of the
    reader's rows and memory-mapped, plus the quality checks on those links (rank -> rows), and the future (on
    `beside`) of table `extra` (per slice: op depth, self time, the device time it caused, its collective call),
    which the derived tables read. `notes`: each rank's notes."""
    step_ranges = step_rules.find(con, "read_slices", notes, step_pattern)
    con.register("step_ranges", step_ranges)  # the steps table's rows (STEPS_SQL)
    steps = step_rules.as_numpy(step_ranges)
    with_metadata = [rank for rank, in con.execute(COLLECTIVE_METADATA_SQL).fetchall()]
    is_call = (COLLECTIVE_CALL_BY_METADATA if len(with_metadata) == len(notes) else
               COLLECTIVE_CALL_BY_NAME if not with_metadata else
               f"CASE WHEN rank IN ({', '.join(map(str, with_metadata))}) THEN {COLLECTIVE_CALL_BY_METADATA} "
               f"ELSE {COLLECTIVE_CALL_BY_NAME} END")

    def kept(mapping: FileMapping) -> pa.Table:
        mappings.append(mapping)  # its pages are shed with the reader's
        return mapping.table()

    order = con.sql(NEST_ORDER_SQL.format(is_call=is_call)).to_arrow_reader(NEST_BATCH)
    with pa.ipc.new_stream(str(scratch / "op_spans.arrows"), SPAN_SCHEMA) as spans:
        nest = FileMapping.of_batches(scratch / "nest.arrows", NEST_SCHEMA, _nest(order, steps, spans.write_batch))
    views = {"read_slices": slices, "nest": kept(nest), "op_spans": kept(FileMapping(scratch / "op_spans.arrows"))}
    for name in ("nest", "op_spans"):
        con.register(name, views[name])
    con.register("slice_rows", kept(FileMapping.of_batches(scratch / "rows.arrows", ROW_SCHEMA, _row_numbers(slices))))
    con.execute(LINK_SQL)
    _classify(con)
    con.execute(XLA_EXEC_SQL)
    children = con.sql(CHILDREN_SQL).to_arrow_reader(SCAN_BATCH)
    views["child_time"] = kept(FileMapping.of_batches(scratch / "child_time.arrows", CHILD_TIME_SCHEMA,
                                                      _child_time(children)))
    extra = beside.submit(db.on_cursor, con, views, lambda cur: cur.execute(EXTRA_SQL))
    checks = quality.link_checks(con, steps)
    columns = con.sql(LINK_COLUMNS_SQL, params={"run_id": run_id}).to_arrow_reader(SCAN_BATCH)
    links = kept(FileMapping.of_batches(scratch / "links.arrows", columns.schema, columns))
    for name in ("nest", "op_spans", "slice_rows"):
        con.unregister(name)
    return links, checks, extra



def _row_numbers(slices: pa.Table):
    """(rank, slice_id, row) of each of the reader's rows, a batch at a time: the link columns line up with them."""
    offset = 0
    for batch in slices.select(["rank", "slice_id"]).to_batches():
        yield pa.record_batch([batch["rank"], batch["slice_id"], array(np.arange(offset, offset + batch.num_rows))],
                              ROW_SCHEMA)
        offset += batch.num_rows


NEST_SCHEMA = pa.schema([("rank", pa.int32()), ("slice_id", pa.int64()), ("pos", pa.int64()),
                         ("parent_id", pa.int64()), ("depth", pa.int32()), ("op_id", pa.int64()),
                         ("op_depth", pa.int32()), ("call_id", pa.int64()), ("is_call", pa.bool_()),
                         ("step", pa.int32()), ("dur", pa.int64()), ("self_time_child", pa.bool_()),
                         ("device_time", pa.bool_())])
ROW_SCHEMA = pa.schema([("rank", pa.int32()), ("slice_id", pa.int64()), ("row", pa.int64())])
SPAN_SCHEMA = pa.schema([("rank", pa.int32()), ("slice_id", pa.int64()), ("pos", pa.int64()),
                         ("end_pos", pa.int64())])


def _nest(order, steps, write_spans):
    """Nest the slices, which come in nesting order (per rank and track, by start, longest first), and yield a
    batch at a time every slice's parent, depth, innermost enclosing op (and op depth), innermost enclosing
    collective call and step by time (`steps`: step_rules.as_numpy's, by rank), at its position in this order
    (`nest`); for each op, its position and the position after the last event nested in it go to `write_spans`
    (its subtree is the positions between).

    What a stack of open events walked in this order gives (an event that starts inside the top of the stack but
    ends after it, a partial overlap from clock jitter, is not its child and closes it), computed with numpy a
    batch at a time: an event stays open until the first later event of its track that ends after it, so its
    parent is the nearest earlier event of its track that ends no earlier. The events still open at the end of a
    batch (the stack) go before the next one. Memory holds one batch and the stack."""
    open_ = {name: np.zeros(0, dtype) for name, dtype in _OPEN_DTYPES}  # the stack, bottom first
    open_track, pos = None, 0
    for batch in order:
        n = batch.num_rows
        if not n:
            continue
        m = len(open_["pos"])
        rank = to_numpy(batch["rank"])
        codes = to_numpy(pc.dictionary_encode(batch["track"]).indices, fill=-1)
        # (rank, track) numbered in the batch's order: a new number where either changes
        changed = np.r_[False, (codes[1:] != codes[:-1]) | (rank[1:] != rank[:-1])]
        # the open events' track goes on in this batch
        same = m and (int(rank[0]), batch["track"][0].as_py()) == open_track
        track = np.concatenate([np.full(m, 0 if same else -1), np.cumsum(changed)])
        rows = {"pos": np.concatenate([open_["pos"], pos + np.arange(n)]),
                **{name: np.concatenate([open_[name], to_numpy(batch[name])])
                   for name in ("rank", "slice_id", "end_ts", "is_op", "is_call")}}
        up, close, depth, op_depth = _stack_walk(track, rows["end_ts"], rows["is_op"])
        new = slice(m, m + n)
        step = _steps_at(steps, rank, to_numpy(batch["ts"]))
        sid = rows["slice_id"]
        yield pa.record_batch([
            batch["rank"], batch["slice_id"], array(rows["pos"][new]), _ids(sid, up[new]),
            array(depth[new].astype(np.int32)),
            _ids(sid, _nearest(up, rows["is_op"])[new]), array(op_depth[new].astype(np.int32)),
            _ids(sid, _nearest(up, rows["is_call"])[new]), batch["is_call"],
            array(step.astype(np.int32), pa.int32(), step < 0), batch["dur"], batch["self_time_child"],
            batch["device_time"],
        ], schema=NEST_SCHEMA)
        pos += n
        closed_ops = np.flatnonzero(rows["is_op"] & (close < m + n))
        if len(closed_ops):
            write_spans(pa.record_batch([array(rows["rank"][closed_ops]), array(sid[closed_ops]),
                                         array(rows["pos"][closed_ops]), array(rows["pos"][close[closed_ops]])],
                                        SPAN_SCHEMA))
        still = close == m + n  # open at the end of the batch: all of the last track's (the others have ended)
        open_ = {name: rows[name][still] for name, _ in _OPEN_DTYPES}
        open_track = (int(rank[n - 1]), batch["track"][n - 1].as_py())
    ops = np.flatnonzero(open_["is_op"])
    if len(ops):
        write_spans(pa.record_batch([array(open_["rank"][ops]), array(open_["slice_id"][ops]),
                                     array(open_["pos"][ops]), array(np.full(len(ops), pos))], SPAN_SCHEMA))


_OPEN_DTYPES = (("pos", np.int64), ("rank", np.int32), ("slice_id", np.int64), ("end_ts", np.int64),
                ("is_op", bool), ("is_call", bool))


def _steps_at(steps: dict, rank: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """The step (-1: none) of the events at `ts` of ranks `rank` (runs of one rank): the step range of their rank
    that their start is in (`steps`: by rank, then start)."""
    step = np.full(len(ts), -1, np.int64)
    if not len(steps["ts"]):
        return step
    runs = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1], True])
    for a, b in zip(runs[:-1], runs[1:]):
        lo, hi = np.searchsorted(steps["rank"], rank[a], "left"), np.searchsorted(steps["rank"], rank[a], "right")
        if lo == hi:
            continue
        starts, ends, numbers = steps["ts"][lo:hi], steps["end_ts"][lo:hi], steps["step"][lo:hi]
        k = np.searchsorted(starts, ts[a:b], side="right") - 1
        inside = (k >= 0) & (ts[a:b] < ends[np.maximum(k, 0)])
        step[a:b][inside] = numbers[k[inside]]
    return step


def _stack_walk(track: np.ndarray, end: np.ndarray, is_op: np.ndarray):
    """For rows sorted by track (numbers) then start, each row's parent (row, -1: none), where it closes (the row
    that closes it, or its track's end), depth and op depth: by pointer jumping, a few rounds rather than a loop
    per row."""
    n = len(end)
    at = np.arange(n)
    first = np.empty(n, bool)
    first[0], first[1:] = True, track[1:] != track[:-1]
    starts = np.flatnonzero(first)
    track_end = np.repeat(np.append(starts[1:], n), np.diff(np.append(starts, n)))
    # The parent: the nearest earlier row of the track that ends no earlier. `up` is a candidate such that every
    # row between it and the row ends earlier than the row; when the candidate ends earlier too, so do the rows
    # between it and its own candidate, so the row may jump there.
    up = at - 1
    up[first] = -1
    todo = np.flatnonzero(up >= 0)
    while len(todo):
        todo = todo[end[up[todo]] < end[todo]]
        up[todo] = up[up[todo]]
        todo = todo[up[todo] >= 0]
    # Where each row closes: the first later row of its track that ends after it, by the same jumping.
    close = at + 1
    todo = np.flatnonzero(close < track_end)
    while len(todo):
        todo = todo[end[close[todo]] <= end[todo]]
        close[todo] = close[close[todo]]
        todo = todo[close[todo] < track_end[todo]]
    # open rows before each row: the earlier rows less those closed by then (a row closes after itself)
    depth = at - np.cumsum(np.bincount(close, minlength=n + 1)[:n])
    op_depth = np.cumsum(is_op) - is_op - np.cumsum(np.bincount(close[is_op], minlength=n + 1)[:n])
    return up, close, depth, op_depth


def _nearest(parent: np.ndarray, flag: np.ndarray) -> np.ndarray:
    """Each row's nearest ancestor (by `parent`, -1: none) whose `flag` is set, or -1: by pointer jumping."""
    up = parent.copy()
    todo = np.flatnonzero(up >= 0)
    while len(todo):
        todo = todo[~flag[up[todo]]]
        up[todo] = up[up[todo]]
        todo = todo[up[todo] >= 0]
    return up


def _ids(slice_id: np.ndarray, rows: np.ndarray) -> pa.Array:
    """The slice ids of `rows` (-1: none, a null)."""
    return array(slice_id[rows], pa.int64(), rows < 0)


# Host ops that are communication calls: record_param_comms that carry collective metadata; when a trace has
# none (older PyTorch, gloo), the c10d::* ops (per rank: the ranks with metadata)
COLLECTIVE_METADATA_SQL = """
SELECT DISTINCT rank FROM read_slices
WHERE kind = 'cpu_op' AND name = 'record_param_comms' AND contains(args, '"Collective name"')
"""
COLLECTIVE_CALL_BY_METADATA = ("(kind = 'cpu_op' AND name = 'record_param_comms' "
                               "AND COALESCE(contains(args, '\"Collective name\"'), false))")
COLLECTIVE_CALL_BY_NAME = "(kind = 'cpu_op' AND starts_with(name, 'c10d::'))"
NEST_ORDER_SQL = f"""
SELECT rank, slice_id, track, ts, ts + dur AS end_ts, COALESCE(kind = 'cpu_op', false) AS is_op,
    COALESCE({{is_call}}, false) AS is_call, dur,
    COALESCE(kind IN ({sql_list(SELF_TIME_CHILD_KINDS)}), false) AS self_time_child,
    COALESCE(kind IN ({sql_list(DEVICE_TIME_KINDS)}), false) AS device_time
FROM read_slices
ORDER BY rank, track, ts, dur DESC, slice_id
"""
# Device work -> the runtime/driver call with its correlation id (the earliest such call: CUDA graphs launch
# many kernels with one call). Launched work takes its launch's op (a graph-replayed kernel: the copy of the op
# that launched it at capture time, when the reader matched its capture: graph_ops), collective call and step, and
# keeps the call's start, duration, process and thread (slices.launch_*: queries then need no join back to the call); device work
# nothing launched (XLA CPU thunks, TPU ops, launches not recorded) keeps its own op and call (by nesting).
# Its step (kernels, copies, memsets) is placed by its order on its stream (docs/concepts/steps.md): the step of the last launched work
# before it on the same device and stream (by start, then id), else that of the first launched work after it,
# unless that is the first step (work queued before the profiler started: NULL); on a stream where nothing was
# launched, the step it ran in by time (the host range enclosing its start).
LINK_SQL = f"""
CREATE OR REPLACE TABLE launchers AS
SELECT rank, correlation, min(slice_id) AS launch_id, count(*) AS calls,
    arg_min(ts, slice_id) AS launch_ts, arg_min(dur, slice_id) AS launch_dur, arg_min(pid, slice_id) AS launch_pid,
    arg_min(tid, slice_id) AS launch_tid
FROM read_slices
WHERE kind IN ({sql_list(LAUNCH_KINDS)}) AND correlation IS NOT NULL GROUP BY rank, correlation;
CREATE OR REPLACE TABLE launch AS
SELECT d.rank, d.slice_id, l.launch_id, l.launch_ts, l.launch_dur, l.launch_pid, l.launch_tid
FROM read_slices d JOIN launchers l USING (rank, correlation)
WHERE d.kind IN ({sql_list(DEVICE_WORK_KINDS)});
CREATE OR REPLACE TABLE links AS
SELECT n.rank, n.slice_id, n.pos, n.parent_id, n.depth, n.op_depth, n.is_call, n.dur, n.self_time_child,
    n.device_time, la.launch_id, la.launch_ts, la.launch_dur, la.launch_pid, la.launch_tid,
    CASE WHEN la.launch_id IS NULL THEN n.op_id ELSE COALESCE(g.op_id, h.op_id) END AS op_id,
    g.op_id AS graph_op_id,
    CASE WHEN la.launch_id IS NULL THEN n.call_id ELSE h.call_id END AS call_id,
    CASE WHEN la.launch_id IS NULL THEN n.step ELSE h.step END AS step
FROM nest n LEFT JOIN launch la USING (rank, slice_id)
LEFT JOIN nest h ON h.rank = la.rank AND h.slice_id = la.launch_id
LEFT JOIN graph_ops g ON g.rank = n.rank AND g.slice_id = n.slice_id;
-- the copies of capture ops (readers/graph_capture.py: ops with their graph launch's correlation id) are in the
-- step of that launch, as their replayed kernels are (they are timed on the device, after the host step)
UPDATE links SET step = h.step
FROM read_slices c JOIN launchers l USING (rank, correlation)
JOIN nest h ON h.rank = l.rank AND h.slice_id = l.launch_id
WHERE c.kind = 'cpu_op' AND links.rank = c.rank AND links.slice_id = c.slice_id;
CREATE OR REPLACE TABLE stream_steps AS
WITH work AS (
    SELECT d.rank, d.slice_id, d.device_id, d.stream, l.launch_id IS NOT NULL AS launched, l.step,
        row_number() OVER (PARTITION BY d.rank, d.device_id, d.stream ORDER BY d.ts, d.slice_id) AS n
    FROM read_slices d JOIN links l USING (rank, slice_id)
    WHERE d.kind IN ({sql_list(DEVICE_TIME_KINDS)})  -- work (GPU annotations are ranges around it: by time)
), around AS (
    SELECT *,  -- (n grows along the stream: the nearest launched row before or after, without a max over frames)
        last_value(CASE WHEN launched THEN n END IGNORE NULLS) OVER (PARTITION BY rank, device_id, stream ORDER BY n
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_n,
        first_value(CASE WHEN launched THEN n END IGNORE NULLS) OVER (PARTITION BY rank, device_id, stream ORDER BY n
            ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS next_n
    FROM work
), first_step AS (  -- each rank's first step (step_rules.find's ranges)
    SELECT rank, step FROM step_ranges QUALIFY row_number() OVER (PARTITION BY rank ORDER BY ts, slice_id) = 1
)
SELECT a.rank, a.slice_id,
    CASE WHEN a.prev_n IS NOT NULL THEN p.step
         WHEN a.next_n IS NOT NULL THEN CASE WHEN x.step IS NOT DISTINCT FROM f.step THEN NULL ELSE x.step END
         ELSE a.step END AS step
FROM around a
LEFT JOIN work p ON p.rank = a.rank AND p.device_id IS NOT DISTINCT FROM a.device_id
 AND p.stream IS NOT DISTINCT FROM a.stream AND p.n = a.prev_n
LEFT JOIN work x ON x.rank = a.rank AND x.device_id IS NOT DISTINCT FROM a.device_id
 AND x.stream IS NOT DISTINCT FROM a.stream AND x.n = a.next_n
LEFT JOIN first_step f ON f.rank = a.rank
WHERE NOT a.launched;
UPDATE links SET step = s.step FROM stream_steps s WHERE links.rank = s.rank AND links.slice_id = s.slice_id;
"""
LINK_COLUMNS_SQL = """
SELECT parent_id, depth, launch_id, launch_ts, launch_dur, launch_pid, launch_tid, c.class,
    COALESCE(x.op_id, l.op_id) AS op_id, step, CAST($run_id AS VARCHAR) AS run_id
FROM links l JOIN slice_rows USING (rank, slice_id) LEFT JOIN xla_exec x USING (rank, slice_id)
LEFT JOIN device_event_classes c USING (rank, slice_id) ORDER BY row
"""
# Each device event's class by the default rules (slices.class), by the macro device_activity classifies with, on
# the reader's rows (the view `slices` it reads, with no class stored yet, only while it runs)
CLASSIFY_SQL = """
CREATE OR REPLACE TABLE device_event_classes AS
SELECT s.rank, s.slice_id, c.class
FROM read_slices s
JOIN device_classes() c
  ON c.rank = s.rank AND c.kind = s.kind AND c.name_hash = hash(s.name) AND c.category IS NOT DISTINCT FROM s.category
WHERE s.kind IN ('kernel', 'memcpy', 'memset')
"""


def _classify(con) -> None:
    """Table device_event_classes (slice_id, class): the class of each device event by the default rules."""
    con.execute("CREATE OR REPLACE TEMP VIEW slices AS "
                "SELECT '' AS run_id, rank, slice_id, kind, name, category FROM read_slices")
    functions.install(con, names={"device_classes"})
    con.execute(CLASSIFY_SQL)
    con.execute("DROP VIEW slices")


# XLA ops: the slices that ran one execution of an HLO op (`args` name it: hlo_op, program_id) and the op each
# belongs to (its op_id). A TPU or CPU op event is one execution, its own op; on a GPU the host launches an op's
# kernels back to back, so consecutive launches of the same op on one thread are one execution (op_id: the
# first launch), and a kernel belongs to its launch's.
XLA_EXEC_SQL = f"""
CREATE OR REPLACE TABLE xla_exec AS
WITH named AS (
    SELECT s.rank, s.slice_id, s.kind, s.track, s.ts, l.launch_id,
        json_extract_string(s.args, '$.program_id') AS program_id, json_extract_string(s.args, '$.hlo_op') AS hlo_op
    FROM read_slices s JOIN links l USING (rank, slice_id)
    WHERE s.kind IN ('kernel', {sql_list(LAUNCH_KINDS)}) AND contains(s.args, '"hlo_op"')
), launches AS (
    SELECT rank, slice_id, program_id, hlo_op, sum(CASE WHEN same THEN 0 ELSE 1 END) OVER w2 AS run
    FROM (SELECT *, lag(program_id) OVER w IS NOT DISTINCT FROM program_id
                    AND lag(hlo_op) OVER w IS NOT DISTINCT FROM hlo_op AS same
          FROM named WHERE kind IN ({sql_list(LAUNCH_KINDS)})
          WINDOW w AS (PARTITION BY rank, track ORDER BY ts, slice_id))
    WINDOW w2 AS (PARTITION BY rank, track ORDER BY ts, slice_id ROWS UNBOUNDED PRECEDING)
), launch_ops AS (
    SELECT rank, slice_id, program_id, hlo_op,
        first_value(slice_id) OVER (PARTITION BY rank, run_key ORDER BY slice_id) AS op_id
    FROM (SELECT l.*, n.track || '/' || l.run AS run_key FROM launches l JOIN named n USING (rank, slice_id))
)
SELECT rank, slice_id, op_id, program_id, hlo_op, false AS device FROM launch_ops
UNION ALL
SELECT d.rank, d.slice_id, COALESCE(o.op_id, d.slice_id), COALESCE(o.program_id, d.program_id),
    COALESCE(o.hlo_op, d.hlo_op), true
FROM named d LEFT JOIN launch_ops o ON o.rank = d.rank AND o.slice_id = d.launch_id
WHERE d.kind = 'kernel'
UNION ALL  -- kernels whose launch names the op, though they do not
SELECT k.rank, k.slice_id, o.op_id, o.program_id, o.hlo_op, true
FROM links k JOIN launch_ops o ON o.rank = k.rank AND o.slice_id = k.launch_id
WHERE NOT EXISTS (SELECT 1 FROM named n WHERE n.rank = k.rank AND n.slice_id = k.slice_id) AND k.device_time
"""
# Ops' and annotations' children in (parent, start) order (_child_time)
CHILDREN_SQL = """
SELECT l.rank, l.parent_id, s.ts, s.ts + s.dur AS te FROM links l JOIN read_slices s USING (rank, slice_id)
WHERE l.self_time_child AND l.parent_id IS NOT NULL
ORDER BY l.rank, l.parent_id, s.ts, te, l.slice_id
"""
CHILD_TIME_SCHEMA = pa.schema([("rank", pa.int32()), ("slice_id", pa.int64()), ("ns", pa.int64())])


def _child_time(batches):
    """For the parents of ops and annotations, the time those children cover: the union of their intervals
    (siblings can overlap: a child that starts inside another and ends after it is not its child, and the
    overlapping time is the parent's only once). `batches`: the children in (rank, parent, start, end) order; each
    adds what it reaches past the latest end of its earlier siblings. Yields (rank, parent slice_id, ns) a batch at
    a time, a parent whose children span batches in a row per batch (summed by EXTRA_SQL)."""
    last_parent, reach = None, 0  # the previous batch's last (rank, parent), and the latest end of its children
    for batch in batches:
        if not batch.num_rows:
            continue
        rank, parent, ts, te = (to_numpy(batch[name]) for name in ("rank", "parent_id", "ts", "te"))
        carried = (rank[0], parent[0]) == last_parent  # prepended as a child from `reach` to `reach`: adds nothing
        if carried:
            rank, parent, ts, te = np.r_[rank[0], rank], np.r_[parent[0], parent], np.r_[reach, ts], np.r_[reach, te]
        n = len(parent)
        first = np.ones(n, bool)
        first[1:] = (parent[1:] != parent[:-1]) | (rank[1:] != rank[:-1])
        # the latest end of the earlier siblings: one running maximum over (sibling group, rank of the end)
        ends, end_rank = np.unique(te, return_inverse=True)
        key = (np.cumsum(first) << 32) | end_rank
        running = np.maximum.accumulate(key)
        earlier = ends[running[np.maximum(np.arange(n) - 1, 0)] & 0xFFFFFFFF]
        covered = np.maximum(te - np.where(first, ts, np.maximum(ts, earlier)), 0)
        starts = np.flatnonzero(first)
        yield pa.record_batch([array(rank[starts]), array(parent[starts]), array(np.add.reduceat(covered, starts))],
                              CHILD_TIME_SCHEMA)
        last_parent, reach = (rank[-1], parent[-1]), ends[running[-1] & 0xFFFFFFFF]


# Per slice: its time outside nested ops and annotations (duration minus the union of those children), and for an op the device time (and kernels) it caused
# directly and through the ops nested in it. An op's subtree is a range of positions in the nesting order, so its
# total is a difference of running sums over the positions where device work is attributed (the launch call's,
# or the work's own when nothing launched it).
EXTRA_SQL = """
CREATE OR REPLACE TABLE extra AS
WITH child AS (  -- _child_time's partial sums
    SELECT rank, slice_id, sum(ns) AS child_ns FROM child_time GROUP BY rank, slice_id
), work AS (
    SELECT rank, op_id, COALESCE(launch_id, slice_id) AS at, dur FROM links WHERE device_time AND op_id IS NOT NULL
), own AS (
    SELECT rank, op_id AS slice_id, sum(dur) AS ns, count(*) AS n FROM work GROUP BY rank, op_id
), counted_at AS (
    -- a graph-replayed kernel counts in the ops around its launch and at the copy of its capture op (so in it and
    -- the copies around it: on a track of their own, no op spans both positions)
    SELECT w.rank, w.at, w.dur FROM work w
    UNION ALL SELECT rank, graph_op_id, dur FROM links WHERE device_time AND graph_op_id IS NOT NULL
), at_pos AS (  -- (positions are the batch's: each rank's are a range of their own, NEST_ORDER_SQL)
    SELECT l.pos, sum(w.dur) AS ns, count(*) AS n
    FROM counted_at w JOIN links l ON l.rank = w.rank AND l.slice_id = w.at GROUP BY l.pos
), running AS (
    SELECT pos, sum(ns) OVER w AS ns, sum(n) OVER w AS n FROM at_pos WINDOW w AS (ORDER BY pos)
), total AS (
    SELECT sp.rank, sp.slice_id, COALESCE(a.ns, 0) - COALESCE(b.ns, 0) AS ns, COALESCE(a.n, 0) - COALESCE(b.n, 0) AS n
    -- (work at the op's own position is its own: a copy of a capture op's, counted_at)
    FROM op_spans sp ASOF LEFT JOIN running a ON sp.end_pos > a.pos ASOF LEFT JOIN running b ON sp.pos > b.pos
)
SELECT f.rank, f.slice_id, f.op_depth, f.dur - COALESCE(c.child_ns, 0) AS self_dur,
    COALESCE(o.n, 0) AS kernel_count, COALESCE(o.ns, 0) AS device_self_ns,
    COALESCE(t.n, 0) AS kernel_count_total, COALESCE(t.ns, 0) AS device_total_ns,
    f.call_id AS collective_call, f.is_call AS is_collective_call
FROM links f LEFT JOIN child c USING (rank, slice_id) LEFT JOIN own o USING (rank, slice_id)
LEFT JOIN total t USING (rank, slice_id)
"""


def _derive(con, beside: ThreadPoolExecutor, extra: Future, slices: pa.Table, checks: list[list[dict]],
            traces: list[TraceData], run_id: str, ranks: list[int], on_table):
    rows: dict[str, int] = {}
    views: dict[str, pa.Table] = {}  # the Arrow tables registered on `con`, by name

    def emit(name: str, table):
        rows[name] = on_table(name, table)
        return table

    def view(name: str, table: pa.Table) -> pa.Table:
        con.register(name, table)
        views[name] = table
        return table

    def derived(name: str, sql: str, has_input: bool = True) -> Future:
        """Table `name` computed and written on `beside`, with the views registered so far. Without `has_input`
        (none of the rows it reads exists) it is empty, written without planning its query: planning the
        collectives' query alone costs more CPU than the rest of a tiny trace's work (an archive of 5,000)."""
        if not has_input:
            done = Future()
            done.set_result(on_table(name, _empty(name)))
            return done
        return beside.submit(db.on_cursor, con, dict(views),
                             lambda cur: on_table(name, cur.sql(f"SELECT {schema.select_list(name)} FROM ({sql})")))

    slices = emit("slices", schema.conform("slices", slices))
    # in batches (zero-copy views) so that DuckDB scans them on every thread
    view("slices", pa.Table.from_batches(slices.to_batches(max_chunksize=SCAN_BATCH), slices.schema))
    late = {"memory": derived("memory", MEMORY_SQL, _any(slices["kind"], "memory"))}  # (queued after `extra`)
    if con.execute("SELECT count(*) FROM step_ranges").fetchall()[0][0]:
        view("steps", emit("steps", _table(con, "steps", STEPS_SQL)))
    else:  # no step ranges, no steps (STEPS_SQL's rows are theirs)
        view("steps", emit("steps", _empty("steps")))
    functions.install(con, names=functions.words(OPS_SQL + COLLECTIVES_SQL + MEMORY_SQL))  # only what they use
    metadata = _metadata_tables(con, traces, run_id, ranks)
    for name, table in metadata.items():
        emit(name, table)
    emit("counters", _counters(traces, run_id, ranks))
    emit("warnings", _from_rows(con, "warnings", [{"run_id": run_id, "rank": rank, "source_path": None, **c}
                                                  for rank, rows in zip(ranks, checks) for c in rows]))
    view("groups", metadata["process_groups"])  # used by the collectives query
    view("fwd_links", _fwd_links(con, traces, ranks))
    view("xla_ops", emit("xla_ops", _from_rows(con, "xla_ops", [{"run_id": run_id, "rank": rank, **r}
                                                                for data, rank in zip(traces, ranks)
                                                                for r in data.xla_ops])))
    extra.result()
    # a collective's row is a collective call's or a communication kernel's (COLLECTIVES_SQL: calls, kernel_only)
    calls = con.execute("SELECT count(*) FROM extra WHERE is_collective_call").fetchall()[0][0]
    late["collectives"] = derived("collectives", COLLECTIVES_SQL, calls > 0 or _any(slices["class"], "communication"))
    emit("ops", con.sql(f"SELECT {schema.select_list('ops')} FROM ({OPS_SQL})"))
    for name in ("collectives", "memory"):
        rows[name] = late[name].result()
    return rows


def _fwd_links(con, traces: list[TraceData], ranks: list[int]) -> pa.Table:
    """forward->backward links (rank, slice_id, fwd_slice_id): the reader's (Kineto's fwdbwd flows), else, for the
    ranks without them, from autograd sequence numbers."""
    recorded = [(data.fwd_links, rank) for data, rank in zip(traces, ranks) if data.fwd_links is not None]
    parts = [_with_ranks(*zip(*recorded)).select(["rank", "slice_id", "fwd_slice_id"])] if recorded else []
    if len(recorded) < len(ranks):
        sql = SEQUENCE_LINKS_SQL if not recorded else (
            f"SELECT * FROM ({SEQUENCE_LINKS_SQL}) WHERE rank NOT IN ({', '.join(str(r) for _, r in recorded)})")
        parts.append(con.sql(sql).to_arrow_table())
    return parts[0] if len(parts) == 1 else pa.concat_tables(parts, promote_options="permissive")


def _empty(name: str) -> pa.Table:
    """Table `name` without rows."""
    return pa.Table.from_batches([], schema.arrow_schema(name))


def _any(column: pa.ChunkedArray, value: str) -> bool:
    """Whether `column` holds `value`."""
    return pc.any(pc.equal(column, value)).as_py() or False


# A backward op (Fwd thread id > 0; not the autograd engine's evaluate_function wrapper, which carries the same
# numbers) differentiates the forward op of its process with the same autograd sequence number: among those, the
# latest to start before it, the innermost when several start together. This is the rule PyTorch's profiler
# follows when it writes the fwdbwd flows (profiler_kineto.cpp, generateForwardBackwardLink): on traces that have
# the flows it gives the same links, and it links traces written without them.
SEQUENCE_LINKS_SQL = """
WITH cpu AS (
    SELECT rank, slice_id, name, pid, ts, dur,
        TRY_CAST(json_extract_string(args, '$."Sequence number"') AS BIGINT) AS seq,
        TRY_CAST(json_extract_string(args, '$."Fwd thread id"') AS BIGINT) AS fwd_tid
    FROM slices WHERE kind = 'cpu_op' AND contains(CAST(args AS VARCHAR), '"Sequence number"')
), bwd AS (
    SELECT * FROM cpu WHERE fwd_tid > 0 AND NOT starts_with(name, 'autograd::engine::evaluate_function: ')
), fwd AS (
    SELECT * FROM cpu WHERE seq >= 0 AND COALESCE(fwd_tid, 0) = 0
)
SELECT b.rank, b.slice_id, arg_max(f.slice_id, [f.ts, -f.dur]) AS fwd_slice_id
FROM bwd b JOIN fwd f ON f.rank = b.rank AND f.seq = b.seq AND f.pid = b.pid AND f.ts <= b.ts
GROUP BY b.rank, b.slice_id
"""


def _table(con, name: str, sql: str, params: dict | None = None) -> pa.Table:
    """The result of `sql` as table `name`, streamed batch by batch (DuckDB never holds all of it at once)."""
    select = f"SELECT {schema.select_list(name)} FROM ({sql})"
    reader = con.sql(select, params=params).to_arrow_reader(SCAN_BATCH)
    return schema.conform(name, pa.Table.from_batches(list(reader), reader.schema))


OPS_SQL = f"""
SELECT s.run_id, s.rank, s.slice_id AS op_id, s.name, s.ts, s.dur, x.self_dur, s.pid, s.tid,
    s.op_id AS parent_op_id, x.op_depth, s.step, s.external_id,
    TRY_CAST(s.a[1] ->> '$' AS BIGINT) AS sequence_number, TRY_CAST(s.a[2] ->> '$' AS BIGINT) AS fwd_thread_id,
    fl.fwd_slice_id AS fwd_op_id,
    list_transform(TRY_CAST(s.a[3] AS JSON[]), lambda d: TRY_CAST(d AS BIGINT[])) AS input_dims,
    TRY_CAST(s.a[4] AS VARCHAR[]) AS input_types,
    list_transform(TRY_CAST(s.a[5] AS JSON[]), lambda d: TRY_CAST(d AS BIGINT[])) AS input_strides,
    TRY_CAST(s.a[6] AS VARCHAR[]) AS concrete_inputs,
    TRY_CAST(s.a[7] ->> '$' AS DOUBLE) AS flops,
    NULL AS bytes_accessed, NULL AS program_id,
    x.kernel_count, x.device_self_ns, x.kernel_count_total, x.device_total_ns
FROM (  -- the op's args fields, from one parse of them
    SELECT *, json_extract(args, ['$."Sequence number"', '$."Fwd thread id"', '$."Input Dims"', '$."Input type"',
                                  '$."Input Strides"', '$."Concrete Inputs"', '$.flops']) AS a
    FROM slices WHERE kind = 'cpu_op'
) s
JOIN extra x USING (rank, slice_id)  -- (an op's own op_id is the op enclosing it)
LEFT JOIN fwd_links fl ON fl.rank = s.rank AND fl.slice_id = s.slice_id
UNION ALL BY NAME
-- XLA ops: one row per execution (xla_exec), with its HLO op's operands and costs from xla_ops
SELECT s.run_id, s.rank, e.op_id, e.name, e.ts, e.dur, e.dur AS self_dur, s.pid, s.tid, NULL AS parent_op_id,
    0 AS op_depth, s.step, e.program_id, x.operand_dims AS input_dims, x.operand_types AS input_types,
    x.flops, x.bytes_accessed, e.kernel_count, e.device_ns AS device_self_ns, e.kernel_count AS kernel_count_total,
    e.device_ns AS device_total_ns
FROM (
    SELECT x.rank, x.op_id, any_value(x.hlo_op) AS name, any_value(x.program_id) AS program_id,
        -- the op's span: its launches' on a GPU, else the op event's own
        COALESCE(min(s.ts) FILTER (WHERE NOT x.device), min(s.ts)) AS ts,
        COALESCE(max(s.ts + s.dur) FILTER (WHERE NOT x.device), max(s.ts + s.dur))
            - COALESCE(min(s.ts) FILTER (WHERE NOT x.device), min(s.ts)) AS dur,
        count(*) FILTER (WHERE s.kind IN ({sql_list(DEVICE_TIME_KINDS)})) AS kernel_count,
        -- (a TPU op's slice lasts what its device measured, as XProf counts it: readers/xplane.py)
        COALESCE(sum(s.dur) FILTER (WHERE s.kind IN ({sql_list(DEVICE_TIME_KINDS)})), 0) AS device_ns
    FROM xla_exec x JOIN slices s USING (rank, slice_id) GROUP BY x.rank, x.op_id
) e
JOIN slices s ON s.rank = e.rank AND s.slice_id = e.op_id
LEFT JOIN xla_ops x ON x.rank = e.rank AND x.program_id = e.program_id AND x.name = e.name
ORDER BY rank, op_id
"""

# Host calls carry group and size; the kernels carry device time (and, in newer traces, the same metadata).
COLLECTIVES_SQL = """
WITH comm_kernels AS (
    SELECT a.*, x.collective_call
    FROM device_activity() a JOIN extra x USING (rank, slice_id)
    WHERE a.class = 'communication'
), per_call AS (
    SELECT rank, collective_call, count(*) AS kernel_count, any_value(device_id) AS device_id,
        arg_min(stream, (ts, slice_id)) AS stream, min(ts) AS device_ts, max(ts + dur) - min(ts) AS device_dur,
        sum(dur) AS kernel_dur,
        -- what the kernels say of the call, for host calls that record none (c10d ops; torch_npu's HCCL ops)
        min(json_extract_string(args, '$.dtype')) AS kernel_dtype,
        max(TRY_CAST(json_extract_string(args, '$."In msg nelems"') AS BIGINT)) AS kernel_in_nelems,
        max(TRY_CAST(json_extract_string(args, '$."Out msg nelems"') AS BIGINT)) AS kernel_out_nelems,
        min(json_extract_string(args, '$."Process Group Name"')) AS kernel_pg_name
    FROM comm_kernels WHERE collective_call IS NOT NULL GROUP BY rank, collective_call
), calls AS (
    SELECT s.run_id, s.rank, s.slice_id AS collective_id, s.args, s.step, s.ts AS cpu_ts, s.dur AS cpu_dur, s.tid,
        -- (with x in it, the filter on the name below runs after the join: not on every slice's args)
        CASE WHEN x.is_collective_call THEN COALESCE(json_extract_string(s.args, '$."Collective name"'), s.name)
        END AS source_name,
        k.kernel_count, k.device_id, k.stream, k.device_ts, k.device_dur, k.kernel_dur, k.kernel_dtype,
        k.kernel_in_nelems, k.kernel_out_nelems, k.kernel_pg_name
    FROM slices s JOIN extra x USING (rank, slice_id)
    LEFT JOIN per_call k ON k.rank = s.rank AND k.collective_call = s.slice_id
    WHERE x.is_collective_call
), annotated AS (
    -- a c10d call of a TensorList (gloo's send/recv_) records no dtype; the backend's transfer annotation that
    -- starts inside it on its thread (gloo:send, gloo:recv) records the tensor's
    SELECT c.rank, c.collective_id, min(json_extract_string(a.args, '$."Input type"[0]')) AS annotation_dtype
    FROM calls c JOIN slices a ON a.rank = c.rank AND a.tid = c.tid AND a.kind = 'user_annotation'
     AND a.ts >= c.cpu_ts AND a.ts <= c.cpu_ts + c.cpu_dur
    WHERE c.kernel_count IS NULL AND json_extract_string(c.args, '$."Input type"[0]') = 'TensorList'
      AND collective_kind(a.name) = collective_kind(c.source_name)
    GROUP BY c.rank, c.collective_id
), kernel_only AS (
    -- XLA collectives take size, type and groups from their HLO op: the replica group holding the device
    SELECT c.run_id, c.rank, c.slice_id AS collective_id, c.args, c.step, NULL AS cpu_ts, NULL AS cpu_dur,
        COALESCE(json_extract_string(c.args, '$."Collective name"'), c.name) AS source_name,
        1 AS kernel_count, c.device_id, c.stream, c.ts AS device_ts, c.dur AS device_dur, c.dur AS kernel_dur,
        x.collective AS xla_collective, x.collective_dtype AS xla_dtype, x.collective_in_elems AS xla_in,
        x.collective_out_elems AS xla_out, x.group_size AS xla_group_size,
        COALESCE(list_filter(x.replica_groups, lambda g: list_contains(g, c.device_id))[1], x.replica_groups[1])
            AS xla_group
    FROM comm_kernels c LEFT JOIN xla_exec e USING (rank, slice_id)
    LEFT JOIN xla_ops x ON x.rank = c.rank AND x.program_id = e.program_id AND x.name = e.hlo_op
    WHERE c.collective_call IS NULL
      AND NOT regexp_matches(COALESCE(e.hlo_op, ''), '-done([.]\\d+)?$')  -- the wait of an async collective
), rows AS (
    SELECT *,
        COALESCE(json_extract_string(args, '$."Process Group Name"'), kernel_pg_name,
                 'xla ' || CAST(xla_group AS VARCHAR)) AS pg_name,
        json_extract_string(args, '$."Process Group Description"') AS pg_desc,
        COALESCE(TRY_CAST(json_extract_string(args, '$."Group size"') AS INTEGER), xla_group_size) AS group_size,
        COALESCE(TRY_CAST(json_extract_string(args, '$."Process Group Ranks"') AS INTEGER[]), xla_group)
            AS group_ranks,
        COALESCE(xla_dtype, json_extract_string(args, '$.dtype'),
                 list_filter(TRY_CAST(json_extract(args, '$."Input type"') AS VARCHAR[]),
                             lambda t: dtype_bytes(t) IS NOT NULL)[1], kernel_dtype, annotation_dtype) AS dtype,
        -- without metadata the message is the op's input tensor: the second one of c10d's *_base_ ops
        -- (output, input), the first otherwise
        COALESCE(xla_in, TRY_CAST(json_extract_string(args, '$."In msg nelems"') AS BIGINT), kernel_in_nelems,
                 tensor_numel(json_extract(args, '$."Input Dims"'),
                              CASE WHEN contains(source_name, '_base_') THEN 2 ELSE 1 END)) AS in_nelems,
        COALESCE(xla_out, TRY_CAST(json_extract_string(args, '$."Out msg nelems"') AS BIGINT), kernel_out_nelems)
            AS out_nelems,
        TRY_CAST(COALESCE(json_extract_string(args, '$.Seq'), json_extract_string(args, '$.seq')) AS BIGINT)
            AS recorded_seq,
        -- a point-to-point call's peer: Kineto's global 'Dst Rank' / 'Src Rank', else its rank within the group
        -- (record_param_comms' 'Rank' of a send or recv; c10d::send / recv_'s third argument, dstRank / srcRank)
        CASE collective_kind(source_name)
            WHEN 'send' THEN TRY_CAST(json_extract_string(args, '$."Dst Rank"') AS INTEGER)
            WHEN 'recv' THEN TRY_CAST(json_extract_string(args, '$."Src Rank"') AS INTEGER)
        END AS recorded_peer,
        CASE WHEN collective_kind(source_name) IN ('send', 'recv')
             THEN COALESCE(TRY_CAST(json_extract_string(args, '$.Rank') AS INTEGER),
                           TRY_CAST(json_extract_string(args, '$."Concrete Inputs"[2]') AS INTEGER))
        END AS peer_group_rank
    FROM (SELECT * FROM calls LEFT JOIN annotated USING (rank, collective_id)
          UNION ALL BY NAME SELECT * FROM kernel_only)
    WHERE source_name <> 'wait'  -- work.wait() is recorded like a collective but moves no data
), only_group AS (  -- a rank in a single process group: calls that name none ran on it
    SELECT rank, any_value(pg_name) AS pg_name, any_value(pg_desc) AS pg_desc, any_value(group_size) AS group_size,
        any_value(group_ranks) AS group_ranks
    FROM groups GROUP BY rank HAVING count(*) = 1
), host_calls AS (  -- whether the rank issues its collectives from the host (else: XLA's SPMD device ops)
    SELECT rank, count(*) FILTER (WHERE cpu_ts IS NOT NULL) > 0 AS any_host FROM rows GROUP BY rank
)
SELECT r.* REPLACE (COALESCE(r.pg_name, g.pg_name) AS pg_name, COALESCE(r.pg_desc, g.pg_desc) AS pg_desc,
                    COALESCE(r.group_size, g.group_size) AS group_size,
                    COALESCE(r.group_ranks, g.group_ranks) AS group_ranks),
    COALESCE(r.xla_collective, collective_kind(r.source_name)) AS collective, dtype_bytes(r.dtype) AS dtype_bytes,
    CASE WHEN COALESCE(r.xla_collective, collective_kind(r.source_name)) = 'all_gather'
         THEN COALESCE(r.out_nelems, r.in_nelems * COALESCE(r.group_size, g.group_size))
         ELSE r.in_nelems END * dtype_bytes(r.dtype) AS size_bytes,
    r.recorded_seq IS NOT NULL AS seq_recorded,
    -- the peer's group rank made global by the group's ranks; on the default group (no group recorded, or the
    -- whole world) the group rank is the global one
    COALESCE(r.recorded_peer, COALESCE(r.group_ranks, g.group_ranks)[r.peer_group_rank + 1],
             CASE WHEN COALESCE(r.group_ranks, g.group_ranks) IS NULL THEN r.peer_group_rank END) AS peer,
    -- numbered per group and class (collective_match_class: point-to-point calls apart from each collective);
    -- on a rank whose collectives no host call issues (XLA's SPMD ops, one set per device) per device too, and
    -- where host calls exist, the kernels none of them launched in the same count (else two counts collide)
    COALESCE(r.recorded_seq, row_number() OVER (PARTITION BY r.rank, COALESCE(r.pg_name, g.pg_name, ''),
                                                             collective_match_class(COALESCE(
                                                                 r.xla_collective, collective_kind(r.source_name))),
                                                             CASE WHEN r.cpu_ts IS NULL AND NOT h.any_host
                                                                  THEN r.device_id END
                                                ORDER BY COALESCE(r.cpu_ts, r.device_ts), r.collective_id) - 1) AS seq
FROM rows r LEFT JOIN only_group g ON g.rank = r.rank JOIN host_calls h ON h.rank = r.rank
ORDER BY r.rank, COALESCE(r.cpu_ts, r.device_ts), r.collective_id
"""


def _with_arg_strings(rows: str, fields: dict[str, str]) -> str:
    """`rows` (a FROM clause) with a column per field (column -> JSON path in `args`) holding what
    json_extract_string(args, path) gives, from one parse of `args` (a call per path parses it once per path)."""
    paths = ", ".join(f"'{path}'" for path in fields.values())
    items = ", ".join(f"arg_strings[{i}] AS {column}" for i, column in enumerate(fields, 1))
    return f"(SELECT *, {items} FROM (SELECT *, json_extract_string(args, [{paths}]) AS arg_strings FROM {rows}))"


MEMORY_ARGS = {"allocator": "$.allocator_name", "allocation_bytes": "$.allocation_bytes",
               "device_type_arg": '$."Device Type"', "device_id_arg": '$."Device Id"',
               "index_on_host": "$.index_on_host", "addr_upper": "$.Addr", "addr_lower": "$.addr",
               "bytes_arg": "$.Bytes", "total_allocated": '$."Total Allocated"', "bytes_allocated": "$.bytes_allocated",
               "total_reserved": '$."Total Reserved"', "bytes_reserved": "$.bytes_reserved",
               "peak_bytes_in_use": "$.peak_bytes_in_use", "requested_bytes": "$.requested_bytes",
               "fragmentation": "$.fragmentation", "tf_op": "$.tf_op", "op_name_arg": "$.op_name"}
# PyTorch's [memory] events and XPlane's allocator events (TSL: MemoryAllocation / MemoryDeallocation with the
# allocator's totals after the event; GPU allocators are named GPU_<n>_bfc, the TPU runtime's give index_on_host)
MEMORY_SQL = f"""
WITH events AS (
    SELECT *, TRY_CAST(allocation_bytes AS BIGINT) AS xla_bytes
    FROM {_with_arg_strings("slices WHERE kind = 'memory'", MEMORY_ARGS)}
)
SELECT run_id, rank, slice_id AS memory_id, ts,
    CASE WHEN regexp_matches(allocator, '^GPU_') THEN 'gpu'
         WHEN allocator IS NULL AND contains(args, '"index_on_host"') THEN 'tpu'
         WHEN device_type_arg = 'NPU' THEN 'npu'  -- torch_npu's memory files
         ELSE CASE TRY_CAST(device_type_arg AS INTEGER) WHEN 0 THEN 'cpu' WHEN 1 THEN 'gpu' ELSE 'other' END
    END AS device_type,
    COALESCE(TRY_CAST(device_id_arg AS INTEGER), TRY_CAST(regexp_extract(allocator, '^GPU_(\\d+)_', 1) AS INTEGER),
             TRY_CAST(index_on_host AS INTEGER)) AS device_id,
    TRY_CAST(COALESCE(addr_upper, addr_lower) AS BIGINT) AS addr,
    COALESCE(TRY_CAST(bytes_arg AS BIGINT), CASE name WHEN 'MemoryDeallocation' THEN -xla_bytes ELSE xla_bytes END)
        AS bytes,
    TRY_CAST(COALESCE(total_allocated, bytes_allocated) AS BIGINT) AS total_allocated_bytes,
    -- a 0 that is no figure (NULL): PyTorch's CPU allocator has no cache (Total Reserved 0); TSL's BFC allocators
    -- (GPU_<n>_bfc, gpu_host_bfc) write as bytes_reserved what is set aside beyond the memory in use (TensorFlow's
    -- BFCAllocator: available = limit - reserved - in use), not what they hold from the device (0 in every
    -- XPlane at hand, with gigabytes in use)
    CASE WHEN TRY_CAST(device_type_arg AS INTEGER) = 0 OR regexp_matches(allocator, '_bfc$')
         THEN NULLIF(TRY_CAST(COALESCE(total_reserved, bytes_reserved) AS BIGINT), 0)
         ELSE TRY_CAST(COALESCE(total_reserved, bytes_reserved) AS BIGINT) END AS total_reserved_bytes,
    pid, tid, op_id, step, allocator,
    TRY_CAST(peak_bytes_in_use AS BIGINT) AS peak_allocated_bytes,
    TRY_CAST(requested_bytes AS BIGINT) AS requested_bytes,
    TRY_CAST(fragmentation AS DOUBLE) AS fragmentation,
    NULLIF(NULLIF(COALESCE(tf_op, op_name_arg), '(null)'), '') AS op_name
FROM events
ORDER BY rank, ts, slice_id
"""

STEPS_SQL = f"""
WITH ranges AS (  -- step_rules.find's: the rule that defines the rank's steps, and what the names say
    SELECT r.run_id, r.rank, s.step, s.name, s.slice_id, s.ts, s.dur, s.rule, s.phase, s.batch_size, s.tokens,
        s.prefill_tokens
    FROM step_ranges s JOIN slices r USING (rank, slice_id)
), firsts AS (
    -- per device and step: its first device event, and the last end of any stepped work on the device
    SELECT rank, device_id, step, min(ts) AS first_ts, count(*) AS kernel_count,
        max(max(ts + dur)) OVER (PARTITION BY rank, device_id) AS device_end
    FROM slices WHERE kind IN ({sql_list(DEVICE_TIME_KINDS)}) AND step IS NOT NULL GROUP BY rank, device_id, step
), windows AS (
    -- the step_windows macro's rule (tracesql/functions/40_time.sql), over every device event: from the step's
    -- first event to the next step's first event on the same device, the last step to the last end
    SELECT rank, device_id, step, first_ts AS ts,
        COALESCE(lead(first_ts) OVER (PARTITION BY rank, device_id ORDER BY first_ts, step), device_end) AS te,
        kernel_count
    FROM firsts
), device AS (
    -- over the rank's devices (one, but for XLA traces of several): the earliest start to the latest end
    SELECT rank, step, min(ts) AS device_ts, max(te) - min(ts) AS device_dur, sum(kernel_count) AS kernel_count
    FROM windows GROUP BY rank, step
)
SELECT r.*,
    -- a step marked on the device (XPlane's 'Steps' line) is its own device window: XProf's step time
    CASE WHEN r.rule = 'xplane_steps' THEN r.ts ELSE d.device_ts END AS device_ts,
    CASE WHEN r.rule = 'xplane_steps' THEN r.dur ELSE d.device_dur END AS device_dur,
    COALESCE(d.kernel_count, 0) AS kernel_count
FROM ranges r LEFT JOIN device d USING (rank, step)
ORDER BY r.rank, r.ts, r.slice_id
"""


def _metadata_tables(con, traces: list[TraceData], run_id: str, ranks: list[int]) -> dict[str, pa.Table]:
    spans = {rank: span for rank, *span in
             con.execute("SELECT rank, min(ts), max(ts + dur) FROM slices GROUP BY rank").fetchall()}
    seen: dict[int, list] = {}
    for rank, device_id in con.execute("SELECT DISTINCT rank, device_id FROM slices WHERE device_id IS NOT NULL "
                                       "ORDER BY 1, 2").fetchall():
        seen.setdefault(rank, []).append(device_id)
    rows = {"ranks": [], "devices": [], "process_groups": []}
    for data, rank in zip(traces, ranks):
        span = spans.get(rank, (None, None))
        rows["ranks"].append({
            "run_id": run_id, "rank": rank, "source_path": None, "source_format": data.format,
            "source_bytes": None, "world_size": data.world_size, "backend": data.backend,
            "host_name": data.host_name, "base_time_ns": data.base_time_ns, "trace_start_ns": span[0],
            "trace_end_ns": span[1], "event_count": data.event_count, "skipped_count": sum(data.skipped.values()),
            "metadata": json.dumps(data.metadata, default=str),
        })
        known = {d["device_id"]: d for d in data.devices}
        for device_id in seen.get(rank, ()):
            known.setdefault(device_id, {"device_id": device_id})
        rows["devices"] += [
            {"run_id": run_id, "rank": rank, **{k: d.get(k) for k in ("device_id", "name", "total_memory_bytes",
                                                                       "compute_capability", "sm_count")},
             "properties": json.dumps(d.get("properties")) if d.get("properties") is not None else None}
            for d in sorted(known.values(), key=lambda d: d["device_id"])
        ]
        rows["process_groups"] += [{"run_id": run_id, "rank": rank, **g} for g in data.process_groups]
    return {name: _from_rows(con, name, table_rows) for name, table_rows in rows.items()}


def _counters(traces: list[TraceData], run_id: str, ranks: list[int]) -> pa.Table:
    counted = [(data.counters, rank) for data, rank in zip(traces, ranks) if data.counters is not None]
    if not counted:
        return _empty("counters")
    tables = [schema.conform("counters", _with_run_rank(counters, run_id, rank)) for counters, rank in counted]
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="permissive")


def _with_run_rank(table: pa.Table, run_id: str, rank: int) -> pa.Table:
    n = table.num_rows
    run_ids = pa.DictionaryArray.from_arrays(array(np.zeros(n, np.int32)), strings([run_id]))
    return table.append_column("run_id", run_ids).append_column("rank", array(np.full(n, rank, np.int32)))


def _from_rows(con, name: str, rows: list[dict]) -> pa.Table:
    """Python rows (dicts with the same keys) -> the table, through DuckDB: pa.Table.from_pylist imports pandas."""
    if not rows:
        return _empty(name)
    return _table(con, name, "SELECT r.* FROM (SELECT unnest($rows) AS r)", {"rows": rows})
