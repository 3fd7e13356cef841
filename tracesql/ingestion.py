"""`tracesql ingest`: trace files -> a run folder of Parquet tables. Files are read in parallel processes."""

from __future__ import annotations

import gc
import hashlib
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pyarrow as pa

from . import engine, store
from .arrays import array, strings
from .errors import TraceError



@dataclass
class IngestResult:
    run: Path
    run_id: str
    ingested: list[str] = field(default_factory=list)  # source paths read this time
    reused: list[str] = field(default_factory=list)  # unchanged sources whose tables were kept
    removed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)  # rows of each table in the run (all sources)

    @property
    def changed(self) -> bool:
        return bool(self.ingested or self.removed)


def find_traces(sources: list[Path], exclude: Path | None = None) -> tuple[Path, list[Path]]:
    """The trace files named or found (recursively) under `sources`, and the folder their paths are relative to."""
    from .readers import trace_suffixes

    suffixes = trace_suffixes()
    files: list[Path] = []
    for src in sources:
        if src.is_dir():
            for root, dirs, names in os.walk(src):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and Path(root, d) != exclude)
                files += [Path(root, n) for n in sorted(names) if n.endswith(suffixes) and not n.startswith(".")]
        elif src.is_file():
            files.append(src)
        else:
            raise TraceError(src, "no such file or folder")
    if not files:
        raise TraceError(", ".join(map(str, sources)), f"no trace files found (looked for *{', *'.join(suffixes)})")
    files = sorted({f.resolve() for f in files})
    root = Path(os.path.commonpath([f.parent for f in files]))
    return root, files


def _fingerprint(path: Path, options: dict) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "options": options}


def _with_source(ranks: pa.Table, rel: str, size: int) -> pa.Table:
    ranks = ranks.set_column(ranks.schema.get_field_index("source_path"), "source_path", strings([rel]))
    return ranks.set_column(ranks.schema.get_field_index("source_bytes"), "source_bytes",
                            array(np.array([size], np.int64)))


def _read_one(path: str, rel: str, staging: str, ranks: tuple, run_id: str, threads: int) -> dict:
    """Read, normalize and write one file's tables into the staging run. Runs in a worker process.
    `ranks` is (the user's --rank, the rank to assume when the trace names none). A file that holds several
    processes gives one rank each (and one part each)."""
    from .normalize import normalize
    from .readers import read_trace

    p = Path(path)
    gc.disable()  # bulk allocation of short-lived, acyclic objects: the cycle collector only costs time here
    try:
        traces = read_trace(p, threads=threads)
        chosen, fallback = ranks if len(traces) == 1 else (None, None)
        summary = {"ranks": [], "parts": [], "format": traces[0].format, "events": 0, "skipped": {},
                   "notes": [], "rows": {}}
        for data in traces:
            rank = next((r for r in (chosen, data.rank, fallback) if r is not None), None)
            if rank is None:
                raise TraceError(p, "cannot tell which rank this is: no distributedInfo, no rank-N/workerN in the "
                                    "name; ingest it alone with --rank N")
            part = store.part_name(rank, hashlib.sha1(rel.encode()).hexdigest()[:10])
            with store.PartWriter(Path(staging), part) as writer:  # each table is written as soon as it is done
                rows = normalize(data, run_id, rank, threads=threads, on_table=lambda name, table: writer.write(
                    name, _with_source(table, rel, p.stat().st_size) if name == "ranks" else table))
            summary["ranks"].append(rank)
            summary["parts"].append(part)
            summary["events"] += data.event_count
            summary["notes"] += data.notes
            for reason, n in data.skipped.items():
                summary["skipped"][reason] = summary["skipped"].get(reason, 0) + n
            for table, n in rows.items():
                summary["rows"][table] = summary["rows"].get(table, 0) + n
    finally:
        gc.enable()
    return summary


def ingest(
    sources,
    out,
    *,
    rank: int | None = None,
    run_id: str | None = None,
    jobs: int | None = None,
    strict: bool = False,
    progress: bool = False,
    spark=None,
) -> IngestResult:
    """Ingest trace files or folders into the run folder `out`. Unchanged files already in `out` are not re-read.
    With `spark` (a SparkSession, see tracesql.spark.session) the files are read by Spark tasks instead of local
    processes; the run is published the same way.

    >>> tracesql.ingest(["traces/run-1234/"], "runs/1234")          # doctest: +SKIP
    """
    out = Path(out).absolute()
    sources = [Path(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    root, files = find_traces(sources, exclude=out)
    if rank is not None and len(files) > 1:
        raise TraceError(out, f"--rank applies to a single trace file, but {len(files)} were given")
    if out.exists() and not store.is_run(out) and any(out.iterdir()):
        raise TraceError(out, "exists and is not a tracesql run (refusing to write into it)")
    old = store.load_manifest(out, rewriting=True) if store.is_run(out) else None
    run_id = run_id or (old or {}).get("run_id") or out.name
    options = {"rank": rank, "run_id": run_id}
    result = IngestResult(run=out, run_id=run_id)

    wanted = {str(f.relative_to(root)) if f != root else f.name: f for f in files}
    old_sources = (old or {}).get("sources", {})
    todo, keep = {}, {}
    for rel, f in wanted.items():
        fp = _fingerprint(f, options)
        prev = old_sources.get(rel)
        if prev and all(prev.get(k) == v for k, v in fp.items()):
            keep[rel] = prev
        else:
            todo[rel] = (f, fp)
    result.reused = sorted(keep)
    result.removed = sorted(set(old_sources) - set(wanted))
    if not todo and not result.removed:
        return result

    staging = store.new_staging(out)
    try:
        for rel, entry in keep.items():
            for part in entry["parts"]:
                store.reuse_part(out, staging, part)
        entries = dict(keep)
        ranks = (rank, 0 if len(files) == 1 else None)
        if spark is not None:
            from .spark import read_files

            done = read_files(spark, todo, staging, ranks, run_id)
        else:
            done = _run_all(todo, staging, ranks, run_id, jobs, progress)
        for rel, summary in done:
            entries[rel] = {**todo[rel][1], **summary}
            result.ingested.append(rel)
            if summary["skipped"]:
                detail = ", ".join(f"{n} {why}" for why, n in summary["skipped"].items())
                if strict:
                    raise TraceError(todo[rel][0], f"damaged events: {detail} (without --strict they are skipped)")
                result.warnings.append(f"{todo[rel][0]}: skipped damaged events: {detail}")
            result.warnings += [f"{todo[rel][0]}: {note}" for note in summary["notes"]]
        by_rank: dict[int, str] = {}
        for rel in sorted(entries):
            for r in entries[rel]["ranks"]:
                if r in by_rank:
                    raise TraceError(wanted[rel], f"rank {r} is also the rank of {by_rank[r]}; "
                                                  "ingest different jobs into different runs")
                by_rank[r] = rel
        result.ingested.sort()
        for entry in entries.values():
            for table, n in entry["rows"].items():
                result.rows[table] = result.rows.get(table, 0) + n
        manifest = {"run_id": run_id, "sources": {rel: entries[rel] for rel in sorted(entries)},
                    "warnings": result.warnings}
        store.publish(staging, out, manifest, engine.init_sql())
    except BaseException:
        store.discard(staging)
        raise
    return result


def _run_all(todo: dict, staging: Path, ranks: tuple, run_id: str, jobs: int | None, progress: bool):
    """Yield (rel, summary) as files finish; one process per core when there are several files."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    bar = _progress(len(todo)) if progress else None
    try:
        if jobs == 1:
            for rel, (f, _) in todo.items():
                yield rel, _read_one(str(f), rel, str(staging), ranks, run_id, threads)
                bar and bar.advance()
            return
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(_read_one, str(f), rel, str(staging), ranks, run_id, threads): rel
                       for rel, (f, _) in todo.items()}
            try:
                for fut in as_completed(futures):
                    yield futures[fut], fut.result()
                    bar and bar.advance()
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise
    finally:
        bar and bar.close()


class _progress:
    """A rich progress bar on stderr (only used when stderr is a terminal)."""

    def __init__(self, total: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._p = Progress(TextColumn("ingest"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           transient=True)
        self._p.start()
        self._task = self._p.add_task("ingest", total=total)

    def advance(self):
        self._p.advance(self._task)

    def close(self):
        self._p.stop()
