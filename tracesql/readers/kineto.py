"""Chrome trace JSON: PyTorch profiler (Kineto) traces, and any chrome://tracing file.

Kineto (`*.pt.trace.json[.gz]` from CUDA, ROCm, MTIA and CPU runs) is the main dialect: its categories say what
each event is. Other producers are read by the same code: JAX/TensorFlow (TSL) traces, whose '/host:CPU' and
'/device:GPU:N' processes say where XLA ops ran; and the rest (Chrome, Node.js, VizTracer, ...), whose events are
host annotations. Complete (X) and instant events are kept as they are, begin/end pairs (B/E on a thread, b/e and
S/F async on a track per async name) are matched into slices, counter (C) events become counter samples, flows
(s/t/f) give a correlation id to the slices they bind to (not in Kineto, whose correlation ids are in args), and
process/thread names name the tracks. The JSON Array Format (a bare list of events) is read too.

Speed and memory: msgspec checks the whole document and finds the events without building Python objects for
them; the array goes to a scratch file that DuckDB's JSON reader parses on every core, keeping `args` as JSON
text. Python only sees metadata, the small lookup tables and the begin/end matching.
"""

from __future__ import annotations

import codecs
import os
from concurrent.futures import ThreadPoolExecutor
import re
import tempfile
from pathlib import Path

import duckdb
import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import db, functions, limits
from ..arrays import array, to_numpy
from ..db import sql_list
from ..errors import TraceError
from ..schema import STEP_PATTERN
from .common import decode_json
from .xplane import ACCELERATOR_PLANE, HOST_PLANE, STREAM_LINE

FORMAT = "kineto"
SUFFIXES = (".json", ".json.gz")

# Kineto category (lower case) -> slices.kind. Declared, not branched on, so new categories are one line.
# Kineto before its 2021 ActivityType names wrote 'Operator', 'Runtime', 'Kernel', 'Memcpy', 'Memset' (libkineto's
# ChromeTraceLogger then): the same kinds.
CATEGORY_KINDS = {
    "cpu_op": "cpu_op",
    "operator": "cpu_op",
    "user_annotation": "user_annotation",
    "python_function": "python_function",
    "cuda_runtime": "runtime",
    "runtime": "runtime",
    "hip_runtime": "runtime",
    "xpu_runtime": "runtime",
    "mtia_runtime": "runtime",
    "privateuse1_runtime": "runtime",
    "cuda_driver": "driver",
    "hip_driver": "driver",
    "xpu_driver": "driver",
    "privateuse1_driver": "driver",
    "kernel": "kernel",
    "mtia_ccp_events": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
    "gpu_user_annotation": "gpu_annotation",
    "cuda_sync": "sync",
    "trace": "profiler",
    "cpu_instant_event": "instant",
    "overhead": "profiler",
}
DEVICE_KINDS = ("kernel", "memcpy", "memset", "gpu_annotation", "sync")
# Device events whose name, not category, says what they are.
NAME_KINDS = {("mtia_ccp_events", "dma_request"): "memcpy"}

SLICE_PHASES = ("X", "i", "I", "n", "R")  # complete; instant, async instant, mark: kept as they are
OPENING_PHASES, CLOSING_PHASES = ("B", "b", "S"), ("E", "e", "F")  # matched into slices
COUNTER_PHASE = "C"
FLOW_PHASES = ("s", "t", "f")
KNOWN_OTHER_PHASES = ("M", *FLOW_PHASES)  # metadata and flows: used, not kept as events
KINETO_KEYS = ("schemaVersion", "deviceProperties", "distributedInfo", "traceName", "baseTimeNanoseconds")

# TSL (JAX/TensorFlow) traces name processes and threads as XPlane names planes and lines
TSL_HOST, TSL_DEVICE, TSL_STREAM = HOST_PLANE, ACCELERATOR_PLANE.pattern, STREAM_LINE.pattern


def detect(path: Path, head: bytes) -> bool:
    text = head.lstrip()
    if text[:1] == b"[":  # the JSON Array Format: a bare list of events
        return b'"ph"' in text
    return text[:1] == b"{" and any(k in text for k in (b'"traceEvents"', b'"schemaVersion"', b'"deviceProperties"'))



def _split(path: Path, data: bytes):
    """(the raw `traceEvents` array, the other top-level fields decoded). msgspec validates the whole document
    here, so everything after works on well-formed JSON."""
    if data.lstrip()[:1] == b"[":
        return _event_array(path, data), {}
    try:
        top, _ = decode_json(data, dict[str, msgspec.Raw])  # bad UTF-8 in a top-level key: replaced
    except msgspec.ValidationError:
        raise TraceError(path, "not a trace: the JSON is not an object") from None
    except msgspec.DecodeError as e:
        raise TraceError(path, f"not valid JSON ({e})") from None
    if "traceEvents" not in top:
        raise TraceError(path, "not a trace: JSON object has no 'traceEvents'")
    raw_events = top.pop("traceEvents")
    if bytes(memoryview(raw_events)[:1]) != b"[":
        raise TraceError(path, "not a trace: 'traceEvents' is not a list")
    meta = {}
    for key, raw in top.items():
        try:
            meta[key] = msgspec.json.decode(raw)
        except (msgspec.DecodeError, UnicodeDecodeError):
            meta[key] = None
    return raw_events, meta


def _event_array(path: Path, data: bytes) -> bytes:
    """The JSON Array Format's events. Its closing bracket is optional (a tracer may stop writing mid-stream):
    without one, the array is closed after the last complete event."""
    try:
        msgspec.json.decode(data, type=list[msgspec.Raw])
        return data
    except msgspec.DecodeError as e:
        closed = data.rstrip().rstrip(b",") + b"]"
        try:
            msgspec.json.decode(closed, type=list[msgspec.Raw])
        except msgspec.DecodeError:
            raise TraceError(path, f"not valid JSON ({e})") from None
        return closed


# The events as DuckDB reads them. Fast path: typed columns. If a value does not fit its type (a damaged event),
# the robust path reads every event as one JSON value and extracts the fields with TRY_CAST. `member`: which of the
# traces read together (read_batch) an event is of (one trace: 0, a byte a row); `idx` numbers each one's events
# from 0.
_TYPED_COLUMNS = """ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'JSON', tid: 'JSON',
                          ts: 'DOUBLE', dur: 'DOUBLE', args: 'JSON', id: 'JSON', id2: 'JSON', bp: 'VARCHAR'"""
_TYPED = f"""
SELECT CAST(0 AS UTINYINT) AS member, row_number() OVER () - 1 AS idx, false AS malformed, ph, cat, name, pid, tid, ts, dur, args, id,
    id2, bp
FROM read_json($file, format = 'array', columns = {{{_TYPED_COLUMNS}}})
"""
# several files in one read: the events come in the files' order, each file's in its own
_TYPED_BATCH = f"""
SELECT member, n - min(n) OVER (PARTITION BY member) AS idx, false AS malformed, ph, cat, name, pid, tid, ts, dur,
    args, id, id2, bp
FROM (SELECT list_position($files, filename) - 1 AS member, row_number() OVER () AS n, *
      FROM read_json($files, format = 'array', filename = true, columns = {{{_TYPED_COLUMNS}}}))
"""
_ROBUST = """
SELECT CAST(0 AS UTINYINT) AS member, row_number() OVER () - 1 AS idx, json_type(e) IS DISTINCT FROM 'OBJECT' AS malformed,  -- null too
    e ->> 'ph' AS ph, e ->> 'cat' AS cat, e ->> 'name' AS name, e -> 'pid' AS pid, e -> 'tid' AS tid,
    TRY_CAST(e ->> 'ts' AS DOUBLE) AS ts, TRY_CAST(e ->> 'dur' AS DOUBLE) AS dur, e -> 'args' AS args,
    e -> 'id' AS id, e -> 'id2' AS id2, e ->> 'bp' AS bp
FROM read_json($file, format = 'array', records = false,
               columns = {e: 'JSON'})
"""


def _load_events(con, path: Path, events_file: Path, notes: list[str], max_events: int | None) -> None:
    for robust, sql in ((False, _TYPED), (True, _ROBUST)):
        if max_events:  # a quick look: DuckDB stops reading after them
            sql = sql.replace("FROM read_json(", "FROM (SELECT * FROM read_json(").rstrip() + f" LIMIT {max_events})"
        try:
            con.execute(f"CREATE OR REPLACE TABLE events AS {sql}", {"file": str(events_file)})
            return
        except duckdb.OutOfMemoryException:  # not the events' fault: the ingest names the file and the limit
            raise
        except duckdb.Error as e:
            if "utf" in str(e).lower() and _UTF8_NOTE not in notes:
                notes.append(_UTF8_NOTE)
                _replace_invalid_utf8(events_file)
                return _load_events(con, path, events_file, notes, max_events)
            if robust:
                raise TraceError(path, f"unreadable events ({str(e).splitlines()[0]})") from None


_UTF8_NOTE = "invalid UTF-8 in names replaced by U+FFFD"
_CHUNK = 16 << 20
_WINDOW = 64 << 20  # how far into the file the `traceEvents` key is looked for
_FIRST_WINDOW = 1 << 20  # (first this far)
# events JSON above this share of --memory-limit: DuckDB's event table in a database file, else in memory (twice
# as fast to load: no compression; past the limit it spills to disk too)
_ON_DISK_SHARE = 0.5
_TAIL = 1 << 16  # how far from its end the array's end is: the scalar fields after it are short


def _replace_invalid_utf8(file: Path) -> None:
    """Rewrite `file` with invalid UTF-8 replaced by U+FFFD, a chunk at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    fixed = file.with_suffix(".utf8")
    with open(file, "rb") as src, open(fixed, "wb") as dst:
        while chunk := src.read(_CHUNK):
            dst.write(decoder.decode(chunk).encode())
        dst.write(decoder.decode(b"", final=True).encode())
    fixed.replace(file)


def _locate(f, size: int) -> tuple[int, int, dict] | None:
    """Where the `traceEvents` array is in the open file `f` — (offset of its '[', offset just past its ']') — and
    the other top-level fields, decoded: found from the first _WINDOW and the last _TAIL bytes, without reading the
    events. None when the document is not laid out as profilers write it (fields after the array hold only
    scalars and lists of them), or is damaged: the caller then reads it whole. A list closing the document after the array can
    be taken for its end: then what DuckDB is given is no JSON array, it says so, and the caller reads the
    document whole (so a wrong range is never read as events)."""
    found = None
    for window in (_FIRST_WINDOW, _WINDOW):  # profilers write the key near the start: most files need no more
        f.seek(0)
        found = _array_start(f.read(min(size, window)))
        if found or window >= size:
            break
    if found is None:
        return None
    start, meta = found
    f.seek(max(start, size - _TAIL))
    tail_at = f.tell()
    tail = f.read()
    pos = len(tail)
    while (pos := tail.rfind(b"]", 0, pos)) >= 0 and tail_at + pos > start:
        rest = tail[pos + 1:].strip()
        try:
            after = {} if rest == b"}" else msgspec.json.decode(b"{" + rest[1:], type=dict[str, _Trailing]) \
                if rest.startswith(b",") else None
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            continue
        q = pos - 1  # the array holds events: it ends with '}', or is the empty list that starts at `start`
        while q >= 0 and tail[q] in b" \t\r\n":
            q -= 1
        closes_events = q >= 0 and (tail[q] == ord("}") or tail[q] == ord("[") and tail_at + q == start)
        if after is not None and closes_events:
            return start, tail_at + pos + 1, {**meta, **after}
    return None


def _array_start(head: bytes) -> tuple[int, dict] | None:
    """(offset of the `traceEvents` array's '[', the top-level fields before it) when `head` holds them."""
    for m in re.finditer(rb'"traceEvents"\s*:\s*\[', head):
        before = head[:m.start()].strip()
        try:  # the key is at the top level iff what precedes it closes into an object
            if before == b"{":
                return m.end() - 1, {}
            if before.endswith(b","):
                return m.end() - 1, msgspec.json.decode(before[:-1] + b"}", type=dict)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
            pass
    return None


_Trailing = object  # fields after the array (Kineto: a list of log lines; Chrome: a metadata object), within _TAIL


def whole_read_bytes() -> int:
    """The largest document read into memory whole (when the streaming path cannot read it): reading it takes
    about twice its size, so half of --memory-limit (at least 16 MiB)."""
    from . import common

    return max(16 << 20, common.whole_read_bytes(2))


def _too_large_to_read_whole(path: Path, size: int, why: str) -> TraceError:
    return TraceError(path, f"{why}; the document ({size / 2**20:,.0f} MiB) is too large to read whole within "
                            f"--memory-limit {limits.current().memory} (up to {whole_read_bytes() / 2**20:,.0f} MiB "
                            "is; a larger --memory-limit reads more): refused")


def _events_file(path: Path, scratch: Path, whole: bool = False) -> tuple[Path, dict, bool]:
    """A file holding only the `traceEvents` array (what DuckDB reads), and the other top-level fields. Streamed:
    a gzip is unpacked into the scratch folder a chunk at a time (a decompression bomb is refused: see
    readers.inflated) and the fields around the array are blanked; a plain file has the array's bytes copied.
    Only a document laid out otherwise (or `whole`) is read into memory whole, and only one of at most
    whole_read_bytes(): a larger one is refused. The last item says whether the array was located (True) or
    the document read whole."""
    from .common import inflated, read_bytes

    events_file = scratch / "events.json"
    with open(path, "rb") as src:
        gzipped = src.read(2) == b"\x1f\x8b" and not whole
    if gzipped:
        inflated(path, scratch).replace(events_file)
    source = events_file if gzipped else path
    size = source.stat().st_size
    with open(source, "r+b" if gzipped else "rb") as f:
        found = None if whole else _locate(f, size)
        if found and gzipped:
            start, end, meta = found
            for at, n in ((0, start), (end, size - end)):
                f.seek(at)
                for done in range(0, n, _CHUNK):
                    f.write(b" " * min(_CHUNK, n - done))
        elif found:
            start, end, meta = found
            with open(events_file, "wb") as dst:
                _copy_range(f, start, end - start, dst)
    if found:
        return events_file, meta, True
    if size > whole_read_bytes():
        raise _too_large_to_read_whole(path, size, "the 'traceEvents' array is not where profilers write it (its "
                                                   f"start in the first {_WINDOW >> 20} MiB, its end in the last "
                                                   f"{_TAIL >> 10} KiB)")
    if gzipped:
        events_file.unlink()
    data = read_bytes(path)  # the whole document, checked by msgspec: its errors say what is wrong
    raw_events, meta = _split(path, data)
    with open(events_file, "wb") as dst:
        dst.write(memoryview(raw_events))
    return events_file, meta, False


def _copy_range(src, start: int, n: int, dst) -> None:
    """`n` bytes of the open file `src` from `start` appended to `dst`: in the kernel where it can
    (copy_file_range, a third of the time of a copy through Python's memory), else a chunk at a time."""
    done = 0
    try:
        while done < n and (k := os.copy_file_range(src.fileno(), dst.fileno(), n - done, start + done)):
            done += k
    except (AttributeError, OSError):  # not Linux, or not between these file systems
        pass
    src.seek(start + done)
    dst.seek(done)
    while done < n and (chunk := src.read(min(_CHUNK, n - done))):
        done += dst.write(chunk)


def read(path: Path, threads: int | None = None):
    notes: list[str] = []
    lim = limits.current()
    with tempfile.TemporaryDirectory(prefix="tracesql-") as scratch:
        scratch = Path(scratch)
        events_file, meta, located = _events_file(path, scratch)
        # a big trace's events live in a database file in the scratch folder (DuckDB holds at most its memory
        # limit of them); a small one's in memory, which is faster
        on_disk = events_file.stat().st_size > lim.memory_bytes * _ON_DISK_SHARE
        with db.for_trace(threads, lim.memory, scratch / "events.duckdb" if on_disk else None) as con:
            try:
                _load_events(con, path, events_file, notes, lim.max_events)
            except TraceError as e:
                if not located:
                    raise
                size = events_file.stat().st_size
                if size > whole_read_bytes():  # an event DuckDB cannot read (one huge string, deep nesting, no memory)
                    raise _too_large_to_read_whole(path, size, e.problem) from None
                events_file.unlink()
                events_file, meta, _ = _events_file(path, scratch, whole=True)
                _load_events(con, path, events_file, notes, lim.max_events)
            events_file.unlink()
            return _read_events(con, [path], [meta], [notes], lim.max_events, scratch / "slices.arrows")[0]


def read_batch(paths: list[Path], threads: int | None = None) -> list | None:
    """The traces of the small Kineto/Chrome files `paths`, as `read` gives each, from one pass of each statement
    over all their events (a statement's planning, not its events, is most of a tiny trace's cost: an archive of
    thousands of ranks); None when one of them cannot be read so (laid out oddly, damaged, refused, of another
    dialect than the first): the caller then reads them one by one, whose errors name the file."""
    lim = limits.current()
    if lim.max_events:
        return None
    try:
        with tempfile.TemporaryDirectory(prefix="tracesql-") as scratch:
            scratch = Path(scratch)
            files, metas = [], []
            for i, path in enumerate(paths):
                (scratch / str(i)).mkdir()
                events_file, meta, located = _events_file(path, scratch / str(i))
                if not located:
                    return None
                files.append(str(events_file))
                metas.append(meta)
            with db.for_trace(threads, lim.memory) as con:
                con.execute(f"CREATE OR REPLACE TABLE events AS {_TYPED_BATCH}", {"files": files})
                return _read_events(con, paths, metas, [[] for _ in paths], None, scratch / "slices.arrows")
    except (TraceError, duckdb.Error):
        return None


def _read_events(con, paths: list[Path], metas: list[dict], notes: list[list[str]], max_events: int | None,
                 slices_file: Path) -> list | None:
    """The TraceData of each of `paths` (member i: paths[i], whose top-level fields are metas[i]) from table
    `events`. Several members of different dialects: None (read_batch)."""
    from .common import FileMapping, TraceData

    bases = []
    for meta, noted in zip(metas, notes):
        base_time_ns = meta.get("baseTimeNanoseconds") or 0
        if isinstance(base_time_ns, bool) or not isinstance(base_time_ns, int) or not 0 <= base_time_ns < 2**61:
            noted.append(f"baseTimeNanoseconds {str(base_time_ns)[:40]!r} is not a time in ns: ignored")
            base_time_ns = 0
        bases.append(base_time_ns)
    # one member: its base time as a constant; several: each event's member's
    base = {"base": bases[0]} if len(paths) == 1 else {"base": bases}
    # the counts scan the events on a cursor while the next steps run (a trace they refuse raises after them)
    with ThreadPoolExecutor(1, thread_name_prefix="tracesql-counts") as beside:
        counting = beside.submit(db.on_cursor, con, {}, lambda cur: cur.execute(_COUNTS).fetchall())
        try:
            paired = _pair(con, len(paths))
            functions.once(con, _CONSTANTS)
            con.execute(_LOOKUPS)
        except duckdb.Error:
            _check_all_counts(con, paths, counting.result(), max_events, notes)
            raise
    checked = _check_all_counts(con, paths, counting.result(), max_events, notes)
    dialects = _dialects(con, metas)
    if len(set(dialects)) > 1:
        db.clear(con)
        return None
    dialect = dialects[0]
    con.execute("SET VARIABLE dialect = $d", {"d": dialect})
    # Batch by batch into an Arrow file in the scratch folder, which is then memory-mapped: the slices (their
    # `args` text is most of a trace) are file-backed pages the kernel can drop and re-read, not heap memory.
    # The mapping outlives the scratch folder's removal (the file is unlinked, not gone, while mapped).
    reader = con.sql(_based(_SLICES, len(paths)), params=base).to_arrow_reader(1 << 16)
    mapping = FileMapping.of_batches(slices_file, reader.schema, reader)
    slices = mapping.table()
    if dialect != "kineto":  # Kineto's flows repeat the correlation ids its args carry
        slices = _bind_flows(con, slices, base, len(paths))
    fwd_links, linked = _fwd_bwd_links(con, slices, base, len(paths))
    counters = con.sql(_based(_COUNTERS, len(paths)), params=base).to_arrow_table()
    db.clear(con)  # frees the events table (and the rest) before normalizing

    out = []
    member_slices, member_counters = _by_member(slices, len(paths)), _by_member(counters, len(paths))
    member_links = _by_member(fwd_links, len(paths)) if linked else []
    for i, (meta, (skipped, examples, total)) in enumerate(zip(metas, checked)):
        skipped.update(paired[i])
        counters = member_counters[i]
        skipped["counter value that is not a number"] = counters["value"].null_count
        counters = counters.filter(pc.is_valid(counters["value"]))
        dist = meta.pop("distributedInfo", None)
        dist = dist if isinstance(dist, dict) else {}
        rank = dist.get("rank") if isinstance(dist.get("rank"), int) else None
        out.append(TraceData(
            format=FORMAT if dialect == "kineto" else "chrome",
            slices=member_slices[i],
            rank=rank,
            world_size=dist.get("world_size") if isinstance(dist.get("world_size"), int) else None,
            backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
            host_name=meta.get("host_name") or meta.get("hostname"),
            base_time_ns=bases[i],
            event_count=total,
            skipped={reason: n for reason, n in skipped.items() if n},
            examples=examples,
            notes=notes[i],
            metadata={**{k: v for k, v in meta.items() if k != "deviceProperties"},
                      **({"dialect": dialect} if dialect != "kineto" else {})},
            devices=_devices(meta.get("deviceProperties")),
            process_groups=_process_groups(dist),
            counters=counters,
            fwd_links=member_links[i] if i in linked else None,
            mappings=[mapping] if len(paths) == 1 else [],  # (several: each one's slices are copied out)
        ))
    return out


def _based(sql: str, members: int) -> str:
    """`sql` (_SLICES and its like) with the base time (ns) of an event's trace: the parameter $base, or its
    member's in that list."""
    return sql if members == 1 else sql.replace("$base", "$base[member + 1]")


def _by_member(table: pa.Table, members: int) -> list[pa.Table]:
    """`table` (with a `member` column) split into each member's rows, without that column; one member's: the
    rows as they are (the slices stay memory-mapped), several: copied out."""
    rest = table.drop_columns(["member"])
    if members == 1:
        return [rest]
    member = to_numpy(table["member"])
    order = np.argsort(member, kind="stable")
    ends = np.searchsorted(member[order], np.arange(members + 1))
    taken = rest.take(array(order))
    return [taken.slice(ends[i], ends[i + 1] - ends[i]) for i in range(members)]


def _dialects(con, metas: list[dict]) -> list[str]:
    """Each member's dialect: 'tsl' (TSL's processes), else 'kineto' (Kineto's top-level keys, or categories),
    else 'chrome'."""
    tsl = {m for (m,) in con.execute(_TSL_MEMBERS).fetchall()}
    return ["tsl" if i in tsl else "kineto" if any(k in meta for k in KINETO_KEYS)
            or con.execute(_KINETO_CATEGORIES, {"member": i}).fetchone()[0] else "chrome"
            for i, meta in enumerate(metas)]


def _check_all_counts(con, paths: list[Path], counts: list, max_events: int | None, notes: list[list[str]]):
    """_check_counts of each member, from the `_COUNTS` rows of all."""
    by_member: dict[int, list] = {}
    for member, *row in counts:
        by_member.setdefault(member, []).append(row)
    return [_check_counts(con, path, i, by_member.get(i, []), max_events, noted)
            for i, (path, noted) in enumerate(zip(paths, notes))]


def _check_counts(con, path: Path, member: int, counts: list, max_events: int | None, notes: list[str]):
    """(skipped: reason -> count, examples: reason -> the first such event shown, total events) from the
    `_COUNTS` rows of member `member`; a trace with no events or no usable ones is refused here."""
    by_reason = {reason: (n, first) for reason, n, first in counts}
    total = sum(n for n, _ in by_reason.values())
    skipped = {reason: by_reason[i][0] for i, reason in enumerate(_SKIP_REASONS) if i in by_reason}
    firsts = {reason: by_reason[i][1] for i, reason in enumerate(_SKIP_REASONS) if i in by_reason}
    shown = dict(con.execute(_EXAMPLES, {"member": member, "idx": list(set(firsts.values()))}).fetchall()) \
        if firsts else {}
    examples = {reason: shown[idx] for reason, idx in firsts.items()}
    if not total:
        raise TraceError(path, "empty trace: 'traceEvents' has no events")
    if max_events and total == max_events:
        notes.append(f"read only the first {max_events:,} events (--max-events)")
    if total == sum(skipped.values()) + by_reason.get(_OTHER, (0,))[0]:
        if skipped.get("time out of range"):
            example = examples.get("time out of range", "")
            raise TraceError(path, f"no usable timed events: {skipped['time out of range']:,} have times out of "
                                   f"range (e.g. {example}); Chrome trace times are microseconds, and these look "
                                   "like nanoseconds: divide ts and dur by 1000")
        damaged = ", ".join(f"{n:,} {reason}" for reason, n in skipped.items() if n)
        raise TraceError(path, "no timed events (every event lacks a usable ts/dur" +
                         (f"; damaged: {damaged})" if damaged else ")"))
    return skipped, examples, total


def _pair(con, members: int) -> list[dict[str, int]]:
    """Match begin and end events (table `paired`): an end closes the latest open begin of its thread or async
    id. Returns each member's counts of those left unmatched."""
    marks = con.execute(_MARKS).fetchnumpy()
    member_of, open_idx, close_idx, stack = [], [], [], []
    unmatched_ends, unmatched_begins = np.zeros(members, np.int64), np.zeros(members, np.int64)
    current, at = None, 0
    for member, idx, opens, key in zip(marks["member"].tolist(), marks["idx"].tolist(), marks["opens"].tolist(),
                                       marks["pair_key"].tolist()):
        if key != current:
            unmatched_begins[at] += len(stack)
            current, at = key, member
            stack.clear()
        if opens:
            stack.append(idx)
        elif stack:
            member_of.append(member)
            open_idx.append(stack.pop())
            close_idx.append(idx)
        else:
            unmatched_ends[member] += 1
    unmatched_begins[at] += len(stack)
    con.register("pairs", pa.table({"member": array(np.array(member_of, np.int64)),
                                    "open_idx": array(np.array(open_idx, np.int64)),
                                    "close_idx": array(np.array(close_idx, np.int64))}))
    con.execute(_PAIRED)
    return [{"end without a begin": int(unmatched_ends[i]), "begin that never ends": int(unmatched_begins[i])}
            for i in range(members)]


def _member_keys(member: np.ndarray, slice_id: np.ndarray) -> np.ndarray:
    """(member, slice_id) as one number, to match rows of several members' slices."""
    return (member.astype(np.int64) << 40) | slice_id


def _bind_flows(con, slices: pa.Table, base: dict, members: int) -> pa.Table:
    """`slices` with the correlation ids their flows give them (where they have none of their own)."""
    con.register("read_slices", slices)
    bound = con.execute(_based(_FLOW_BINDINGS, members), base).fetchnumpy()
    if not len(bound["slice_id"]):
        return slices
    ids = _member_keys(to_numpy(slices["member"]), to_numpy(slices["slice_id"]))
    order = np.argsort(ids)
    rows = order[np.searchsorted(ids, _member_keys(bound["member"], bound["slice_id"]), sorter=order)]
    correlation = to_numpy(slices["correlation"], fill=0).copy()
    has = ~to_numpy(slices["correlation"].is_null())
    correlation[rows], has[rows] = bound["flow"], True
    column = slices.column_names.index("correlation")
    return slices.set_column(column, "correlation", array(correlation, pa.int64(), ~has))


def _fwd_bwd_links(con, slices: pa.Table, base: dict, members: int) -> tuple[pa.Table | None, set[int]]:
    """(member, slice_id of a backward op, slice_id of the forward op it differentiates) from Kineto's 'fwdbwd'
    flows, and the members that record them (None and none when no trace does)."""
    linked = {m for (m,) in con.execute(_FWD_BWD_MEMBERS).fetchall()}
    if not linked:
        return None, linked
    con.register("read_slices", slices)
    try:
        return con.sql(_based(_FWD_BWD_LINKS, members), params=base).to_arrow_table(), linked
    finally:
        con.unregister("read_slices")


# '{}': TSL writers end the list with one
_EMPTY = "(ph IS NULL AND name IS NULL AND ts IS NULL AND args IS NULL AND pid IS NULL)"
_TIMED_PHASES = SLICE_PHASES + OPENING_PHASES + CLOSING_PHASES + (COUNTER_PHASE,)
# µs bounds that keep every ns time, with the base time added, far from BIGINT overflow (readers.MAX_TS_NS)
_MAX_US = 2**61 // 1000
_ts_ok = f"isfinite(ts) AND abs(ts) < {_MAX_US}"
_dur_ok = f"isfinite(dur) AND dur >= 0 AND dur < {_MAX_US}"
_timed_x = f"NOT malformed AND ph = 'X' AND {_ts_ok}"
_no_dur = "(dur IS NULL OR NOT isfinite(dur))"
_is_step = f"regexp_matches(COALESCE(name, ''), '{STEP_PATTERN}')"
# reason -> the events it skips; each count comes with the first such event as an example
_SKIPS = {
    "malformed event": "malformed",
    "unsupported phase": f"NOT malformed AND (ph IS NULL OR ph NOT IN ({sql_list(_TIMED_PHASES + KNOWN_OTHER_PHASES)})) "
                         f"AND NOT {_EMPTY}",
    "missing or non-numeric ts": f"NOT malformed AND ph IN ({sql_list(_TIMED_PHASES)}) AND (ts IS NULL OR NOT isfinite(ts))",
    "time out of range": f"NOT malformed AND ph IN ({sql_list(_TIMED_PHASES)}) AND isfinite(ts) AND (abs(ts) >= {_MAX_US} "
                         f"OR ph = 'X' AND isfinite(dur) AND dur >= {_MAX_US})",
    "missing dur": f"{_timed_x} AND {_no_dur} AND NOT {_is_step}",
    "end before start": f"{_timed_x} AND isfinite(dur) AND dur < 0",  # (-inf: missing dur)
    "step without end": f"{_timed_x} AND {_no_dur} AND {_is_step}",
}
_SKIP_REASONS = tuple(_SKIPS)
_example = ("COALESCE(ph, '?') || ' ' || COALESCE(name, '?') || ' ts=' || COALESCE(CAST(ts AS VARCHAR), '?') "
            "|| ' dur=' || COALESCE(CAST(dur AS VARCHAR), '?')")
# Each event's reason to be skipped, or "used, not kept as an event" (metadata, flows, '{}'): -1. The reasons
# exclude each other, so one CASE gives each event its reason: a count per reason evaluated every condition (the
# step-name regex too) on every event, twice the time.
_OTHER = -1
_COUNTS = f"""
SELECT member, reason, count(*), min(idx)
FROM (SELECT member, idx, CASE {" ".join(f"WHEN {cond} THEN {i}" for i, cond in enumerate(_SKIPS.values()))}
                       WHEN NOT malformed AND (ph IN ({sql_list(KNOWN_OTHER_PHASES)}) OR {_EMPTY}) THEN {_OTHER}
                  END AS reason
      FROM events)
GROUP BY member, reason
"""
# the first skipped event of each reason, shown (apart from the counts: formatting every row costs a third of them)
_EXAMPLES = f"SELECT idx, {_example} FROM events WHERE member = $member AND list_contains($idx, idx)"
_KEEP = f"NOT malformed AND ph IN ({sql_list(SLICE_PHASES)}) AND {_ts_ok} AND (ph <> 'X' OR ({_dur_ok}))"
# Begin/end events, in the order they are matched: a thread's B/E pair on that thread; async ones (b/e, S/F) on
# their (process, category, id).
_MARKS = f"""
SELECT member, idx, ph IN ({sql_list(OPENING_PHASES)}) AS opens,
    dense_rank() OVER (ORDER BY member, CASE WHEN ph IN ('B', 'E') THEN 'thread ' || CAST(pid AS VARCHAR) || ' ' || CAST(tid AS VARCHAR)
        ELSE 'async ' || CAST(pid AS VARCHAR) || ' ' || COALESCE(cat, '') || ' '
             || COALESCE(CAST(id AS VARCHAR), CAST(id2 AS VARCHAR), '') END) AS pair_key
FROM events
WHERE NOT malformed AND ph IN ({sql_list(OPENING_PHASES + CLOSING_PHASES)}) AND {_ts_ok}
ORDER BY pair_key, ts, idx
"""
# A matched pair as one complete event: the begin's fields, the end's args merged in (as Chrome shows them). Async
# slices go on a track of their own per name ('async <name>'), beside the threads of their process.
_PAIRED = """
CREATE OR REPLACE TABLE paired AS
SELECT o.member, o.idx, false AS malformed, 'X' AS ph, o.cat, o.name, o.pid,
    CASE WHEN o.ph = 'B' THEN o.tid ELSE to_json('async ' || COALESCE(o.name, '')) END AS tid,
    o.ts, c.ts - o.ts AS dur,
    CASE WHEN json_type(c.args) = 'OBJECT' AND CAST(c.args AS VARCHAR) <> '{}'
         THEN json_merge_patch(COALESCE(o.args, '{}'), c.args) ELSE o.args END AS args,
    o.id, o.id2
FROM pairs p JOIN events o ON o.member = p.member AND o.idx = p.open_idx
JOIN events c ON c.member = p.member AND c.idx = p.close_idx
"""
_category_kinds = ", ".join(f"('{c}', '{k}')" for c, k in CATEGORY_KINDS.items())
_name_kinds = ", ".join(f"('{c}', '{n}', '{k}')" for (c, n), k in NAME_KINDS.items())
_device_kinds = sql_list(DEVICE_KINDS)
# Labels: pid/tid values that are not integers ('Spans', ...) get negative ids, per column in order of first
# appearance; process/thread names come from the first process_name/thread_name metadata event.
_LOOKUPS = f"""
CREATE OR REPLACE VIEW kept AS SELECT * FROM events WHERE {_KEEP} UNION ALL BY NAME SELECT * FROM paired;
-- each distinct (pid, tid) of the events with a lane (kept ones and counters): where it first appears, and
-- whether kept events have it; the lookups below read these few rows, not the events
CREATE OR REPLACE TABLE lanes AS
    SELECT member, pid, tid, min(idx) AS first, bool_or(kept) AS kept
    FROM (SELECT member, idx, pid, tid, true AS kept FROM kept
          UNION ALL SELECT member, idx, pid, tid, false FROM events
          WHERE NOT malformed AND ph = '{COUNTER_PHASE}' AND {_ts_ok})
    GROUP BY member, pid, tid;
CREATE OR REPLACE TABLE labels AS
    WITH firsts AS (
        SELECT member, 0 AS col, COALESCE(json_extract_string(pid, '$'), 'None') AS label, min(first) AS first
        FROM lanes WHERE TRY_CAST(pid AS BIGINT) IS NULL GROUP BY 1, 3
        UNION ALL
        SELECT member, 1, COALESCE(json_extract_string(tid, '$'), 'None'), min(first)
        FROM lanes WHERE TRY_CAST(tid AS BIGINT) IS NULL GROUP BY 1, 3
    )
    SELECT member, col, label, -row_number() OVER (PARTITION BY member ORDER BY col, first) AS id FROM firsts;
CREATE OR REPLACE TABLE process_names AS
    SELECT member, TRY_CAST(pid AS BIGINT) AS pid, arg_min(args ->> 'name', idx) AS label FROM events
    WHERE ph = 'M' AND name = 'process_name' AND json_type(pid) IN ('UBIGINT', 'BIGINT')
      AND json_type(args -> 'name') = 'VARCHAR'
    GROUP BY 1, 2;
-- threads of a process that share a name (a pool's workers) keep apart: the tid joins the name
CREATE OR REPLACE TABLE thread_names AS
    SELECT member, pid, tid,
        label || CASE WHEN count(*) OVER (PARTITION BY member, pid, label) > 1 THEN ' ' || tid ELSE '' END AS label
    FROM (
        SELECT member, TRY_CAST(pid AS BIGINT) AS pid, TRY_CAST(tid AS BIGINT) AS tid,
            arg_min(args ->> 'name', idx) AS label
        FROM events
        WHERE ph = 'M' AND name = 'thread_name' AND json_type(pid) IN ('UBIGINT', 'BIGINT')
          AND json_type(tid) IN ('UBIGINT', 'BIGINT') AND json_type(args -> 'name') = 'VARCHAR'
        GROUP BY 1, 2, 3
    );
-- the maps' keys start with the member ('3:'): a process id is its trace's
SET VARIABLE pid_label_id = (SELECT map(list(member || ':' || label), list(id)) FROM labels WHERE col = 0);
SET VARIABLE tid_label_id = (SELECT map(list(member || ':' || label), list(id)) FROM labels WHERE col = 1);
SET VARIABLE label_of = (SELECT map(list(member || ':' || id), list(label)) FROM labels);
SET VARIABLE process_name = (SELECT map(list(member || ':' || pid), list(label)) FROM process_names);
SET VARIABLE thread_name = (SELECT map(list(member || ':' || pid || '/' || tid), list(label)) FROM thread_names);
-- TSL (JAX/TensorFlow): '/device:GPU:N' processes are devices, their 'Stream #S(...)' threads streams
SET VARIABLE tsl_device = (SELECT map(list(member || ':' || pid),
                                      list(CAST(regexp_extract(label, '{TSL_DEVICE}', 1) AS BIGINT)))
                           FROM process_names WHERE regexp_matches(label, '{TSL_DEVICE}'));
SET VARIABLE tsl_stream = (SELECT map(list(member || ':' || pid || '/' || tid),
                                      list(CAST(regexp_extract(label, '{TSL_STREAM}', 1) AS BIGINT)))
                           FROM thread_names WHERE regexp_matches(label, '{TSL_STREAM}'));
SET VARIABLE tsl_streamed = (SELECT list(DISTINCT member || ':' || pid) FROM thread_names
                             WHERE regexp_matches(label, '{TSL_STREAM}'));
-- the kept events' lanes, each once (not each event): its lane ids and its name as a host track
CREATE OR REPLACE TABLE kept_lanes AS
    SELECT member, pid, tid, pid_id, tid_id,
        process_label(member, pid_id) || ' / ' || thread_label(member, pid_id, tid_id) AS host_track
    FROM (SELECT member, pid, tid, lane_id(member, pid, 'pid_label_id') AS pid_id,
              lane_id(member, tid, 'tid_label_id') AS tid_id
          FROM lanes WHERE kept);
"""
# What does not depend on the trace: made once on a connection (functions.once), which db.for_trace keeps for the next trace
_CONSTANTS = f"""
SET VARIABLE category_kind = (SELECT map(list(cat), list(kind)) FROM (VALUES {_category_kinds}) t(cat, kind));
SET VARIABLE name_kind = (SELECT map(list(cat || chr(0) || name), list(kind))
                          FROM (VALUES {_name_kinds}) t(cat, name, kind));
-- (of member m: the lookups' maps are keyed by member)
CREATE OR REPLACE MACRO lane_id(m, v, labels) AS
    COALESCE(TRY_CAST(v AS BIGINT), getvariable(labels)[m || ':' || COALESCE(json_extract_string(v, '$'), 'None')]);
CREATE OR REPLACE MACRO process_label(m, p) AS
    COALESCE(NULLIF(getvariable('process_name')[m || ':' || p], ''), NULLIF(getvariable('label_of')[m || ':' || p], ''),
             'process ' || p);
CREATE OR REPLACE MACRO thread_label(m, p, t) AS
    COALESCE(NULLIF(getvariable('thread_name')[m || ':' || p || '/' || t], ''),
             NULLIF(getvariable('label_of')[m || ':' || t], ''), 'thread ' || t);
-- µs as double -> integer ns, rounding the fraction on its own so epoch-scale values keep the ns
CREATE OR REPLACE MACRO us_to_ns(us) AS
    CAST(floor(us) AS BIGINT) * 1000 + CAST(round_even((us - floor(us)) * 1000, 0) AS BIGINT);
"""
# What decides a trace's dialect (_dialects): the members whose processes are TSL's; whether a member's events
# have Kineto's categories
_TSL_MEMBERS = f"""
SELECT DISTINCT member FROM process_names WHERE label = '{TSL_HOST}' OR regexp_matches(label, '{TSL_DEVICE}')
"""
_KINETO_CATEGORIES = """
SELECT EXISTS (SELECT 1 FROM kept WHERE member = $member AND getvariable('category_kind')[lower(cat)] IS NOT NULL)
"""
# What an event is: Kineto's category says; in TSL traces where it ran and its XLA stats say (as the XPlane reader
# decides from the same stats); other producers' events are host annotations.
_KIND = f"""
CASE WHEN e.name = '[memory]' THEN 'memory'
     WHEN e.ph <> 'X' THEN 'instant'
     WHEN getvariable('dialect') = 'kineto' THEN
         COALESCE(getvariable('name_kind')[lower(e.cat) || chr(0) || e.name], getvariable('category_kind')[lower(e.cat)],
                  'other')
     WHEN getvariable('tsl_device')[e.member || ':' || e.pid_id] IS NOT NULL THEN CASE
         WHEN getvariable('tsl_stream')[e.member || ':' || e.pid_id || '/' || e.tid_id] IS NULL THEN
             CASE WHEN thread_label(e.member, e.pid_id, e.tid_id) = 'XLA Ops'
                       AND NOT list_contains(COALESCE(getvariable('tsl_streamed'), []), e.member || ':' || e.pid_id)
                  THEN 'kernel' ELSE 'gpu_annotation' END
         WHEN json_exists(e.args, '$.memcpy_details') THEN 'memcpy'
         WHEN json_exists(e.args, '$.memset_details') THEN 'memset'
         ELSE 'kernel' END
     WHEN getvariable('dialect') = 'tsl' AND process_label(e.member, e.pid_id) = '{TSL_HOST}' THEN CASE
         WHEN json_exists(e.args, '$.correlation_id') THEN 'runtime'
         WHEN json_exists(e.args, '$.hlo_op') AND json_exists(e.args, '$.device_ordinal') THEN 'kernel'
         WHEN e.dur <= 1e-6 THEN 'instant'  -- TSL writes a zero-length event as 1 ps long
         WHEN starts_with(e.name, '$') THEN 'python_function'
         ELSE 'user_annotation' END
     ELSE COALESCE(getvariable('category_kind')[lower(e.cat)], 'user_annotation')
END"""
# One pass over the kept events with no sort, so the result streams out in batches: the small lookups are maps
# held in variables, or the small table of lanes (joined, on its side of a hash join). Rows may come out of
# order; slice_id (the event's index in traceEvents) says which.
# Kineto puts a device event's device in pid and its stream in tid, unless args say otherwise.
_SLICES = f"""
SELECT t.idx AS slice_id, t.kind, t.cat AS category,
    -- jax.profiler.StepTraceAnnotation: the step name normalize recognizes (the annotation's name stays in args)
    CASE WHEN t.step_num IS NOT NULL THEN 'ProfilerStep#' || t.step_num ELSE t.name END AS name,
    us_to_ns(t.ts) + $base AS ts,
    CASE WHEN t.ph = 'X' THEN us_to_ns(t.dur) ELSE 0 END AS dur,
    t.pid_id AS pid, t.tid_id AS tid,
    -- a device id no INTEGER holds: readers.BAD_DEVICE_ID, which read_trace skips and counts
    CASE WHEN t.on_device THEN COALESCE(TRY_CAST(t.lane_device AS INTEGER), -2147483648) END AS device_id,
    CASE WHEN t.on_device THEN t.lane_stream END AS stream,
    CASE WHEN t.on_device THEN 'device ' || t.lane_device || ' / stream ' || t.lane_stream
         ELSE t.host_track END AS track,
    COALESCE(TRY_CAST(t.links[3] AS BIGINT), TRY_CAST(t.links[5] AS BIGINT)) AS correlation,
    TRY_CAST(t.links[4] AS BIGINT) AS external_id,
    CASE WHEN t.step_num IS NOT NULL THEN json_merge_patch(t.args, json_object('annotation', t.name))
         ELSE t.args END AS args,
    t.member
FROM (
  SELECT *, kind IN ({_device_kinds}) AS on_device,
      COALESCE(TRY_CAST(links[1] AS BIGINT), getvariable('tsl_device')[member || ':' || pid_id],
               TRY_CAST(links[6] AS BIGINT), pid_id) AS lane_device,
      COALESCE(TRY_CAST(links[2] AS BIGINT), getvariable('tsl_stream')[member || ':' || pid_id || '/' || tid_id], tid_id)
          AS lane_stream,
      CASE WHEN getvariable('dialect') = 'tsl' AND kind = 'user_annotation' THEN TRY_CAST(links[7] AS BIGINT)
      END AS step_num
  FROM (
    SELECT *, {_KIND} AS kind
    FROM (
      SELECT k.*, l.pid_id, l.tid_id, l.host_track,
          json_extract_string(k.args, ['$.device', '$.stream', '$.correlation', '$."External id"',
                                       '$.correlation_id', '$.device_ordinal', '$.step_num']) AS links
      FROM kept k JOIN kept_lanes l
        ON k.member = l.member AND k.pid IS NOT DISTINCT FROM l.pid AND k.tid IS NOT DISTINCT FROM l.tid
    ) e
  )
) t
"""
# One row per series of each counter event ({{"allocated": 1000, "reserved": 4000}}: two series).
_COUNTERS = f"""
SELECT CASE WHEN e.id IS NULL THEN e.name ELSE e.name || ' ' || json_extract_string(e.id, '$') END AS name,
    a.key AS series, process_label(e.member, lane_id(e.member, e.pid, 'pid_label_id')) AS track, NULL AS device_id,
    us_to_ns(e.ts) + $base AS ts,
    CASE WHEN a.type IN ('UBIGINT', 'BIGINT', 'DOUBLE') THEN CAST(a.value AS DOUBLE) END AS value,  -- NULL: no number
    e.member
FROM events e, json_each(e.args) a
WHERE NOT e.malformed AND e.ph = '{COUNTER_PHASE}' AND {_ts_ok.replace('ts', 'e.ts')}
"""
# Flow events bound to the slice that encloses them on their thread (the innermost: the latest to start; instants
# bind nothing), whose
# correlation id they become. Ids that are not integers ('0x1f') are hashed to one.
_FLOW_BINDINGS = f"""
WITH flows AS (
    SELECT member, lane_id(member, pid, 'pid_label_id') AS pid, lane_id(member, tid, 'tid_label_id') AS tid,
        us_to_ns(ts) + $base AS ts,
        COALESCE(TRY_CAST(id AS BIGINT), CAST(hash(CAST(id AS VARCHAR)) >> 2 AS BIGINT)) AS flow
    FROM events WHERE NOT malformed AND ph IN ({sql_list(FLOW_PHASES)}) AND {_ts_ok} AND id IS NOT NULL
)
SELECT s.member, s.slice_id, min(f.flow) AS flow
FROM flows f ASOF JOIN (SELECT * FROM read_slices WHERE kind <> 'instant') s
    ON f.member = s.member AND f.pid = s.pid AND f.tid = s.tid AND f.ts >= s.ts
WHERE f.ts <= s.ts + s.dur AND s.correlation IS NULL
GROUP BY 1, 2
"""
_FWD_BWD_MEMBERS = f"""
SELECT DISTINCT member FROM events WHERE NOT malformed AND ph IN ('s', 'f') AND lower(cat) = 'fwdbwd'
"""
# Kineto links a backward op to the forward op of the same autograd node with a 'fwdbwd' flow: its start ('s') at
# the forward op's start on the forward thread, its end ('f') at the backward op's start on the autograd thread.
# Each end binds to the op that starts there: the latest-starting cpu_op of that thread that encloses it (an
# ASOF join: no range join), the innermost (shortest) of those starting at the same instant.
_FWD_BWD_LINKS = f"""
WITH flows AS (
    SELECT member, ph, lane_id(member, pid, 'pid_label_id') AS pid, lane_id(member, tid, 'tid_label_id') AS tid,
        us_to_ns(ts) + $base AS ts,
        COALESCE(TRY_CAST(id AS BIGINT), CAST(hash(CAST(id AS VARCHAR)) >> 2 AS BIGINT)) AS flow
    FROM events
    WHERE NOT malformed AND ph IN ('s', 'f') AND lower(cat) = 'fwdbwd' AND {_ts_ok} AND id IS NOT NULL
), ops AS (
    SELECT member, slice_id, pid, tid, ts, dur FROM read_slices WHERE kind = 'cpu_op'
), starts AS (
    SELECT f.member, f.ph, f.flow, f.pid, f.tid, o.ts AS op_ts
    FROM flows f ASOF JOIN ops o ON f.member = o.member AND f.pid = o.pid AND f.tid = o.tid AND f.ts >= o.ts
), bound AS (
    SELECT s.member, s.ph, s.flow, arg_min(o.slice_id, o.dur) AS slice_id
    FROM starts s JOIN ops o ON o.member = s.member AND o.pid = s.pid AND o.tid = s.tid AND o.ts = s.op_ts
    GROUP BY s.member, s.ph, s.flow
)
SELECT b.member, b.slice_id, min(f.slice_id) AS fwd_slice_id
FROM bound b JOIN bound f ON f.member = b.member AND f.flow = b.flow AND f.ph = 's' AND b.ph = 'f'
GROUP BY b.member, b.slice_id
"""


def _devices(props) -> list[dict]:
    out = []
    for p in props if isinstance(props, list) else []:
        if not isinstance(p, dict) or not isinstance(p.get("id"), int):
            continue
        major, minor = p.get("computeMajor"), p.get("computeMinor")
        out.append(
            {
                "device_id": p["id"],
                "name": p.get("name") or None,
                "total_memory_bytes": p.get("totalGlobalMem"),
                "compute_capability": f"{major}.{minor}" if major is not None else p.get("gcnArchName"),
                "sm_count": p.get("numSms"),
                "properties": p,
            }
        )
    return out


def _process_groups(dist) -> list[dict]:
    if not isinstance(dist, dict):
        return []
    groups = []
    for g in dist.get("pg_config") or []:
        if not isinstance(g, dict):
            continue
        ranks = g.get("ranks")
        groups.append(
            {
                "pg_name": str(g.get("pg_name")) if g.get("pg_name") is not None else None,
                "pg_desc": g.get("pg_desc"),
                "backend": g.get("backend_config"),
                "group_size": g.get("pg_size"),
                "group_ranks": [r for r in ranks if isinstance(r, int)] if isinstance(ranks, list) else None,
            }
        )
    return groups
