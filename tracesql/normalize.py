"""What every source needs after reading: nesting, CPU->device links, steps, and the derived tables.

Input: a reader's TraceData for one file. Output: every table of `schema.TABLES`, as Arrow, for that rank.
Sequential work (the nesting stack) is one Python pass over plain ints; everything else is numpy or DuckDB SQL
over the Arrow columns, so a trace of a few hundred thousand events normalizes in a fraction of a second.
"""

from __future__ import annotations

import ctypes
import functools
import json
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import db, functions, limits, quality, schema
from .arrays import array, strings, to_numpy
from .readers import TraceData
from .schema import STEP_PATTERN

LAUNCH_KINDS = ("runtime", "driver")
DEVICE_WORK_KINDS = ("kernel", "memcpy", "memset", "gpu_annotation", "sync")
SELF_TIME_CHILD_KINDS = ("cpu_op", "user_annotation")
NEST_CHUNK = 1 << 18
SCAN_BATCH = 1 << 17
# the functions the derived tables use (all of them take a fifth of a second to create)
INGEST_FUNCTIONS = ("kernel_classes.csv", "10_sizes.sql", "20_activity.sql")


def normalize(data: TraceData, run_id: str, rank: int, on_table, threads: int = 1) -> dict[str, int]:
    """Every table for one file, handed to `on_table(name, rows) -> row count` as soon as it is defined, to be
    written: `rows` is an Arrow table, or, for the large derived tables, a DuckDB relation to stream to disk.
    Nothing is kept: memory holds the slices and their links. Returns the row count of each table."""
    starter = ThreadPoolExecutor(1)  # DuckDB starts up (tens of ms, without the GIL) while the numpy work runs
    # DuckDB's working memory for the derived tables: their inputs are Arrow (outside it); beyond it, it spills
    connecting = starter.submit(db.connect, threads, limits.current().memory)
    starter.shutdown(wait=False)
    slices, extra, checks = _link(data.slices, run_id, rank)  # its numpy temporaries are freed when it returns
    _release_freed_memory()
    checks = quality.skipped_rows(data.skipped, data.examples) + checks
    return _derive(connecting.result(), slices, extra, checks, data, run_id, rank, on_table)


def _release_freed_memory() -> None:
    """Give the heap memory the linking temporaries freed back to the system (glibc keeps arrays of a few tens of
    MB in its heap otherwise: about 0.1 KB per event that the derived tables' DuckDB would add to)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _link(s: pa.Table, run_id: str, rank: int) -> tuple[pa.Table, pa.Table, list[dict]]:
    """The reader's slices plus the columns that link events (parent, launch, op, step), the per-row facts
    the derived tables need (`extra`), computed over numpy arrays, and the quality checks on those links."""
    n = s.num_rows
    is_kind = functools.partial(_is_in, s["kind"])
    ts = to_numpy(s["ts"])
    dur = to_numpy(s["dur"])
    end = ts + dur
    sid = to_numpy(s["slice_id"])  # rows may be in any order: arrays below are by row, ties broken by slice_id
    is_op = is_kind(("cpu_op",))
    is_collective_call = _collective_calls(s, is_op)
    lane = to_numpy(_dictionary(s["track"]).indices)

    parent, depth, enclosing_op, op_depth, enclosing_call = _nest(lane, ts, end, sid, is_op, is_collective_call)

    # device work -> the runtime/driver call with the same correlation id (CUDA graphs: many kernels, one call)
    correlation = s["correlation"]
    launch = np.full(n, -1, np.int64)
    on_device = is_kind(DEVICE_WORK_KINDS)
    has_corr = ~to_numpy(correlation.is_null())
    corr = to_numpy(correlation, fill=-1)
    launchers = np.flatnonzero(is_kind(LAUNCH_KINDS) & has_corr)
    if len(launchers):
        order = launchers[np.lexsort((sid[launchers], corr[launchers]))]
        keys, first = np.unique(corr[order], return_index=True)
        targets = np.flatnonzero(on_device & has_corr)
        pos = np.clip(np.searchsorted(keys, corr[targets]), 0, len(keys) - 1)
        hit = keys[pos] == corr[targets]
        launch[targets[hit]] = order[first[pos[hit]]]
    launched = launch >= 0
    enclosing_op[launched] = enclosing_op[launch[launched]]
    enclosing_call[launched] = enclosing_call[launch[launched]]

    # steps: host events by time inside the step range; device events by their launch's step, or by time when
    # nothing launched them (XLA CPU thunks, TPU ops, device work whose launch was not recorded)
    step_rows = np.flatnonzero(is_kind(("user_annotation", "cpu_op")) & _name_matches(s["name"], STEP_PATTERN))
    step_rows = step_rows[np.lexsort((sid[step_rows], ts[step_rows]))]
    step = np.full(n, -1, np.int64)
    if len(step_rows):
        step_names = s["name"].take(array(step_rows)).cast(pa.string())
        step_numbers = to_numpy(pc.struct_field(pc.extract_regex(step_names, STEP_PATTERN), "step").cast(pa.int64()))
        k = np.searchsorted(ts[step_rows], ts, side="right") - 1
        inside = (k >= 0) & (ts < end[step_rows][np.clip(k, 0, None)])
        step[inside] = step_numbers[k[inside]]
        step[launched] = step[launch[launched]]

    # device time each op caused: directly (self) and through nested ops (total)
    is_device_work = is_kind(("kernel", "memcpy", "memset"))
    device_work = is_device_work & (enclosing_op >= 0)
    dev_dur = np.where(device_work, dur, 0)
    dev_count = device_work
    owner = np.where(enclosing_op >= 0, enclosing_op, 0)
    device_self = np.bincount(owner, weights=dev_dur, minlength=n).astype(np.int64)
    kernel_self = np.bincount(owner, weights=dev_count, minlength=n).astype(np.int64)
    device_total, kernel_total = device_self.copy(), kernel_self.copy()
    op_parent = np.where(is_op, enclosing_op, -1)
    for d in range(int(op_depth[is_op].max(initial=0)), 0, -1):
        rows = np.flatnonzero(is_op & (op_depth == d) & (op_parent >= 0))
        device_total += np.bincount(op_parent[rows], weights=device_total[rows], minlength=n).astype(np.int64)
        kernel_total += np.bincount(op_parent[rows], weights=kernel_total[rows], minlength=n).astype(np.int64)
    child = np.flatnonzero(is_kind(SELF_TIME_CHILD_KINDS) & (parent >= 0))
    child_time = np.bincount(parent[child], weights=dur[child], minlength=n).astype(np.int64)

    def names(rows):
        return s["name"].take(array(np.asarray(rows, np.int64))).cast(pa.string()).to_pylist()

    checks = quality.link_rows(names, is_device_work, launch, launchers, corr, sid, end, step_rows)

    def ids(rows):  # row positions (-1: none) -> slice ids
        return array(np.where(rows >= 0, sid[rows], -1), pa.int64(), rows < 0)

    slices = _with_run_rank(s, run_id, rank)
    for col, values in (("parent_id", ids(parent)), ("depth", array(depth, pa.int32())),
                        ("launch_id", ids(launch)), ("op_id", ids(enclosing_op)),
                        ("step", array(step, pa.int32(), step < 0))):
        slices = slices.append_column(col, values)
    extra = pa.table({
        "slice_id": s["slice_id"],
        "op_depth": array(op_depth, pa.int32()),
        "self_dur": array(dur - child_time),
        "kernel_count": array(kernel_self), "device_self_ns": array(device_self),
        "kernel_count_total": array(kernel_total), "device_total_ns": array(device_total),
        "collective_call": ids(enclosing_call),
        "is_collective_call": array(is_collective_call),
    })
    return slices, extra, checks


def _dictionary(col) -> pa.DictionaryArray:
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return col if pa.types.is_dictionary(col.type) else pc.dictionary_encode(col)


def _per_value(col, test) -> np.ndarray:
    """test(distinct value) -> bool, evaluated once per distinct value and spread to every row (nulls: False)."""
    d = _dictionary(col)
    hits = np.array([bool(v is not None and test(v)) for v in d.dictionary.to_pylist()] + [False])
    return hits[to_numpy(d.indices, fill=len(d.dictionary))]


def _is_in(col, values) -> np.ndarray:
    return _per_value(col, lambda v: v in values)


def _name_matches(col, pattern: str) -> np.ndarray:
    regex = re.compile(pattern)
    return _per_value(col, lambda v: regex.search(v) is not None)


def _collective_calls(s: pa.Table, is_op) -> np.ndarray:
    """Host ops that are communication calls: record_param_comms that carry collective metadata; when a trace
    has none (older PyTorch, gloo), the c10d::* ops."""
    rpc = is_op & _is_in(s["name"], ("record_param_comms",))
    if rpc.any():
        args = s["args"].filter(array(rpc))
        with_meta = to_numpy(pc.match_substring(args, '"Collective name"'), fill=False)
        if with_meta.any():
            calls = np.zeros(len(is_op), bool)
            calls[np.flatnonzero(rpc)[with_meta]] = True
            return calls
    return is_op & _per_value(s["name"], lambda v: v.startswith("c10d::"))


def _nest(lane, ts, end, sid, is_op, is_call):
    """Parent, depth, innermost enclosing op (and op depth), innermost enclosing collective call, per event.

    Events are visited per lane in (start, longest first) order with a stack of open events. An event that starts
    inside the top of the stack but ends after it (a partial overlap: clock jitter) is not its child."""
    n = len(ts)
    order = np.lexsort((sid, -(end - ts), ts, lane))
    par = np.full(n, -1, np.int64)
    dep = np.zeros(n, np.int32)
    stack_end: list[int] = []
    stack_idx: list[int] = []  # positions in `order`
    current_lane = None
    # Python ints for the loop, a chunk at a time: lists of every event would cost ~100 bytes an event
    for lo in range(0, n, NEST_CHUNK):
        chunk = order[lo:lo + NEST_CHUNK]
        chunk_par, chunk_dep = [-1] * len(chunk), [0] * len(chunk)
        for j, (ln, t, e) in enumerate(zip(lane[chunk].tolist(), ts[chunk].tolist(), end[chunk].tolist())):
            if ln != current_lane:
                current_lane = ln
                stack_end.clear()
                stack_idx.clear()
            while stack_end and (stack_end[-1] <= t and not (stack_end[-1] == t == e) or stack_end[-1] < e):
                stack_end.pop()
                stack_idx.pop()
            if stack_idx:
                chunk_par[j] = stack_idx[-1]
                chunk_dep[j] = len(stack_idx)
            stack_end.append(e)
            stack_idx.append(lo + j)
        par[lo:lo + len(chunk)] = chunk_par
        dep[lo:lo + len(chunk)] = chunk_dep
    # positions in `order` -> rows
    parent = np.full(n, -1, np.int64)
    parent[order] = np.where(par >= 0, order[par], -1)
    depth = np.zeros(n, np.int32)
    depth[order] = dep
    # what is inherited from the parent, one nesting level at a time (numpy, not in the loop above)
    enclosing_op = np.full(n, -1, np.int64)
    op_depth = np.zeros(n, np.int32)
    enclosing_call = np.full(n, -1, np.int64)
    by_depth = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[by_depth], np.arange(1, depth.max(initial=0) + 2))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        rows = by_depth[lo:hi]
        p = parent[rows]
        enclosing_op[rows] = np.where(is_op[p], p, enclosing_op[p])
        enclosing_call[rows] = np.where(is_call[p], p, enclosing_call[p])
        op_depth[rows] = op_depth[p] + is_op[p]
    return parent, depth, enclosing_op, op_depth, enclosing_call


def _derive(con, slices: pa.Table, extra: pa.Table, checks: list[dict], data: TraceData, run_id: str, rank: int,
            on_table):
    rows: dict[str, int] = {}

    def emit(name: str, table):
        rows[name] = on_table(name, table)
        return table

    slices = emit("slices", schema.conform("slices", slices))
    # in batches (zero-copy views) so that DuckDB scans them on every thread
    con.register("slices", pa.Table.from_batches(slices.to_batches(max_chunksize=SCAN_BATCH)))
    con.register("extra", extra)
    con.register("steps", emit("steps", _table(con, "steps", STEPS_SQL)))
    functions.install(con, INGEST_FUNCTIONS)
    metadata = _metadata_tables(con, data, run_id, rank)
    for name, table in metadata.items():
        emit(name, table)
    emit("counters", _counters(data.counters, run_id, rank))
    emit("warnings", _from_rows(con, "warnings", [{"run_id": run_id, "rank": rank, "source_path": None, **c}
                                                  for c in checks]))
    con.register("groups", metadata["process_groups"])  # used by the collectives query
    for name, sql in (("ops", OPS_SQL), ("collectives", COLLECTIVES_SQL), ("memory", MEMORY_SQL)):
        emit(name, con.sql(f"SELECT {schema.select_list(name)} FROM ({sql})"))
    return rows


def _table(con, name: str, sql: str, params: dict | None = None) -> pa.Table:
    """The result of `sql` as table `name`, streamed batch by batch (DuckDB never holds all of it at once)."""
    select = f"SELECT {schema.select_list(name)} FROM ({sql})"
    reader = con.sql(select, params=params).to_arrow_reader(SCAN_BATCH)
    return schema.conform(name, pa.Table.from_batches(list(reader), reader.schema))


OPS_SQL = """
SELECT s.run_id, s.rank, s.slice_id AS op_id, s.name, s.ts, s.dur, x.self_dur, s.pid, s.tid,
    s.op_id AS parent_op_id, x.op_depth, s.step, s.external_id,
    TRY_CAST(json_extract_string(s.args, '$."Sequence number"') AS BIGINT) AS sequence_number,
    TRY_CAST(json_extract_string(s.args, '$."Fwd thread id"') AS BIGINT) AS fwd_thread_id,
    list_transform(TRY_CAST(json_extract(s.args, '$."Input Dims"') AS JSON[]),
                   lambda d: TRY_CAST(d AS BIGINT[])) AS input_dims,
    TRY_CAST(json_extract(s.args, '$."Input type"') AS VARCHAR[]) AS input_types,
    list_transform(TRY_CAST(json_extract(s.args, '$."Input Strides"') AS JSON[]),
                   lambda d: TRY_CAST(d AS BIGINT[])) AS input_strides,
    TRY_CAST(json_extract(s.args, '$."Concrete Inputs"') AS VARCHAR[]) AS concrete_inputs,
    TRY_CAST(json_extract_string(s.args, '$.flops') AS DOUBLE) AS flops,
    x.kernel_count, x.device_self_ns, x.kernel_count_total, x.device_total_ns
FROM slices s
JOIN extra x USING (slice_id)  -- (an op's own op_id is the op enclosing it)
WHERE s.kind = 'cpu_op'
ORDER BY s.slice_id
"""

# Host calls carry group and size; the kernels carry device time (and, in newer traces, the same metadata).
COLLECTIVES_SQL = """
WITH comm_kernels AS (
    SELECT a.*, x.collective_call
    FROM device_activity() a JOIN extra x USING (slice_id)
    WHERE a.class = 'communication'
), per_call AS (
    SELECT collective_call, count(*) AS kernel_count, any_value(device_id) AS device_id,
        arg_min(stream, ts) AS stream, min(ts) AS device_ts, max(ts + dur) - min(ts) AS device_dur,
        sum(dur) AS kernel_dur
    FROM comm_kernels WHERE collective_call IS NOT NULL GROUP BY collective_call
), calls AS (
    SELECT s.run_id, s.rank, s.slice_id AS collective_id, s.args, s.step, s.ts AS cpu_ts, s.dur AS cpu_dur,
        COALESCE(json_extract_string(s.args, '$."Collective name"'), s.name) AS source_name,
        k.kernel_count, k.device_id, k.stream, k.device_ts, k.device_dur, k.kernel_dur
    FROM slices s JOIN extra x USING (slice_id) LEFT JOIN per_call k ON k.collective_call = s.slice_id
    WHERE x.is_collective_call
), kernel_only AS (
    SELECT run_id, rank, slice_id AS collective_id, args, step, NULL AS cpu_ts, NULL AS cpu_dur,
        COALESCE(json_extract_string(args, '$."Collective name"'), name) AS source_name,
        1 AS kernel_count, device_id, stream, ts AS device_ts, dur AS device_dur, dur AS kernel_dur
    FROM comm_kernels WHERE collective_call IS NULL
), rows AS (
    SELECT *,
        json_extract_string(args, '$."Process Group Name"') AS pg_name,
        json_extract_string(args, '$."Process Group Description"') AS pg_desc,
        TRY_CAST(json_extract_string(args, '$."Group size"') AS INTEGER) AS group_size,
        TRY_CAST(json_extract_string(args, '$."Process Group Ranks"') AS INTEGER[]) AS group_ranks,
        COALESCE(json_extract_string(args, '$.dtype'),
                 list_filter(TRY_CAST(json_extract(args, '$."Input type"') AS VARCHAR[]),
                             lambda t: dtype_bytes(t) IS NOT NULL)[1]) AS dtype,
        -- without metadata the message is the op's input tensor: the second one of c10d's *_base_ ops
        -- (output, input), the first otherwise
        COALESCE(TRY_CAST(json_extract_string(args, '$."In msg nelems"') AS BIGINT),
                 tensor_numel(json_extract(args, '$."Input Dims"'),
                              CASE WHEN contains(source_name, '_base_') THEN 2 ELSE 1 END)) AS in_nelems,
        TRY_CAST(json_extract_string(args, '$."Out msg nelems"') AS BIGINT) AS out_nelems,
        TRY_CAST(COALESCE(json_extract_string(args, '$.Seq'), json_extract_string(args, '$.seq')) AS BIGINT)
            AS recorded_seq
    FROM (SELECT * FROM calls UNION ALL BY NAME SELECT * FROM kernel_only)
    WHERE source_name <> 'wait'  -- work.wait() is recorded like a collective but moves no data
), only_group AS (  -- a rank in a single process group: calls that name none ran on it
    SELECT any_value(pg_name) AS pg_name, any_value(pg_desc) AS pg_desc, any_value(group_size) AS group_size,
        any_value(group_ranks) AS group_ranks
    FROM groups HAVING count(*) = 1
)
SELECT r.* REPLACE (COALESCE(r.pg_name, g.pg_name) AS pg_name, COALESCE(r.pg_desc, g.pg_desc) AS pg_desc,
                    COALESCE(r.group_size, g.group_size) AS group_size,
                    COALESCE(r.group_ranks, g.group_ranks) AS group_ranks),
    collective_kind(r.source_name) AS collective, dtype_bytes(r.dtype) AS dtype_bytes,
    CASE WHEN collective_kind(r.source_name) = 'all_gather'
         THEN COALESCE(r.out_nelems, r.in_nelems * COALESCE(r.group_size, g.group_size))
         ELSE r.in_nelems END * dtype_bytes(r.dtype) AS size_bytes,
    r.recorded_seq IS NOT NULL AS seq_recorded,
    -- numbered per group; device work no host call issued (XLA's SPMD ops, one set per device) per device too
    COALESCE(r.recorded_seq, row_number() OVER (PARTITION BY COALESCE(r.pg_name, g.pg_name, ''),
                                                             CASE WHEN r.cpu_ts IS NULL THEN r.device_id END
                                                ORDER BY COALESCE(r.cpu_ts, r.device_ts)) - 1) AS seq
FROM rows r LEFT JOIN only_group g ON true
ORDER BY COALESCE(r.cpu_ts, r.device_ts)
"""

MEMORY_SQL = """
SELECT run_id, rank, slice_id AS memory_id, ts,
    CASE TRY_CAST(json_extract_string(args, '$."Device Type"') AS INTEGER)
        WHEN 0 THEN 'cpu' WHEN 1 THEN 'gpu' ELSE 'other' END AS device_type,
    TRY_CAST(json_extract_string(args, '$."Device Id"') AS INTEGER) AS device_id,
    TRY_CAST(json_extract_string(args, '$.Addr') AS BIGINT) AS addr,
    TRY_CAST(json_extract_string(args, '$.Bytes') AS BIGINT) AS bytes,
    TRY_CAST(json_extract_string(args, '$."Total Allocated"') AS BIGINT) AS total_allocated_bytes,
    TRY_CAST(json_extract_string(args, '$."Total Reserved"') AS BIGINT) AS total_reserved_bytes,
    pid, tid, op_id, step
FROM slices WHERE kind = 'memory'
ORDER BY ts, slice_id
"""

STEPS_SQL = f"""
WITH step_ranges AS (
    SELECT run_id, rank, CAST(regexp_extract(name, '{STEP_PATTERN}', 1) AS INTEGER) AS step, name, slice_id, ts, dur
    FROM slices
    WHERE kind IN ('user_annotation', 'cpu_op') AND regexp_matches(name, '{STEP_PATTERN}')
), device AS (
    SELECT step, min(ts) AS device_ts, max(ts + dur) - min(ts) AS device_dur, count(*) AS kernel_count
    FROM slices WHERE kind IN ('kernel', 'memcpy', 'memset') AND step IS NOT NULL GROUP BY step
)
SELECT r.*, d.device_ts, d.device_dur, COALESCE(d.kernel_count, 0) AS kernel_count
FROM step_ranges r LEFT JOIN device d USING (step)
ORDER BY r.ts
"""


def _metadata_tables(con, data: TraceData, run_id: str, rank: int) -> dict[str, pa.Table]:
    span = con.execute("SELECT min(ts), max(ts + dur) FROM slices").fetchone()
    ranks = {
        "run_id": run_id, "rank": rank, "source_path": None, "source_format": data.format,
        "source_bytes": None, "world_size": data.world_size, "backend": data.backend,
        "host_name": data.host_name, "base_time_ns": data.base_time_ns, "trace_start_ns": span[0],
        "trace_end_ns": span[1], "event_count": data.event_count, "skipped_count": sum(data.skipped.values()),
        "metadata": json.dumps(data.metadata, default=str),
    }
    known = {d["device_id"]: d for d in data.devices}
    seen = con.execute("SELECT DISTINCT device_id FROM slices WHERE device_id IS NOT NULL ORDER BY 1").fetchall()
    for (device_id,) in seen:
        known.setdefault(device_id, {"device_id": device_id})
    devices = [
        {"run_id": run_id, "rank": rank, **{k: d.get(k) for k in ("device_id", "name", "total_memory_bytes",
                                                                   "compute_capability", "sm_count")},
         "properties": json.dumps(d.get("properties")) if d.get("properties") is not None else None}
        for d in sorted(known.values(), key=lambda d: d["device_id"])
    ]
    groups = [{"run_id": run_id, "rank": rank, **g} for g in data.process_groups]
    return {
        "ranks": _from_rows(con, "ranks", [ranks]),
        "devices": _from_rows(con, "devices", devices),
        "process_groups": _from_rows(con, "process_groups", groups),
    }


def _counters(counters: pa.Table | None, run_id: str, rank: int) -> pa.Table:
    if counters is None:
        return pa.Table.from_batches([], schema.arrow_schema("counters"))
    return schema.conform("counters", _with_run_rank(counters, run_id, rank))


def _with_run_rank(table: pa.Table, run_id: str, rank: int) -> pa.Table:
    n = table.num_rows
    run_ids = pa.DictionaryArray.from_arrays(array(np.zeros(n, np.int32)), strings([run_id]))
    return table.append_column("run_id", run_ids).append_column("rank", array(np.full(n, rank, np.int32)))


def _from_rows(con, name: str, rows: list[dict]) -> pa.Table:
    """Python rows (dicts with the same keys) -> the table, through DuckDB: pa.Table.from_pylist imports pandas."""
    if not rows:
        return pa.Table.from_batches([], schema.arrow_schema(name))
    return _table(con, name, "SELECT r.* FROM (SELECT unnest($rows) AS r)", {"rows": rows})
