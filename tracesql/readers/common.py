"""What every reader shares: the slice and counter columns a reader hands on (`TraceData`), building them from
Python lists or streamed batches, memory-mapped scratch files, and reading (gunzipping) a file's content safely.

The reader modules import these from here, never from the `readers` package (which imports them: a circle).
"""

from __future__ import annotations

import contextlib
import gzip
import mmap
import os
import re
import threading
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from .. import limits
from ..errors import TraceError, env_number

#: Names a reader looks up by id (string tables, kernel symbols, interned names, track names) are cut to this
#: many characters: each row that names one gets a copy, so one huge name must not be multiplied by the rows.
MAX_NAME_CHARS = 8192
#: Rows per batch of the slices a reader streams out of DuckDB: with names cut to MAX_NAME_CHARS, a batch's names
#: are at most 16 MB whatever the input.
OUT_BATCH_ROWS = 2048

#: Columns a reader's `slices` table must have (normalize adds the rest of `schema.TABLES['slices']`), with the
#: Arrow type of each; text columns with few distinct values are dictionary-encoded.
READER_SLICE_TYPES = {
    "slice_id": pa.int64(), "kind": pa.string(), "category": pa.string(), "name": pa.string(),
    "ts": pa.int64(), "dur": pa.int64(), "pid": pa.int64(), "tid": pa.int64(), "device_id": pa.int32(),
    "stream": pa.int64(), "track": pa.string(), "correlation": pa.int64(), "external_id": pa.int64(),
    "args": pa.string(),
}
READER_SLICE_COLUMNS = list(READER_SLICE_TYPES)
DICTIONARY_COLUMNS = ("kind", "category", "name", "track")


#: The schema of the slices a reader streams to its scratch file: text columns with few distinct values
#: dictionary-encoded per batch (kernel names repeat: it halves the bytes written and mapped).
READER_SLICE_SCHEMA = pa.schema({name: pa.dictionary(pa.int32(), type_) if name in DICTIONARY_COLUMNS else type_
                                 for name, type_ in READER_SLICE_TYPES.items()})


def slices_from_columns(columns: dict[str, list]) -> pa.Table:
    """A reader's slices from Python lists, one per column (a column left out is all NULL); slice_id numbers the
    rows unless given."""
    n = len(next(iter(columns.values())))
    arrays = {}
    for name, type_ in READER_SLICE_TYPES.items():
        if name in columns:
            array = pa.array(columns[name], type_)
        else:
            array = pa.array(range(n), type_) if name == "slice_id" else pa.nulls(n, type_)
        arrays[name] = pc.dictionary_encode(array) if name in DICTIONARY_COLUMNS else array
    return pa.table(arrays)


#: What a reader puts in `device_id` for a device id that no INTEGER holds (2^40): read_trace skips the event
#: and counts it ("device id out of range"), so one damaged event never fails the file.
BAD_DEVICE_ID = -2**31


def fit_device_ids(column: pa.Array) -> pa.Array:
    """An integer `device_id` column with the values outside INTEGER's range set to BAD_DEVICE_ID."""
    if not pa.types.is_integer(column.type) or column.type.bit_width <= 32 and column.type != pa.uint32():
        return column
    out_of_range = pc.or_(pc.less(column, -2**31 + 1), pc.greater(column, 2**31 - 1))
    return pc.if_else(pc.fill_null(out_of_range, False), pa.scalar(BAD_DEVICE_ID, column.type), column)


def as_reader_slices(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch with the reader slice columns (any order, any subset: the rest NULL) in READER_SLICE_SCHEMA."""
    n, columns = batch.num_rows, []
    for name, type_ in READER_SLICE_TYPES.items():
        column = batch.column(name) if name in batch.schema.names else pa.nulls(n, type_)
        column = (fit_device_ids(column) if name == "device_id" else column).cast(type_)
        columns.append(pc.dictionary_encode(column) if name in DICTIONARY_COLUMNS else column)
    return pa.record_batch(columns, schema=READER_SLICE_SCHEMA)


def mapped_slices(path: Path, batches) -> FileMapping:
    """Slices streamed batch by batch (`batches`: record batches with reader slice columns) into the Arrow file
    `path`, memory-mapped: what a reader hands on as `TraceData.slices` without holding them in memory."""
    return FileMapping.of_batches(path, READER_SLICE_SCHEMA, (as_reader_slices(b) for b in batches if b.num_rows))


#: Columns of a reader's `counters` table (normalize adds run_id and rank).
READER_COUNTER_TYPES = {
    "name": pa.string(), "series": pa.string(), "track": pa.string(), "device_id": pa.int32(),
    "ts": pa.int64(), "value": pa.float64(),
}


class RowBatches:
    """Rows added one at a time (a dict each), taken as Arrow record batches of `schema` once BATCH rows or
    BATCH_TEXT characters of text are held: a reader streams them out without holding a Python object per event
    for the whole file, and a few huge values cannot make one batch huge. `numbered`: a column numbering the rows
    from 0 (`slice_id`)."""

    BATCH = 1 << 16
    BATCH_TEXT = 16 << 20

    def __init__(self, schema: pa.Schema, numbered: str | None = None):
        self.schema, self.numbered = schema, numbered
        self._rows: list[dict] = []
        self.rows = self._text = 0

    def add(self, row: dict, text: int) -> pa.RecordBatch | None:
        """One row (a column it lacks is NULL) holding `text` characters of text; the rows so far as a batch when
        they fill one."""
        self._rows.append(row)
        self._text += text
        if len(self._rows) >= self.BATCH or self._text >= self.BATCH_TEXT:
            return self.take()
        return None

    def take(self) -> pa.RecordBatch:
        """The rows added since the last batch, as one."""
        rows, n = self._rows, len(self._rows)
        columns = [_array(range(self.rows, self.rows + n) if name == self.numbered else [r.get(name) for r in rows],
                          type_) for name, type_ in zip(self.schema.names, self.schema.types)]
        self.rows += n
        self._rows, self._text = [], 0
        return pa.record_batch(columns, schema=self.schema)


#: A lone UTF-16 surrogate in a str (json joins each escaped pair into one character; a lone one stays)
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _array(values: list, type_: pa.DataType) -> pa.Array:
    """pa.array, a text's lone surrogates (JSON may escape one: "\\ud800"; UTF-8 has none) replaced by U+FFFD."""
    try:
        return pa.array(values, type_)
    except UnicodeEncodeError:
        return pa.array([LONE_SURROGATE.sub("\ufffd", v) if type(v) is str else v for v in values], type_)


@dataclass
class TraceData:
    """What a reader returns for one file."""

    format: str
    slices: pa.Table
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    host_name: str | None = None
    base_time_ns: int = 0
    event_count: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count of damaged events
    examples: dict[str, str] = field(default_factory=dict)  # reason -> one damaged event, as text
    notes: list[str] = field(default_factory=list)  # other things worth a warning
    metadata: dict = field(default_factory=dict)
    devices: list[dict] = field(default_factory=list)  # device_id, name, total_memory_bytes, ..., properties
    process_groups: list[dict] = field(default_factory=list)
    counters: pa.Table | None = None  # READER_COUNTER_TYPES columns, when the format has counters
    xla_ops: list[dict] = field(default_factory=list)  # rows of schema.TABLES['xla_ops'] (without run and rank)
    # forward->backward links: slice_id (a backward op), fwd_slice_id (its forward op); None when not recorded
    fwd_links: pa.Table | None = None
    # graph-replayed kernels -> the copy of the op that launched them at capture time (readers/graph_capture.py):
    # slice_id (a kernel), op_id (a slice of this trace); None when no replay was attributed
    graph_ops: pa.Table | None = None
    # scratch files read without copying (the reader's slices; normalize adds its own): their pages are shed
    mappings: list[FileMapping] = field(default_factory=list)

    def shedding(self):
        """While in this block, the file-backed pages of `mappings` (also those added meanwhile) are dropped from
        memory as they pile up."""
        return FileMapping.shedding(self.mappings)


class FileMapping:
    """A read-only memory map of a scratch file that Arrow reads without copying. Its pages are file-backed, yet
    count in the process's RSS once touched, until the kernel needs the memory: `shedding()` drops them every
    SHED_SECONDS (they are read again from the page cache when touched), so a pass over every slice does not
    pile up a trace's worth of resident pages."""

    SHED_SECONDS = 0.25

    def __init__(self, path: Path):
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)  # stays valid once the file is removed

    def table(self) -> pa.Table:
        """The Arrow stream file's record batches, read without copying."""
        return pa.ipc.open_stream(pa.BufferReader(pa.py_buffer(self._map))).read_all()

    @classmethod
    def of_batches(cls, path: Path, schema: pa.Schema, batches) -> FileMapping:
        """`batches` (record batches of `schema`, an iterable: one batch in memory at a time) written to the Arrow
        file `path`, and mapped."""
        with pa.ipc.new_stream(str(path), schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
        return cls(path)

    def shed(self) -> None:
        self._map.madvise(mmap.MADV_DONTNEED)

    @classmethod
    @contextlib.contextmanager
    def shedding(cls, mappings: list[FileMapping]):
        done = threading.Event()

        def shed():
            while not done.wait(cls.SHED_SECONDS):
                for m in list(mappings):
                    m.shed()

        thread = threading.Thread(target=shed, name="tracesql-shed", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
            for m in mappings:
                m.shed()


HEAD_BYTES = 1 << 16


def decode_json(data: bytes, type_) -> tuple[object, bool]:
    """(msgspec's decode of `data` as `type_`, whether invalid UTF-8 in a decoded string had to be replaced by
    U+FFFD for it). msgspec reports such bytes as a UnicodeDecodeError up to 0.22 and as a DecodeError ('Invalid
    UTF-8 encoded string') from 0.23: both are read again with the bad bytes replaced."""
    try:
        return msgspec.json.decode(data, type=type_), False
    except UnicodeDecodeError:
        pass
    except msgspec.DecodeError as e:
        if "UTF-8" not in str(e):
            raise
    return msgspec.json.decode(data.decode("utf-8", "replace").encode(), type=type_), True


def read_bytes(path: Path, most: int | None = None, what: str = "its content") -> bytes:
    """The file's content, gunzipped when it is gzip (by magic number, not by name). With `most`: content beyond
    `most` bytes is refused in one line naming the file and --memory-limit (a gzip is inflated a chunk at a time
    and refused as soon as it passes `most`, so a decompression bomb costs at most `most`)."""
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
            size = os.fstat(f.fileno()).st_size
            if most is not None and not gzipped and size > most:
                raise too_large_to_read_whole(path, what, size, most)
            f.seek(0)
            raw = f.read() if most is None or not gzipped else b""
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if not size:
        raise TraceError(path, "empty file")
    if not gzipped:
        return raw
    try:
        if most is None:
            return gzip.decompress(raw)
        out = bytearray()
        with gzip.open(path, "rb") as src:
            while chunk := src.read(_INFLATE_CHUNK):
                out += chunk
                if len(out) > most:
                    raise too_large_to_read_whole(path, f"{what} (gzip, inflated so far)", len(out), most)
        return bytes(out)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        problem = "truncated gzip" if isinstance(e, EOFError) else f"damaged gzip ({e})"
        raise TraceError(path, problem) from None


def whole_read_bytes(ratio: float) -> int:
    """The most content a reader may read into memory whole when holding it takes `ratio` times its size (the
    worst case, measured): --memory-limit / ratio."""
    return int(limits.current().memory_bytes / ratio)


class TooLarge(TraceError):
    """A file refused because holding it would go beyond --memory-limit."""


def too_large_to_read_whole(path: Path, what: str, size: int, most: int) -> TooLarge:
    return TooLarge(path, f"{what} ({size / 2**20:,.1f} MiB) is more than --memory-limit {limits.current().memory} "
                            f"allows this reader to hold ({most / 2**20:,.1f} MiB; a larger --memory-limit reads "
                            "more): refused")


class Budget:
    """What a reader holds for the whole file (`what`, for the message), charged as it grows: beyond
    --memory-limit the file is refused in one line naming it and the limit."""

    def __init__(self, path: Path, what: str):
        self.path, self.what, self.most, self.held = path, what, limits.current().memory_bytes, 0

    @property
    def left(self) -> int:
        return self.most - self.held

    def take(self, n: int, what: str | None = None) -> None:
        self.check(n, what or self.what)
        self.held += n

    def check(self, n: int, what: str) -> None:
        """Refuse what would take `n` bytes more than is held."""
        if self.held + n > self.most:
            raise too_large_to_read_whole(self.path, what, self.held + n, self.most)


#: A gzip may always inflate to INFLATE_FREE_BYTES; beyond that, to at most MAX_INFLATE_RATIO times its own size
#: (TRACESQL_MAX_GZIP_RATIO overrides): a decompression bomb is refused before it fills the scratch disk. Real
#: traces compress 5-30x (Kineto JSON ~20x, rocprofv3 JSON ~23x, Perfetto protobuf ~5x).
INFLATE_FREE_BYTES = 1 << 30
MAX_INFLATE_RATIO = 100
_INFLATE_CHUNK = 8 << 20


def max_inflate_ratio() -> float:
    return env_number("TRACESQL_MAX_GZIP_RATIO", MAX_INFLATE_RATIO, float, lambda ratio: ratio > 1, "a number above 1")


def inflated(path: Path, scratch: Path) -> Path:
    """The file's content as a plain file: `path` itself, or, when it is gzip (by magic number), its content
    unpacked into the folder `scratch` a chunk at a time (memory: one chunk), refusing a decompression bomb."""
    try:
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b":
                return path
        size = path.stat().st_size
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    cap = max(INFLATE_FREE_BYTES, int(size * max_inflate_ratio()))
    out = scratch / "inflated"
    written = 0
    try:
        with gzip.open(path, "rb") as src, open(out, "wb") as dst:
            while chunk := src.read(_INFLATE_CHUNK):
                written += len(chunk)
                if written > cap:
                    raise TraceError(path, f"gzip inflates beyond {cap / 2**30:.1f} GiB ({written / size:.0f}x its "
                                           f"size): refused as a possible decompression bomb "
                                           f"(TRACESQL_MAX_GZIP_RATIO raises the limit)")
                dst.write(chunk)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise TraceError(path, "truncated gzip" if isinstance(e, EOFError) else f"damaged gzip ({e})") from None
    if not written:
        raise TraceError(path, "empty file")
    return out


@contextlib.contextmanager
def mapped_content(path: Path, scratch: Path):
    """The file's content (unpacked into `scratch` when gzip: `inflated`) memory-mapped, for this block; the
    unpacked copy is removed after it."""
    content = inflated(path, scratch)
    try:
        with open(content, "rb") as f:
            doc = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except ValueError:  # mmap of an empty file
        raise TraceError(path, "empty file") from None
    try:
        yield doc
    finally:
        doc.close()
        if content != path:
            content.unlink()


def read_head(path: Path, n: int = HEAD_BYTES) -> bytes:
    """The first `n` bytes of content (decompressed when gzip), as far as the file has any: enough to detect."""
    try:
        with open(path, "rb") as f:
            head = f.read(n)
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if head[:2] == b"\x1f\x8b":
        try:  # a decompressor object returns what it can of a truncated stream instead of raising
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, n)
        except zlib.error:
            return b""
    return head


def read_sqlite(path: Path, what: str, read):
    """read(connection) on the SQLite file `path` opened read-only; SQLite's errors as one line saying the file is
    not a readable `what`."""
    import sqlite3

    from ..errors import TraceError

    try:
        con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error as e:
        raise TraceError(path, f"not a readable SQLite database: {e}") from None
    try:
        return read(con)
    except sqlite3.Error as e:
        raise TraceError(path, f"not a readable {what}: {e}") from None
    finally:
        con.close()


def sqlite_int(value) -> int | None:
    """An integer the schema's BIGINT / INTEGER columns hold, else None (SQLite stores any type anywhere)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and -2**62 < value < 2**62 else None
