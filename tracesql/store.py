"""The on-disk layout of a run, and publishing it atomically.

A run is a folder:

    runs/1234/
      tracesql.json              manifest: schema version, sources (size, mtime, rank, part), warnings
      init.sql                   views + macros for a plain DuckDB client (`cd runs/1234 && duckdb -init init.sql`)
      slices/rank00003-<key>.parquet   one Parquet file per table per source file
      ops/ collectives/ memory/ steps/ ranks/ devices/ process_groups/

Every row carries `run_id` and `rank`, so the files of many runs (a fleet: a folder of run folders) read as one
dataset in DuckDB, Spark or Polars with a glob. A run is built in a sibling staging folder and swapped in with
renames: a failed or interrupted ingest leaves the previous run as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from . import __version__, schema
from .errors import TraceError

MANIFEST = "tracesql.json"
INIT_SQL = "init.sql"


def part_name(rank: int, key: str) -> str:
    return f"rank{rank:05d}-{key}.parquet"


def is_run(path: Path) -> bool:
    return (path / MANIFEST).is_file()


def load_manifest(run: Path, rewriting: bool = False) -> dict:
    """The run's manifest. A run of another schema version is refused, unless it is about to be rewritten: an
    older run is then re-ingested from its sources as if new."""
    try:
        manifest = json.loads((run / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise TraceError(run, f"not a readable tracesql run ({e})") from None
    version = manifest.get("schema_version")
    if rewriting and isinstance(version, int) and version < schema.SCHEMA_VERSION:
        return {"run_id": manifest.get("run_id")}
    return check_manifest(manifest, run)


def check_manifest(manifest: dict, run) -> dict:
    """`manifest` if this tracesql reads its schema version, else a TraceError saying what to do."""
    version = manifest.get("schema_version")
    if version != schema.SCHEMA_VERSION:
        newer = isinstance(version, int) and version > schema.SCHEMA_VERSION
        raise TraceError(
            run,
            f"written with schema version {version}; this tracesql reads version {schema.SCHEMA_VERSION}"
            + (" — upgrade tracesql" if newer else " — re-ingest the traces"),
        )
    return manifest


class PartWriter:
    """Writes one source's tables (`part` in each table's folder) as they are produced. An Arrow table is written
    on a background thread (pyarrow writes without the GIL, so writing overlaps the rest of the work); a DuckDB
    relation is streamed to its file by DuckDB right away, never held in memory whole. Leaving the `with` block
    waits for the writes and raises the first error."""

    def __init__(self, run_dir: Path, part: str):
        self._dir, self._part = run_dir, part
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tracesql-write")
        self._writes: list[Future] = []

    def write(self, name: str, rows) -> int:
        """Write `rows` (an Arrow table or a DuckDB relation) as table `name`; returns the number of rows."""
        path = self._dir / name / self._part
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(rows, pa.Table):
            self._writes.append(self._pool.submit(
                pq.write_table, rows, path, compression="zstd", row_group_size=1 << 20))
            return rows.num_rows
        rows.to_parquet(str(path), compression="zstd")
        return pq.read_metadata(path).num_rows

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, exc_type, *_) -> None:
        try:
            if exc_type is None:
                for w in self._writes:
                    w.result()
        finally:
            self._pool.shutdown(cancel_futures=True)


def new_staging(out: Path) -> Path:
    staging = out.parent / f".{out.name}.staging-{uuid.uuid4().hex[:12]}"
    staging.mkdir(parents=True)
    return staging


def reuse_part(old_run: Path, staging: Path, part: str) -> None:
    """Carry an unchanged source's files into the new run (hard links: no copy, no rewrite)."""
    for name in schema.TABLES:
        (staging / name).mkdir(exist_ok=True)
        src, dst = old_run / name / part, staging / name / part
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)


def publish(staging: Path, out: Path, manifest: dict, init_sql: str) -> None:
    """Write the manifest last, then swap the staging folder in for `out`."""
    (staging / INIT_SQL).write_text(init_sql)
    tmp = staging / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps({**manifest, "schema_version": schema.SCHEMA_VERSION,
                               "tracesql_version": __version__}, indent=1))
    tmp.rename(staging / MANIFEST)
    if out.exists():
        retired = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:12]}"
        out.rename(retired)
        staging.rename(out)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        staging.rename(out)


def discard(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)
