"""Readers: one module per source format, listed in READERS.

Each reader module has `FORMAT` (its name), `SUFFIXES` (file name endings it is looked for under, when a folder
is ingested), `detect(path, head) -> bool` (head: the first bytes of the file, decompressed) and
`read(path, threads=None) -> TraceData` (or a list of them, one per process, for a file that holds
several processes). A reader turns one file into the common schema's host/device
events (`slices` columns that need no cross-event reasoning) plus the file's metadata; everything that links
events (nesting, launches, steps, ops, collectives, memory) is format-agnostic and lives in `normalize`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from .. import limits
from ..arrays import array, to_numpy
from ..errors import TraceError
from . import ascend, ascend_db, graph_capture, kineto, nsys, perfetto, rocpd, rocprof, rocprof_csv, xplane
from .common import (  # noqa: F401  (the readers' shared helpers, also reachable as tracesql.readers.X)
    MAX_NAME_CHARS, OUT_BATCH_ROWS, READER_SLICE_TYPES, READER_SLICE_COLUMNS, DICTIONARY_COLUMNS, READER_SLICE_SCHEMA,
    slices_from_columns, as_reader_slices, mapped_slices, RowBatches, Budget, READER_COUNTER_TYPES,
    TraceData, FileMapping, HEAD_BYTES, read_bytes, INFLATE_FREE_BYTES, MAX_INFLATE_RATIO,
    max_inflate_ratio, inflated, mapped_content, read_head, BAD_DEVICE_ID, fit_device_ids,
)

#: Tried in order; the first whose detect() says yes reads the file.
READERS = [rocprof, rocprof_csv, ascend, kineto, xplane, perfetto, ascend_db, rocpd, nsys]
# ascend (by name) before kineto: both Chrome JSON; xplane (by name) before perfetto (by content): both protobuf;
# ascend_db and rocpd (by their tables) before nsys, which takes any SQLite file


def trace_suffixes() -> tuple[str, ...]:
    return tuple(sorted({suffix for reader in READERS for suffix in reader.SUFFIXES}))


def is_companion(path: Path) -> bool:
    """A file found in a folder that belongs to another file's export and is no trace of its own (torch_npu's
    communication.json beside its trace_view.json): not ingested on its own."""
    return any(getattr(reader, "is_companion", None) and reader.is_companion(path) for reader in READERS)


#: SQLite databases of other tools, known by a table name only they have: what the file is, what to give instead
_OTHER_DATABASES = (
    (re.compile(r"^rocpd_op$"), "an RPD database (rocmProfileData's rocpd_op/rocpd_api tables), which tracesql does "
     "not read: convert it with rocmProfileData's rpd2tracing.py FILE trace.json and ingest the JSON"),
    (re.compile(r"^rocpd_"), "a rocpd database without rocprofv3's views (rocpd_kernel_dispatch, rocpd_region, ...), "
     "which tracesql does not read: convert it with rocpd convert -i FILE --output-format csv and ingest the folder"),
    (re.compile(r"^KERN$"), "a rocprof (v1) results database (its KERN table), which tracesql does not read: profile "
     "with rocprofv3 and ingest its <pid>_results.db"),
    (re.compile(r"^compute_workload$"), "a rocprof-compute (Omniperf) database of counters per kernel, not a trace: "
     "profile with rocprofv3 --kernel-trace and ingest its <pid>_results.db"),
    (re.compile(r"^StepTraceTime$"), "torch_npu's analysis.db (its own analyses of a run), not a trace: ingest the "
     "export's ascend_pytorch_profiler_<rank>.db or ASCEND_PROFILER_OUTPUT/trace_view.json"),
    (re.compile(r"^TASK$"), "an msprof (CANN) database without torch_npu's tables, which tracesql does not read: "
     "profile with torch_npu.profiler and ingest its ASCEND_PROFILER_OUTPUT/trace_view.json"),
)


#: Other tools' files no reader reads, known by their name: what the file is, what to give instead
_OTHER_FILES = (
    ((".nsys-rep", ".qdrep"), "an Nsight Systems report, which tracesql does not read: export it with nsys export "
     "--type sqlite FILE and ingest the .sqlite"),
    ((".ncu-rep",), "an Nsight Compute report (counters per kernel, no timeline), not a trace: profile with nsys and "
     "ingest nsys export --type sqlite of its report"),
    ((".otf2",), "an OTF2 archive, which tracesql does not read: with rocprofv3, ingest its <pid>_results.db (or "
     "--output-format json)"),
)


def _other_database(path: Path, head: bytes) -> str | None:
    """What an SQLite file no reader reads looks like, when it is another tool's database."""
    if not head.startswith(b"SQLite format 3\x00"):
        return None
    names = ascend_db.tables(path)
    return next((what for table, what in _OTHER_DATABASES if any(table.match(n) for n in names)), None)


def reader_for(path: Path):
    """The reader module that understands `path`, or a TraceError saying why none does."""
    head = read_head(path)
    if not head:
        raise TraceError(path, "empty file" if path.stat().st_size == 0 else "not a trace: no readable content")
    for reader in READERS:
        if reader.detect(path, head):
            other = _other_database(path, head) if reader is nsys else None  # nsys takes any SQLite file
            if other:
                raise TraceError(path, other)
            return reader
    other = next((what for suffixes, what in _OTHER_FILES if path.name.lower().endswith(suffixes)), None)
    if other:
        raise TraceError(path, other)
    encoding = _json_encoding(head)
    if encoding == "utf-8-sig":
        raise TraceError(path, "JSON that starts with a UTF-8 byte-order mark (EF BB BF), which tracesql does not read: "
                               "remove those first 3 bytes")
    if encoding:
        raise TraceError(path, f"JSON encoded as {encoding.upper()}: tracesql reads JSON in UTF-8 (re-encode it, "
                               f"e.g. `iconv -f {encoding.upper()} -t UTF-8`)")
    raise TraceError(path, f"not a trace tracesql can read (formats: {', '.join(r.FORMAT for r in READERS)})")


def _json_encoding(head: bytes) -> str | None:
    """The encoding of a head that is JSON in anything but plain UTF-8 (UTF-16/32, a byte-order mark), as
    json.detect_encoding names it; None otherwise."""
    import json

    encoding = json.detect_encoding(head)
    if encoding == "utf-8":
        return None
    text = head.decode(encoding, "ignore").lstrip("\ufeff \t\r\n")
    return encoding if text[:1] in ("{", "[") else None


_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_.]?(\d+)", re.IGNORECASE)
#: Times (ns) a slice may have: start within ±MAX_TS_NS, duration below MAX_DUR_NS, so that no sum or
#: difference of two of them overflows a BIGINT.
MAX_TS_NS = 2**62
MAX_DUR_NS = 2**61


def rank_from_file_name(path: Path) -> int | None:
    """'rank-3.json.gz', 'worker_12.xplane.pb' -> the rank the name gives, if any."""
    m = _RANK_IN_NAME.search(path.name)
    return int(m.group(1)) if m and int(m.group(1)) < 2**31 else None


def _filter_batches(data: TraceData, keep_of) -> int:
    """Keep the slices for which `keep_of(batch) -> bool numpy array` says so, a batch at a time (a mapped
    table stays mapped where nothing is dropped). Returns how many were dropped."""
    batches, dropped = [], 0
    for batch in data.slices.to_batches():
        keep = keep_of(batch)
        kept = int(keep.sum())
        if kept < batch.num_rows:
            dropped += batch.num_rows - kept
            batch = batch.filter(array(keep))
        batches.append(batch)
    if dropped:
        data.slices = pa.Table.from_batches(batches, data.slices.schema)
    return dropped


def _drop_out_of_range(data: TraceData) -> None:
    def in_range(batch):
        ts, dur = to_numpy(batch["ts"], fill=MAX_TS_NS), to_numpy(batch["dur"], fill=-1)  # (numpy: no pandas)
        return (ts > -MAX_TS_NS) & (ts < MAX_TS_NS) & (dur >= 0) & (dur < MAX_DUR_NS)

    def device_in_range(batch):
        return to_numpy(batch["device_id"], fill=0) != BAD_DEVICE_ID

    for reason, keep_of in (("time out of range", in_range), ("device id out of range", device_in_range)):
        dropped = _filter_batches(data, keep_of)
        if dropped:
            data.skipped[reason] = data.skipped.get(reason, 0) + dropped


def _keep_first_events(data: TraceData, max_events: int) -> None:
    """For readers that cannot stop early (--max-events): keep the first `max_events` slices."""
    total = data.slices.num_rows
    if total > max_events:
        last = pc.max(pc.bottom_k_unstable(data.slices["slice_id"], max_events)).as_py()
        _filter_batches(data, lambda batch: to_numpy(batch["slice_id"]) <= last)
        data.notes.append(f"kept only the first {max_events:,} of {total:,} events (--max-events)")


def _captures(paths: list[Path], rank: int | None, threads: int | None) -> list[graph_capture.Capture]:
    """The capture regions of the graph-capture traces `paths` that may be of `rank` (a file whose name gives
    another rank is not read)."""
    out = []
    for path in paths:
        named = rank_from_file_name(path)
        if rank is None or named is None or named == rank:
            for data in read_trace(path, threads=threads):
                out += graph_capture.captures_of(data, f"{path.parent.name}/{path.name}")
    return out


def read_trace(path: Path, threads: int | None = None, captures: list[Path] = ()) -> list[TraceData]:
    """The file's traces: one, or one per process when a file holds several (an Nsight export of an MPI job).
    A single trace whose content names no rank takes the one its file name gives (any format). `captures`: the
    graph-capture traces that attribute its CUDA/HIP-graph replays to ops (graph_capture.attribute)."""
    try:
        read = reader_for(path).read(path, threads=threads)
    except RecursionError:  # the JSON and protobuf decoders recurse once per nesting level
        raise TraceError(path, "nested too deeply to read (thousands of levels: a damaged or hostile file)") from None
    return _checked(path, read if isinstance(read, list) else [read], threads, captures)


def read_batch(paths: list[Path], threads: int | None = None) -> list[list[TraceData]] | None:
    """The traces of the small files `paths`, each as read_trace gives them, read together when they are all
    Kineto/Chrome JSON (kineto.read_batch: one pass of each statement over all their events); None when they are
    not, or cannot be read so: read_trace then reads each, and its errors name the file."""
    try:
        if any(reader_for(path) is not kineto for path in paths):
            return None
    except TraceError:
        return None
    read = kineto.read_batch(paths, threads)
    return None if read is None else [_checked(path, [data], threads, ()) for path, data in zip(paths, read)]


def _checked(path: Path, traces: list[TraceData], threads: int | None, captures: list[Path]) -> list[TraceData]:
    """The traces a reader read from `path`, their ranks checked (or taken from the file name), out-of-range
    slices dropped, --max-events applied and graph replays attributed."""
    for data in traces:  # what the ranks table holds (INTEGER): a larger value is the file's damage, not a rank
        for what in ("rank", "world_size"):
            value = getattr(data, what)
            if value is not None and not (isinstance(value, int) and (0 if what == "rank" else 1) <= value < 2**31):
                data.notes.append(f"{what} {str(value)[:40]} is out of range: ignored")
                setattr(data, what, None)
    if len(traces) == 1 and traces[0].rank is None:
        traces[0].rank = rank_from_file_name(path)
    max_events = limits.current().max_events
    for data in traces:
        _drop_out_of_range(data)
        if max_events:
            _keep_first_events(data, max_events)
        missing = set(READER_SLICE_COLUMNS) - set(data.slices.column_names)
        assert not missing, f"reader {data.format} left out {missing}"
        if captures:
            graph_capture.attribute(data, lambda rank: _captures(captures, rank, threads))
    return traces
