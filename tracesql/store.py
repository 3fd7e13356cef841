"""The on-disk layout of a run, and publishing it atomically.

A run is a folder:

    runs/1234/
      tracesql.json              manifest: schema version, sources (size, mtime, rank, part), warnings, and
                                 `files`: every Parquet file of the run with its size, SHA-256 and XXH3-128
      init.sql                   views + macros for a plain DuckDB client (`cd runs/1234 && duckdb -init init.sql`)
      slices/rank00003-<key>.parquet   one Parquet file per table per source file (<key>: the source and the
                                 ingest that wrote it, so a name never holds other bytes in a later run)
      slices/batch-<key>.parquet one Parquet file per table per batch of small archive members (their ranks
                                 together; the manifest lists it under each of them: see BatchWriter)
      ops/ collectives/ memory/ steps/ ranks/ devices/ process_groups/
      runs/run-<generation>.parquet  op_costs/run-<generation>.parquet   tables written once per run
                                 (schema.RUN_TABLES): the labels, and every op's cost

Every row carries `run_id` and `rank`, so the files of many runs (a fleet: a folder of run folders) read as one
dataset in DuckDB, Spark or Polars with a glob. A run is built in a sibling staging folder and swapped in with one
atomic exchange of the two folders (Linux `renameat2(RENAME_EXCHANGE)`; elsewhere two renames): a failed,
interrupted or killed ingest leaves the previous run as it was. Ingests of one run take its lock (`.<run>.lock`
beside it) for their whole duration, so two processes never interleave; leftovers of a killed ingest (hidden
`.<run>.staging-*` folders, which never count as runs) are removed by the next ingest of that run.

A run verifies itself: opening it (`files_of`) refuses a run whose Parquet files are not the ones its manifest
lists (one missing, one added, one of another size) in one line naming the file, and a query checks the XXH3-128
of the files it reads (`check_digest`: a flipped bit); `verify` checks every file's SHA-256 and XXH3-128 and every
Parquet page's CRC (written by every writer here). Files are always named one by one,
never found by a glob pattern, so a run under `exp[1]/` or `a*b/` reads exactly its own files.

A reader sees one generation of a run whole. Every ingest names the files it writes anew (the generation is part
of their names; a part carried over unchanged keeps its name and its bytes), so a file name a reader listed is
either those very bytes or gone. The commands that read a run (query, verify, export, info, diff, report) hold a
shared lock on it while they read (`reading`); an ingest swaps its generation in, and removes the previous one,
only when no reader holds that lock (`swapping`: readers that arrive meanwhile wait for the swap, so a stream of
readers cannot hold an ingest back for ever). An ingest waits at most READER_WAIT_S for readers; past that it
swaps anyway, and a reader that then finds a file gone starts over on the new run (`engine.while_unchanged`),
never reading the next run's bytes under the previous run's name. A plain DuckDB client or `tracesql.connect`
takes no lock and relies on that retry alone.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import functools
import hashlib
import json
import mmap
import os
import shutil
import threading
import time
import uuid
from pathlib import Path

import xxhash

from . import schema
from .errors import TraceError
from .version import __version__

MANIFEST = "tracesql.json"
INIT_SQL = "init.sql"
MISSING = "missing: the run's manifest lists it (a damaged run: re-ingest the traces)"
#: How every Parquet file of a run is written: page checksums let any reader (pyarrow, Spark, `tracesql verify`)
#: notice a flipped bit.
PARQUET_OPTIONS = {"compression": "zstd", "write_page_checksum": True}
#: Rows per row group of every Parquet file but a large source's slices (SLICES_ROW_GROUP_ROWS)
ROW_GROUP_ROWS = 1 << 20
#: The slices file of a source with more rows than one of its row groups (SLICES_ROW_GROUP_ROWS) is written kind
#: by kind (kinds in name order, each kind's rows in the order they came, in row groups of their own), with a
#: Bloom filter of the kinds: nearly every query reads some kinds only (device work, ops, annotations, launch
#: calls), and DuckDB then skips the row groups of the others (by their min/max kind, or by the Bloom filter
#: where that range holds the kind asked for, as 'memory' lies between 'kernel' and 'memset') instead of decoding
#: every row's columns. On the 24x tile the curated queries took 13 % less CPU in all (the slowest 13-17 %); its
#: ingest ~6 % more CPU and ~370 MB more peak RSS. Row groups of 64 k rows: with 128 k, the rows a row group holds
#: while it is filled took the 1 GB tile's ingest past its --memory-limit.
SLICES_ROW_GROUP_ROWS = 1 << 16


def _dictionary_columns(arrow_schema) -> list[str]:
    """The columns a Parquet file dictionary-encodes: text, which repeats (kinds, names, tracks), but not JSON
    (`args`: nearly every value differs) nor numbers; building dictionaries that overflow took half of the
    slices file's writing time and made it a third larger."""
    import pyarrow as pa

    return [f.name for f in arrow_schema
            if pa.types.is_dictionary(f.type) or pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]


def part_name(rank: int, key: str) -> str:
    return f"rank{rank:05d}-{key}.parquet"


def batch_part_name(key: str) -> str:
    return f"batch-{key}.parquet"


def part_key(rel: str, staging) -> str:
    """The key of the parts a source `rel` gets in the run being built in `staging`: new with every ingest (see
    the module's note on generations)."""
    return hashlib.sha1(f"{rel}\n{generation(staging)}".encode()).hexdigest()[:10]


def generation(staging) -> str:
    """The ingest building `staging` (a folder made by new_staging), as the random part of its name."""
    return Path(staging).name.rpartition("staging-")[2]


def run_checks_name(staging) -> str:
    """The file of the run's own `warnings` rows (those that need every rank, not one source's part)."""
    return f"run-checks-{generation(staging)}.parquet"


def is_run(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def require_run(path: Path) -> None:
    """Refuse a path that is not a run folder, in the words the other commands use for a missing one."""
    if not Path(path).exists():
        raise TraceError(path, "no such file or folder")
    if not is_run(Path(path)):
        raise TraceError(path, f"not a tracesql run (no {MANIFEST}); `tracesql ingest` makes one")


def _sibling(out: Path, what: str) -> Path:
    """A hidden path beside the run (staging, lock, extraction): never listed as a run or read as traces."""
    return out.parent / f".{out.name}.{what}"


@contextlib.contextmanager
def locked(out: Path):
    """Held by an ingest of `out` from reading its manifest to publishing: a second ingest waits."""
    out.parent.mkdir(parents=True, exist_ok=True)
    import filelock  # (here, not at the top: reading a run takes no lock unless an ingest is running)

    with filelock.FileLock(_sibling(out, "lock")):
        yield


def being_written(out: Path) -> bool:
    """Whether an ingest of `out` holds its lock right now."""
    lock_file = _sibling(out, "lock")
    if not lock_file.exists():
        return False
    import filelock

    try:
        with filelock.FileLock(lock_file, timeout=0):
            return False
    except filelock.Timeout:
        return True
    except OSError:  # a folder this user cannot write: nobody ingests into it through this user either
        return False


def wait_for_writer(out: Path, timeout: float = 600) -> None:
    """Wait (up to `timeout` s) until no ingest of `out` holds its lock."""
    if _sibling(out, "lock").exists():
        import filelock

        try:
            with filelock.FileLock(_sibling(out, "lock"), timeout=timeout):
                pass
        except filelock.Timeout:
            raise TraceError(out, f"still being written by another ingest after {timeout:.0f} s") from None


#: How long an ingest waits for the readers of the run it replaces to finish before it swaps anyway (see the note).
READER_WAIT_S = 60.0
# Byte ranges of the run's lock file (`.<run>.lock`, whose flock the ingest holds: these open-file-description
# record locks are apart from it) that readers and a swapping ingest lock.
_READERS, _GATE = 0, 1


def _range_lock(fd: int, byte: int, kind: str, wait: float | None) -> bool:
    """Take (kind "r" shared, "w" exclusive) or drop ("u") the lock on `byte` of the open file `fd`, waiting up to
    `wait` s (None: as long as it takes); whether it was had (never, on a file system without record locks)."""
    import fcntl
    import struct

    code = {"r": fcntl.F_RDLCK, "w": fcntl.F_WRLCK, "u": fcntl.F_UNLCK}[kind]
    request = struct.pack("hhqqi4x", code, os.SEEK_SET, byte, 1, 0)  # struct flock; l_pid 0, as OFD locks need
    deadline = None if wait is None else time.monotonic() + wait
    while True:
        try:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLKW if deadline is None else fcntl.F_OFD_SETLK, request)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        except OSError:
            return False


def _lock_file(out: Path, flags: int) -> int | None:
    """The run's lock file, open, where record locks work (Linux's open-file-description locks); else None (then
    readers rely on their retry alone)."""
    try:
        import fcntl
    except ImportError:  # Windows
        return None
    if not hasattr(fcntl, "F_OFD_SETLK"):
        return None
    try:
        return os.open(_sibling(out, "lock"), flags)
    except OSError:  # never ingested here (a copied run): no ingest holds it either until one starts
        return None


#: The runs this process reads now (`reading`): its own ingest of one (a report's target re-ingested into its
#: cache) swaps at once rather than wait for itself.
_read_here: collections.Counter = collections.Counter()
_read_here_lock = threading.Lock()  # (an MCP server reads from several threads)


@contextlib.contextmanager
def reading(runs):
    """Held while a command reads `runs`: no ingest swaps one of them in meanwhile (see the note on generations).
    A reader passes through the run's gate first, so it waits while an ingest is swapping or waiting to."""
    runs = sorted({Path(r).absolute() for r in runs})
    held = []
    with _read_here_lock:
        _read_here.update(runs)
    try:
        for run in runs:
            fd = _lock_file(run, os.O_RDONLY)  # a shared lock needs no write access: runs in read-only folders too
            if fd is not None:
                held.append(fd)
                _range_lock(fd, _GATE, "r", None)
                _range_lock(fd, _READERS, "r", None)
                _range_lock(fd, _GATE, "u", None)  # (the lock on _READERS stays)
        yield
    finally:
        with _read_here_lock:
            _read_here.subtract(runs)
        for fd in held:
            os.close(fd)  # drops its locks


@contextlib.contextmanager
def swapping(out: Path):
    """Held by an ingest while it swaps its generation in for `out` and removes the previous one: taken once no
    reader holds `out` (`reading`), or after READER_WAIT_S of waiting for them (their retry covers them then)."""
    fd = _lock_file(out, os.O_RDWR)
    try:
        if fd is not None:
            _range_lock(fd, _GATE, "w", None)  # readers that come now wait for the swap
            _range_lock(fd, _READERS, "w", 0 if _read_here[out.absolute()] > 0 else READER_WAIT_S)
        yield
    finally:
        if fd is not None:
            os.close(fd)


def remove_leftovers(out: Path) -> list[Path]:
    """Staging and retired folders of `out` left by killed ingests. Only call with the lock held: then no live
    ingest owns any of them."""
    stale = sorted(p for what in ("staging-*", "old-*", "extract-*") for p in out.parent.glob(f".{out.name}.{what}"))
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return stale


def load_manifest(run: Path) -> dict:
    """The run's manifest. Runs of an older schema version this tracesql still reads are returned as they are
    (`older_schema_note` says what they lack); newer ones, and ones too old, are refused saying what to do."""
    try:
        manifest = json.loads((run / MANIFEST).read_text())
        if not isinstance(manifest, dict):
            raise ValueError("the manifest is not a JSON object")
    except (OSError, ValueError) as e:
        raise TraceError(run, f"not a readable tracesql run ({e})") from None
    return check_manifest(manifest, run)


def check_manifest(manifest: dict, run) -> dict:
    """`manifest` if this tracesql reads its schema version (an older one is read as it is), else a TraceError
    saying what to do. Also used by the Spark engine, which reads manifests from URIs."""
    version = manifest.get("schema_version")
    writer = f"tracesql {manifest.get('tracesql_version') or '(unknown version)'}"
    readable = f"{schema.OLDEST_READABLE}..{schema.SCHEMA_VERSION}"
    if not isinstance(version, int) or isinstance(version, bool):
        raise TraceError(run, f"the manifest has no valid schema_version ({version!r}); re-ingest the traces")
    if version > schema.SCHEMA_VERSION:
        raise TraceError(run, f"written by {writer} with schema version {version}; this tracesql {__version__} "
                              f"reads schema versions {readable}: install a tracesql that reads schema version "
                              f"{version}, or re-ingest the traces with this one")
    if version < schema.OLDEST_READABLE:
        raise TraceError(run, f"written by {writer} with schema version {version}, which this tracesql "
                              f"{__version__} no longer reads (it reads {readable}): re-ingest the traces")
    return manifest


def older_schema_note(manifest: dict) -> str | None:
    """What a run of an older (still readable) schema version lacks, or None for a current run."""
    version = manifest["schema_version"]
    if version == schema.SCHEMA_VERSION:
        return None
    changes = "; ".join(schema.SCHEMA_CHANGES[v] for v in range(version + 1, schema.SCHEMA_VERSION + 1))
    return (f"written with schema version {version}, read as version {schema.SCHEMA_VERSION} (since then: "
            f"{changes}; what it lacks reads as empty — re-ingest to fill it)")


class PartWriter:
    """Writes one source's tables (`part` in each table's folder) as they are produced. An Arrow table is written
    on a background thread (pyarrow writes without the GIL, so writing overlaps the rest of the work); a DuckDB
    relation is streamed to its file by DuckDB right away, never held in memory whole. Leaving the `with` block
    waits for the writes and raises the first error."""

    def __init__(self, run_dir: Path, part: str):
        self._dir, self._part = run_dir, part
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tracesql-write")
        self._writes = []  # futures of the writes

    def write(self, name: str, rows) -> int:
        """Write `rows` (an Arrow table or a DuckDB relation) as table `name`; returns the number of rows."""
        import pyarrow as pa  # here, not at the top: reading a run (every query) needs no Arrow

        path = self._dir / name / self._part
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(rows, pa.Table):
            self._writes.append(self._pool.submit(write_table, name, rows, path))
            return rows.num_rows
        return write_relation(rows, path)

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, exc_type, *_) -> None:
        try:
            if exc_type is None:
                for w in self._writes:
                    w.result()
        finally:
            self._pool.shutdown(cancel_futures=True)


class BatchWriter:
    """Writes the tables of several sources (small members of one archive) as one part per table: each source's
    rows are kept as they are produced (Arrow tables as they are: the slices memory-mapped from the readers'
    scratch files, whose maps stay valid once the files are removed; a DuckDB relation read into memory), and
    leaving the `with` block without an error writes every table once. An archive's members change together (their
    fingerprint is the archive's), so the part they share is always replaced or carried over whole. What a small
    member's rows cost in memory is bounded by the caller's choice of batches (ingestion._batches)."""

    def __init__(self, run_dir: Path, part: str):
        self._dir, self.part = run_dir, part
        self._tables: dict[str, list] = {}

    def write(self, name: str, rows) -> int:
        """Keep `rows` (an Arrow table or a DuckDB relation) for table `name`; returns the number of rows."""
        import pyarrow as pa

        table = rows if isinstance(rows, pa.Table) else rows.to_arrow_table()
        self._tables.setdefault(name, []).append(table)
        return table.num_rows

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, exc_type, *_) -> None:
        import pyarrow as pa

        if exc_type is not None:
            return
        for name, tables in self._tables.items():
            rows = schema.conform(name, pa.concat_tables([schema.conform(name, t) for t in tables],
                                                         promote_options="permissive"))
            path = self._dir / name / self.part
            path.parent.mkdir(parents=True, exist_ok=True)
            write_table(name, rows, path)


def write_table(name: str, rows, path: Path) -> None:
    """The Arrow table `rows` of table `name` written to the Parquet file `path` (the slices of a large source
    kind by kind: SLICES_ROW_GROUP_ROWS)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if name != "slices" or rows.num_rows <= SLICES_ROW_GROUP_ROWS:
        pq.write_table(rows, path, row_group_size=ROW_GROUP_ROWS, use_dictionary=_dictionary_columns(rows.schema),
                       **PARQUET_OPTIONS)
        return
    kinds = sorted(k for k in pc.unique(rows["kind"]).to_pylist() if k is not None)
    with pq.ParquetWriter(path, rows.schema, use_dictionary=_dictionary_columns(rows.schema),
                          bloom_filter_options={"kind": {"ndv": max(len(kinds), 1), "fpp": 0.01}},
                          **PARQUET_OPTIONS) as writer:
        # a kind at a time, a batch at a time: a row group's rows are held, not a sorted copy of the slices (the
        # 1 GB tile's overran the ingest's memory limit)
        for kind in kinds + [None]:
            held = []
            for batch in rows.to_batches(max_chunksize=SLICES_ROW_GROUP_ROWS // 2):
                held.append(batch.filter(pc.is_null(batch["kind"]) if kind is None else
                                         pc.equal(batch["kind"], kind)))
                whole = sum(b.num_rows for b in held) // SLICES_ROW_GROUP_ROWS * SLICES_ROW_GROUP_ROWS
                if whole:
                    pending = pa.Table.from_batches(held, rows.schema)
                    writer.write_table(pending.slice(0, whole), row_group_size=SLICES_ROW_GROUP_ROWS)
                    held = pending.slice(whole).to_batches()
            if sum(b.num_rows for b in held):
                writer.write_table(pa.Table.from_batches(held, rows.schema), row_group_size=SLICES_ROW_GROUP_ROWS)


def write_relation(rel, path: Path, batch_rows: int = 1 << 17) -> int:
    """Stream a DuckDB relation into the Parquet file `path` a batch at a time (DuckDB's own writer has no page
    checksums); returns the number of rows."""
    import pyarrow.parquet as pq

    reader = rel.to_arrow_reader(batch_rows)
    n = 0
    with pq.ParquetWriter(path, reader.schema, use_dictionary=_dictionary_columns(reader.schema),
                          **PARQUET_OPTIONS) as writer:
        for batch in reader:
            if batch.num_rows:
                writer.write_batch(batch, row_group_size=ROW_GROUP_ROWS)
                n += batch.num_rows
    return n


def new_staging(out: Path) -> Path:
    staging = _sibling(out, f"staging-{uuid.uuid4().hex[:12]}")
    staging.mkdir(parents=True)
    return staging


def new_scratch(out: Path) -> Path:
    """A private folder beside the run for an ingest's temporary files (archive members)."""
    scratch = _sibling(out, f"extract-{uuid.uuid4().hex[:12]}")
    scratch.mkdir(parents=True)
    return scratch


def reuse_part(old_run: Path, staging: Path, part: str) -> None:
    """Carry an unchanged source's files into the new run (hard links: no copy, no rewrite)."""
    for name in schema.TABLES:
        if name in schema.RUN_TABLES:
            continue
        (staging / name).mkdir(exist_ok=True)
        src, dst = old_run / name / part, staging / name / part
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


#: The digests a manifest records of each file: SHA-256 (`verify`'s, and any tool's: `sha256sum`) and XXH3-128,
#: which a query checks on opening a run at a fifth of SHA-256's CPU (docs/robustness.md has the measurements).
DIGESTS = {"sha256": "SHA-256", "xxh3_128": "XXH3-128"}


def digests(path: Path) -> dict[str, str]:
    """`path`'s DIGESTS, in one read of it."""
    sha, xxh = hashlib.sha256(), xxhash.xxh3_128()
    chunk = bytearray(1 << 20)  # one buffer, read into: the chunk is hashed twice while in the CPU's cache
    view = memoryview(chunk)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(chunk):
            sha.update(view[:n])
            xxh.update(view[:n])
    return {"sha256": sha.hexdigest(), "xxh3_128": xxh.hexdigest()}


def xxh3_128(path: Path) -> str:
    """`path`'s XXH3-128, hashed where the page cache holds it (mapped, not copied: copying the bytes out cost
    more CPU than hashing them). A file cut short while mapped would kill the process (SIGBUS): tracesql writes
    a run's files once and never truncates one."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:  # nothing to map
            return xxhash.xxh3_128_hexdigest(b"")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return xxhash.xxh3_128_hexdigest(mapped)


def parquet_files(run: Path) -> list[str]:
    """The Parquet files in `run`'s table folders, as `table/file.parquet`, sorted."""
    found = []
    for name in schema.TABLES:
        folder = run / name
        if folder.is_dir():
            found += [f"{name}/{p.name}" for p in folder.iterdir() if p.name.endswith(".parquet")]
    return sorted(found)


def describe_files(run: Path, known: dict | None = None) -> dict[str, dict]:
    """`files` of a manifest: each Parquet file's size and DIGESTS (taken from `known`, the previous run's, for a
    file carried over unchanged that has them all)."""
    known = known or {}
    files = {}
    for rel in parquet_files(run):
        size = (run / rel).stat().st_size
        prev = known.get(rel)
        if isinstance(prev, dict) and prev.get("size") == size and all(prev.get(d) for d in DIGESTS):
            files[rel] = {"size": size, **{d: prev[d] for d in DIGESTS}}
        else:
            files[rel] = {"size": size, **digests(run / rel)}
    return files


def files_of(run, manifest: dict, found: dict[str, int] | None = None) -> list[str]:
    """The run's Parquet files (`table/file.parquet`) as its manifest lists them, after checking that the folder
    holds exactly those, each of its recorded size: otherwise a TraceError naming the first file that differs.
    A run written before manifests listed files gets its files as found. `found`: the Parquet files in the run's
    table folders with their sizes, as another file system listed them (Spark's, for a run named by a URI);
    by default the local folder `run` is listed."""
    listed = manifest.get("files")
    if found is None:
        found = {}
        for rel in parquet_files(run):
            with contextlib.suppress(FileNotFoundError):  # gone since the listing: missing, as if never there
                found[rel] = (run / rel).stat().st_size
    if listed is None:
        return sorted(found)
    if not isinstance(listed, dict):
        raise TraceError(f"{run}/{MANIFEST}", "damaged manifest: 'files' is not an object; re-ingest the traces")
    for rel in sorted(listed):
        entry = listed[rel]
        path = f"{run}/{rel}"  # a local path or a URI
        if rel not in found:
            raise TraceError(path, MISSING)
        size = entry.get("size") if isinstance(entry, dict) else None
        if found[rel] != size:
            raise TraceError(path, f"changed: {found[rel]:,} bytes where the run's manifest records "
                                   f"{size:,} (a damaged run: re-ingest the traces)" if isinstance(size, int) else
                                   "damaged manifest entry (re-ingest the traces)")
    extra = sorted(set(found) - set(listed))
    if extra:
        raise TraceError(f"{run}/{extra[0]}", "not part of the run: its manifest does not list it (remove it, or "
                                              "re-ingest the traces)")
    return sorted(listed)


def check_digest(run: Path, rel: str, entry) -> None:
    """Refuse the run's file `rel` when its XXH3-128 is not the one its manifest `entry` records (a flipped bit
    anywhere in it); an entry from an older tracesql, without one, has its SHA-256 checked (without either, nothing
    is)."""
    recorded, path = entry if isinstance(entry, dict) else {}, run / rel
    if recorded.get("xxh3_128"):
        digest, found = "xxh3_128", _hashed(path, xxh3_128)
    elif recorded.get("sha256"):
        digest, found = "sha256", _hashed(path, digests)["sha256"]
    else:
        return
    if found != recorded[digest]:
        raise _changed(path, digest)


def _hashed(path: Path, digest_of):
    try:
        return digest_of(path)
    except FileNotFoundError:  # gone since the listing (an ingest swapped the run in: see engine.while_unchanged)
        raise TraceError(path, MISSING) from None


def _changed(path: Path, digest: str) -> TraceError:
    return TraceError(path, f"changed: its {DIGESTS[digest]} differs from the one the run's manifest records "
                            "(a damaged run: re-ingest the traces)")


def verify(run: Path) -> dict:
    """Check every file of `run` against its manifest: present, nothing added, size, every digest it records
    (SHA-256, XXH3-128), and every Parquet page's checksum. Returns {'files': n, 'bytes': total}; raises a
    TraceError naming the first bad file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    manifest = load_manifest(run)
    if manifest.get("files") is None:
        raise TraceError(run, "written by a tracesql that recorded no checksums: nothing to verify against "
                              "(re-ingest the traces)")
    files = files_of(run, manifest)
    total = 0
    for rel in files:
        path, entry = run / rel, manifest["files"][rel]
        found = _hashed(path, digests)
        for digest in DIGESTS:  # SHA-256 first: the one any tool can check
            if digest in entry and entry[digest] != found[digest]:
                raise _changed(path, digest)
        try:
            pf = pq.ParquetFile(path, page_checksum_verification=True)
            for i in range(pf.num_row_groups):
                pf.read_row_group(i)
        except (OSError, pa.ArrowException) as e:
            raise TraceError(path, f"damaged Parquet ({' '.join(str(e).split())})") from None
        total += entry["size"]
    return {"files": len(files), "bytes": total}


def publish(staging: Path, out: Path, manifest: dict, init_sql: str, known_files: dict | None = None) -> None:
    """Write the manifest last (with every Parquet file's size and checksum), then swap the staging folder in
    for `out`."""
    files = describe_files(staging, known_files)
    (staging / INIT_SQL).write_text(init_sql(files) if callable(init_sql) else init_sql)
    tmp = staging / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({**manifest, "files": files, "schema_version": schema.SCHEMA_VERSION,
                               "tracesql_version": __version__}, indent=1))
    tmp.rename(staging / MANIFEST)
    with swapping(out):
        if not out.exists():
            staging.rename(out)
        elif _exchange(staging, out):
            shutil.rmtree(staging, ignore_errors=True)  # now holds the previous run
        else:  # no atomic exchange here: a reader that finds `out` missing for a moment waits for the lock
            retired = _sibling(out, f"old-{uuid.uuid4().hex[:12]}")
            out.rename(retired)
            staging.rename(out)
            shutil.rmtree(retired, ignore_errors=True)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders in one step (no moment where either is missing); False where the OS cannot."""
    renameat2 = getattr(_libc(), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):  # kernel or file system without the flag
        return False
    raise OSError(err, os.strerror(err), str(b))


@functools.cache
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def discard(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)
