"""`tracesql ingest`: trace files -> a run folder of Parquet tables. Files are read in parallel processes."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import archives, db, functions, labels, limits, quality, schema, store, views
from .arrays import array, strings, to_numpy
from .errors import TraceError, env_number



@dataclass
class IngestResult:
    run: Path
    run_id: str
    ingested: list[str] = field(default_factory=list)  # source paths read this time
    reused: list[str] = field(default_factory=list)  # unchanged sources whose tables were kept
    removed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)  # rows of each table in the run (all sources)
    relabeled: bool = False  # the run's given labels changed (then it is published again)

    @property
    def changed(self) -> bool:
        return bool(self.ingested or self.removed or self.relabeled)


#: Where vLLM and SGLang write the traces of their CUDA/HIP-graph captures, beside the profile: a second trace of
#: the same rank (the ops that launched each kernel of the graph, at capture time), not a rank of the job. Its
#: traces attribute the graph-replayed kernels of the traces beside it (readers/graph_capture.py).
CAPTURE_FOLDER = "capture_traces"


def _capture_files(folder: Path) -> list[Path]:
    from .readers import trace_suffixes

    suffixes = trace_suffixes()
    return sorted(f.resolve() for f in folder.iterdir() if f.is_file() and f.name.endswith(suffixes)
                  and not f.name.startswith("."))


def _captures_option(trace: Path, given: Path | None) -> dict:
    """The fingerprint option naming the capture traces of `trace` (path, size, mtime: a changed one reads the
    trace again): those of `given` (--capture-traces), else of the capture folder beside it; {} when none."""
    chosen = given if given is not None else trace.parent / CAPTURE_FOLDER
    if not chosen.is_dir():
        return {}
    files = _capture_files(chosen)
    return {"capture_traces": [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]} if files else {}


def capture_paths(fingerprint: dict) -> list[str]:
    """The capture traces a source's fingerprint names (_captures_option)."""
    return [f for f, _, _ in fingerprint["options"].get("capture_traces", [])]


def find_traces(sources: list[Path], exclude: Path | None = None) -> tuple[Path, list[Path]]:
    """The trace files named or found (recursively) under `sources`, and the folder their paths are relative to.
    A `capture_traces` folder inside a source folder is not searched (its traces attribute graph replays of the
    traces beside it: _captures_option); named itself, it is."""
    from .readers import is_companion, trace_suffixes

    suffixes = trace_suffixes()
    files: list[Path] = []
    for src in sources:
        if src.is_dir():
            for root, dirs, names in os.walk(src):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and Path(root, d) != exclude
                                 and d != CAPTURE_FOLDER)
                files += [Path(root, n) for n in sorted(names) if n.endswith(suffixes) and not n.startswith(".")
                          and not is_companion(Path(root, n))]
        elif src.exists():
            files.append(src)
        else:
            raise TraceError(src, "no such file or folder")
    for f in files:
        _check_regular(f)
    if not files:
        raise TraceError(", ".join(map(str, sources)), f"no trace files found (looked for *{', *'.join(suffixes)})")
    files = sorted({f.resolve() for f in files})
    root = Path(os.path.commonpath([f.parent for f in files]))
    return root, files


_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"))


def _check_regular(path: Path) -> None:
    """Refuse what is not a regular file (reading a FIFO would wait forever for a writer) in one line."""
    try:
        mode = path.stat().st_mode  # through a symbolic link: what it points to counts
    except OSError as e:
        raise TraceError(path, f"cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        what = next((name for test, name in _SPECIAL if test(mode)), "not a regular file")
        raise TraceError(path, f"{what}, not a regular file: refused (only trace files are read)")


def _fingerprint(source: Path | archives.Member, options: dict) -> dict:
    if isinstance(source, archives.Member):  # a member changes with its archive
        st = source.archive.stat()
        return {"size": source.size, "mtime_ns": st.st_mtime_ns, "archive_bytes": st.st_size, "options": options}
    st = source.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "options": options}


def _shown(source: Path | archives.Member) -> str:
    """How errors name a source: its path, or ARCHIVE/MEMBER."""
    return f"{source.archive}/{source.name}" if isinstance(source, archives.Member) else str(source)


def _sources(root: Path, files: list[Path]) -> dict[str, Path | archives.Member]:
    """Each source by its path relative to `root`; an archive's trace members as ARCHIVE/MEMBER."""
    from .readers import trace_suffixes

    wanted: dict[str, Path | archives.Member] = {}
    for f in files:
        rel = str(f.relative_to(root)) if f != root else f.name
        if archives.is_archive(f):
            wanted.update({f"{rel}/{m.name}": m for m in archives.members(f, trace_suffixes())})
        else:
            wanted[rel] = f
    return wanted


def _with_source(table: pa.Table, sources: dict[int, tuple[str, int]]) -> pa.Table:
    """`ranks` or `warnings` rows with each row's source path (and size) filled in: `sources`, rank -> (path, size)
    of the source it came from."""
    ranks = sorted(sources)
    at = np.searchsorted(np.array(ranks, np.int64), to_numpy(table["rank"]).astype(np.int64))
    table = table.set_column(table.schema.get_field_index("source_path"), "source_path",
                             strings([sources[r][0] for r in ranks]).take(array(at)))
    if "source_bytes" in table.column_names:
        table = table.set_column(table.schema.get_field_index("source_bytes"), "source_bytes",
                                 array(np.array([sources[r][1] for r in ranks], np.int64)[at]))
    return table


def read_file(path: str, rel: str, staging: str, ranks: tuple, run_id: str, threads: int, shown: str,
              lim: limits.Limits, step_pattern: str | None = None, scratch: str | None = None,
              captures: list[str] = (), batch: store.BatchWriter | None = None, traces: list | None = None) -> dict:
    """Read, normalize and write one file's tables into the staging run `staging`; returns its summary (ranks,
    parts, format, events, skipped, notes, rows). Runs in a worker process (a local one, or a Spark task: the
    `read_files` of `ingest`).
    `ranks` is (the user's --rank, the rank to assume when the trace names none); `shown`: the name errors give
    the file (an archive member's, when `path` is its unpacked copy). A file that holds several processes gives
    one rank each (and one part each). `scratch`: the folder for the readers' temporary files (the ingest's
    `.RUN.extract-*` folder beside the run, which the next ingest removes whatever killed this one). `captures`:
    the graph-capture traces that attribute its graph-replayed kernels (capture_paths). `batch`: the writer of
    the batch the file's tables go into (read_group), instead of parts of its own; `traces`: what the reader gave
    for it, when read with the batch's other files (readers.read_batch)."""
    try:
        with limits.using(lim), _temporary_files_in(scratch):
            return limits.watched(lim, shown, _read_normalize_write, Path(path), rel, staging, ranks, run_id,
                                  threads, step_pattern, [Path(c) for c in captures], batch, traces)
    except TraceError as e:
        if e.path == path and shown != path:
            raise TraceError(shown, e.problem) from None
        raise
    except duckdb.OutOfMemoryException as e:
        raise _out_of_memory(shown, "needs", lim, e) from None


def _out_of_memory(shown, needs: str, lim: limits.Limits, error: duckdb.OutOfMemoryException) -> TraceError:
    """What DuckDB could not spill (a file's ingest: `needs`; the run's steps: 'the run-wide steps need'), in one
    line: the file or run, and the limit."""
    return TraceError(shown, f"{needs} more memory than --memory-limit {lim.memory} gives DuckDB "
                             f"({str(error).strip().splitlines()[0]}): ingest it with a larger --memory-limit")


@contextlib.contextmanager
def _temporary_files_in(scratch: str | None):
    """Temporary files (tempfile's, DuckDB's spill files) go into `scratch` while in this block."""
    if scratch is None:
        yield
        return
    before = tempfile.tempdir
    tempfile.tempdir = scratch
    try:
        yield
    finally:
        tempfile.tempdir = before


@contextlib.contextmanager
def _sigint_ignored():
    """SIGINT ignored while in this block (in the main thread): processes started meanwhile inherit that, so a
    Ctrl-C while they boot cannot print their tracebacks; the parent handles it once they run."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _worker_start(parent: int, scratch: str) -> None:
    """A worker process's setup: it dies with its parent (Linux: PR_SET_PDEATHSIG, so a `kill -9` of the ingest
    leaves no worker behind to write into staging folders), leaves Ctrl-C to its parent, and keeps its temporary
    files in the ingest's scratch folder."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(1)
    tempfile.tempdir = scratch


def read_group(files: list[tuple[str, str, str, list[str]]], staging: str, ranks: tuple, run_id: str, threads: int,
               lim: limits.Limits, step_pattern: str | None = None, scratch: str | None = None) -> list:
    """Read the files `files` ((path, rel, shown, captures) each) as read_file reads each, one after another, and
    return [(rel, summary)]. One file gets parts of its own; several (small members of one archive: _batches) are
    written together, one part per table for the batch (a member's fixed cost of writing a dozen files, and the
    run-wide tables' of reading them back, paid once per batch), each summary naming the batch's part; Kineto
    ones are read together too (_read_together)."""
    if len(files) == 1:
        ((path, rel, shown, captures),) = files
        return [(rel, read_file(path, rel, staging, ranks, run_id, threads, shown, lim, step_pattern, scratch,
                                captures))]
    part = store.batch_part_name(store.part_key(files[0][1], staging))
    read = _read_together(files, threads, lim, scratch)
    with store.BatchWriter(Path(staging), part) as batch:
        together = read and _normalize_together(files, read, staging, ranks, run_id, threads, lim, step_pattern,
                                                scratch, batch)
        if together:
            return together
        # (traces normalize took, and failed on, are read again: it adds their step notes)
        read = read if read and together is None else [None] * len(files)
        return [(rel, read_file(path, rel, staging, ranks, run_id, threads, shown, lim, step_pattern, scratch,
                                captures, batch, traces))
                for (path, rel, shown, captures), traces in zip(files, read)]


def _read_together(files: list[tuple[str, str, str, list[str]]], threads: int, lim: limits.Limits,
                   scratch: str | None) -> list | None:
    """The traces of each of `files` (read_group's), read in one pass (readers.read_batch: a statement's planning is
    most of a tiny trace's cost), or None when they cannot be (not all Kineto/Chrome JSON, graph captures to
    attribute, one damaged, or the pass past the memory bound): each is then read alone, its errors naming it."""
    from .readers import read_batch

    if any(captures for *_, captures in files):
        return None
    with limits.using(lim), _temporary_files_in(scratch):
        try:
            return limits.watched(lim, files[0][2], read_batch, [Path(path) for path, *_ in files], threads)
        except TraceError:
            return None


def _normalize_together(files: list[tuple[str, str, str, list[str]]], read: list, staging: str, ranks: tuple,
                        run_id: str, threads: int, lim: limits.Limits, step_pattern: str | None,
                        scratch: str | None, batch: store.BatchWriter) -> list | None | bool:
    """The summaries of `files` (read_group's) whose traces `read` (one each) are normalized together
    (normalize_batch: one pass of each statement), their tables written to `batch` once each. None when they
    cannot be (a file of several traces, a rank not known or not distinct); False when normalizing them together
    failed (an error, or past the memory bound): each file is then read and normalized alone, and its errors name
    it."""
    from .normalize import normalize_batch

    if any(len(traces) != 1 for traces in read):
        return None
    traces = [data for data, in read]
    chosen, fallback = ranks
    member_ranks = [next((r for r in (chosen, data.rank, fallback) if r is not None), None) for data in traces]
    if None in member_ranks or len(set(member_ranks)) < len(member_ranks):
        return None
    sources = {rank: (rel, Path(path).stat().st_size) for rank, (path, rel, *_) in zip(member_ranks, files)}
    tables: dict[str, pa.Table] = {}

    def keep(name: str, rows) -> int:  # written once all went well
        table = rows if isinstance(rows, pa.Table) else rows.to_arrow_table()
        tables[name] = _with_source(table, sources) if name in ("ranks", "warnings") else table
        return table.num_rows

    shed = traces[0]  # (its mappings, with every trace's: shed while normalizing)
    shed.mappings.extend(m for data in traces[1:] for m in data.mappings)
    gc.disable()  # as _read_normalize_write
    try:
        with limits.using(lim), _temporary_files_in(scratch), shed.shedding():
            limits.watched(lim, files[0][2], normalize_batch, traces, run_id, member_ranks, keep, threads,
                           step_pattern)
    except (TraceError, duckdb.Error, pa.ArrowException):
        return False
    finally:
        gc.enable()
    counts = {name: _rows_per_rank(table) for name, table in tables.items()}
    for name, table in tables.items():
        batch.write(name, table)
    return [(rel, {"ranks": [rank], "parts": [batch.part], "format": data.format, "events": data.event_count,
                   "skipped": dict(data.skipped), "notes": list(data.notes),
                   "rows": {name: by_rank.get(rank, 0) for name, by_rank in counts.items()}})
            for (_, rel, *_), data, rank in zip(files, traces, member_ranks)]


def _rows_per_rank(table: pa.Table) -> dict[int, int]:
    ranks, counts = np.unique(to_numpy(table["rank"]), return_counts=True)
    return dict(zip(ranks.tolist(), counts.tolist()))


def _read_normalize_write(p: Path, rel: str, staging: str, ranks: tuple, run_id: str, threads: int,
                          step_pattern: str | None = None, captures: list[Path] = (),
                          batch: store.BatchWriter | None = None, traces: list | None = None) -> dict:
    from .normalize import normalize
    from .readers import read_trace

    gc.disable()  # bulk allocation of short-lived, acyclic objects: the cycle collector only costs time here
    try:
        if traces is None:
            traces = read_trace(p, threads=threads, captures=captures)
        chosen, fallback = ranks if len(traces) == 1 else (None, None)
        summary = {"ranks": [], "parts": [], "format": traces[0].format, "events": 0, "skipped": {},
                   "notes": [], "rows": {}}
        for data in traces:
            rank = next((r for r in (chosen, data.rank, fallback) if r is not None), None)
            if rank is None:
                raise TraceError(p, "cannot tell which rank this is: no distributedInfo, no rank-N/workerN in the "
                                    "name; ingest it alone with --rank N")
            part = batch.part if batch else store.part_name(rank, store.part_key(rel, staging))
            # each table is written as soon as it is done; the shedding covers the writes still running at the end
            with data.shedding(), contextlib.nullcontext(batch) if batch else store.PartWriter(Path(staging), part) \
                    as writer:
                sources = {rank: (rel, p.stat().st_size)}
                rows = normalize(data, run_id, rank, threads=threads, step_pattern=step_pattern, on_table=lambda name, table: writer.write(
                    name, _with_source(table, sources) if name in ("ranks", "warnings") else table))
            summary["ranks"].append(rank)
            if part not in summary["parts"]:  # (a batch's part holds each of the file's ranks)
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
    memory_limit: str | None = None,
    max_events: int | None = None,
    step_pattern: str | None = None,
    read_files=None,
    label: tuple | list = (),
    label_pattern: str | None = None,
    capture_traces: str | os.PathLike | None = None,
) -> IngestResult:
    """Ingest trace files or folders into the run folder `out`. Unchanged files already in `out` are not re-read.
    `memory_limit` caps DuckDB's working memory per file (it spills to disk beyond it); `max_events` reads only
    the first N events of each file (see `tracesql.limits`). `read_files(todo, staging, ranks, run_id, limits,
    step_pattern)`, when given, reads the files instead of local processes (tracesql.spark.read_files: Spark
    tasks), yielding (rel, summary) per file as `read_file` returns it; the run is published the same way.
    `step_pattern`: a regular expression naming the ranges that are steps (named groups step, phase, batch,
    tokens, prefill_tokens; see tracesql.step_rules), tried before the built-in rules; files are read again when
    it changes. `label` (KEY=VALUE texts) and `label_pattern` (a regex with named groups over the sources'
    paths), with tracesql.toml / labels.json beside the traces, give the run's labels (tracesql.labels); each
    ingest sets them anew. The CUDA/HIP-graph capture traces in the `capture_traces` folder beside a trace (or
    in the folder `capture_traces`, for every trace) attribute its graph-replayed kernels to ops; they are not
    ranks.

    >>> tracesql.ingest(["traces/run-1234/"], "runs/1234")          # doctest: +SKIP
    """
    from .readers.common import max_inflate_ratio

    lim = limits.Limits.make(memory_limit, max_events)
    jobs = jobs or default_jobs()
    archives.max_bytes(), max_inflate_ratio()  # a bad environment value is refused before any work
    if step_pattern is not None:
        from .step_rules import user_rule

        user_rule(step_pattern)  # checked before anything is read
    out = Path(out).absolute()
    sources = [Path(s) for s in ([sources] if isinstance(sources, (str, os.PathLike)) else sources)]
    root, files = find_traces(sources, exclude=out)
    if capture_traces is not None:
        capture_traces = Path(capture_traces).absolute()
        if not capture_traces.is_dir() or not _capture_files(capture_traces):
            raise TraceError(capture_traces, "--capture-traces: not a folder of trace files")
    wanted = _sources(root, files)
    given = labels.given(sources, label, label_pattern)  # bad labels are refused before anything is read
    if rank is not None and not (isinstance(rank, int) and 0 <= rank < 2**31):
        raise TraceError("--rank", f"{rank!r} is not a rank (an integer from 0 to {2**31 - 1})")
    if rank is not None and len(wanted) > 1:
        raise TraceError(out, f"--rank applies to a single trace file, but {len(wanted)} were given")
    try:
        with store.locked(out):  # one ingest of a run at a time, from reading its manifest to publishing
            store.remove_leftovers(out)
            scratch = store.new_scratch(out)  # archive members are unpacked here
            try:
                return _ingest_locked(out, wanted, scratch, rank, run_id, jobs, strict, progress, lim, read_files,
                                      step_pattern, given, capture_traces)
            finally:
                archives.remove(scratch)
    except OSError as e:  # the run's folder cannot be written (permissions, disk full, ...)
        raise TraceError(e.filename or out, f"cannot write the run: {e.strerror or e}") from None
    except duckdb.IOException as e:  # DuckDB's spill or scratch files: "Async write failed" means a full disk
        free = shutil.disk_usage(out.parent).free if out.parent.exists() else 0
        raise TraceError(out, f"cannot write the run or its scratch files ({str(e).strip().splitlines()[0]}): is "
                              f"the disk full? ({free / 2**30:.1f} GiB free)") from None


def _ingest_locked(out: Path, wanted: dict, scratch: Path, rank, run_id, jobs, strict, progress,
                   lim: limits.Limits, read_files, step_pattern: str | None = None,
                   given: dict | None = None, capture_traces: Path | None = None) -> IngestResult:
    if out.exists() and not out.is_dir():
        raise TraceError(out, "exists and is not a tracesql run: a file (refusing to write over it)")
    if out.exists() and not store.is_run(out) and any(out.iterdir()):
        raise TraceError(out, "exists and is not a tracesql run (refusing to write into it)")
    old, damage = _previous_run(out)
    run_id = run_id or (old or {}).get("run_id") or out.name
    options = {"rank": rank, "run_id": run_id, **({"max_events": lim.max_events} if lim.max_events else {}),
               **({"step_pattern": step_pattern} if step_pattern is not None else {})}
    result = IngestResult(run=out, run_id=run_id)
    if damage:
        result.warnings.append(f"{damage}; all its sources are read again")

    old_sources = (old or {}).get("sources", {})
    if old and old["schema_version"] != schema.SCHEMA_VERSION:  # its files lack what this version writes
        result.warnings.append(f"{out}: {store.older_schema_note(old)}; all its sources are read again")
        old_sources = {rel: {**entry, "size": None} for rel, entry in old_sources.items()}
    todo, keep = {}, {}
    for rel, f in wanted.items():
        trace = f.archive if isinstance(f, archives.Member) else f
        fp = _fingerprint(f, {**options, **_captures_option(trace, capture_traces)})
        prev = old_sources.get(rel)
        if prev and all(prev.get(k) == v for k, v in fp.items()):
            keep[rel] = prev
        else:
            todo[rel] = (f, fp)
    result.reused = sorted(keep)
    result.removed = sorted(set(old_sources) - set(wanted))
    given_labels = {k: list(v) for k, v in (given or {}).items()}  # as the manifest's JSON holds them
    result.relabeled = bool(old) and old.get("labels", {}) != given_labels
    if not todo and not result.removed and not result.relabeled:
        return result
    members = [src for src, _ in todo.values() if isinstance(src, archives.Member)]
    groups = _batches(todo, jobs, lim)
    unpacked = archives.extract(members, scratch) if members else {}
    # rel -> (the file to read, its fingerprint, the name to show)
    todo = {rel: (unpacked.get(src, src), fp, _shown(src)) for rel, (src, fp) in todo.items()}

    staging = store.new_staging(out)
    try:
        for part in dict.fromkeys(part for entry in keep.values() for part in entry["parts"]):  # a batch's once
            store.reuse_part(out, staging, part)
        entries = dict(keep)
        ranks = (rank, 0 if len(wanted) == 1 else None)
        if read_files is not None:
            done = read_files(todo, staging, ranks, run_id, lim, step_pattern)
        else:
            done = _run_all(todo, groups, staging, ranks, run_id, jobs, progress, lim, scratch, step_pattern)
        for rel, summary in done:
            entries[rel] = {**todo[rel][1], **summary}
            result.ingested.append(rel)
            if summary["skipped"]:
                detail = ", ".join(f"{n} {why}" for why, n in summary["skipped"].items())
                if strict:
                    raise TraceError(todo[rel][2], f"damaged events: {detail} (without --strict they are skipped)")
                result.warnings.append(f"{todo[rel][2]}: skipped damaged events: {detail}")
            result.warnings += [f"{todo[rel][2]}: {note}" for note in summary["notes"]]
        by_rank: dict[int, str] = {}
        for rel in sorted(entries):
            for r in entries[rel]["ranks"]:
                if r in by_rank:
                    raise TraceError(_shown(wanted[rel]), f"rank {r} is also the rank of {by_rank[r]}; "
                                                          "ingest different jobs into different runs")
                by_rank[r] = rel
        result.ingested.sort()
        for entry in entries.values():
            for table, n in entry["rows"].items():
                result.rows[table] = result.rows.get(table, 0) + n
        parts = store.parquet_files(staging)  # what the run-wide steps read (none reads what another writes)
        try:
            _write_run_checks(staging, parts, lim)
            _write_run_labels(staging, parts, run_id, given or {}, lim)
            _write_op_costs(staging, parts, lim)
        except duckdb.OutOfMemoryException as e:
            raise _out_of_memory(str(out), "the run-wide steps need", lim, e) from None
        manifest = {"run_id": run_id, "sources": {rel: entries[rel] for rel in sorted(entries)},
                    "warnings": result.warnings, "labels": given_labels}
        store.publish(staging, out, manifest, views.init_sql, known_files=(old or {}).get("files"))
    except BaseException:
        store.discard(staging)
        raise
    return result


def _previous_run(out: Path) -> tuple[dict | None, str | None]:
    """The manifest of the run `out` already holds, when its files can be carried over (None when there is no
    run), and what is wrong with it when it is damaged (then nothing is carried over: every source is read
    again). A manifest that is no JSON object, or of a schema version this tracesql does not read, is refused."""
    if not store.is_run(out):
        return None, None
    manifest = store.load_manifest(out)  # unreadable, or of a schema version this tracesql does not read: refused
    try:
        sources = manifest.get("sources", {})
        if not isinstance(sources, dict):
            raise TraceError(out / store.MANIFEST, "damaged manifest: 'sources' is not an object")
        for rel, entry in sources.items():
            if not (isinstance(entry, dict) and isinstance(entry.get("parts"), list) and
                    isinstance(entry.get("ranks"), list) and isinstance(entry.get("rows"), dict)
                    and all(isinstance(p, str) for p in entry["parts"])):
                raise TraceError(out / store.MANIFEST, f"damaged manifest: the entry of {rel!r} is incomplete")
        store.files_of(out, manifest)  # parts missing, added or changed: carry none over
    except TraceError as e:
        return None, str(e)
    return manifest, None


# The run-wide steps below run on connections db.for_trace keeps (those of the reads before, moved): opening one
# and creating the macros again for each step of each ingest cost more than a tiny run's steps.

def _of_tables(staging: Path, parts: list[str], tables: tuple[str, ...]) -> dict[str, list[str]]:
    """The paths of `parts` (the run's `table/file.parquet`) per table of `tables`."""
    return {t: [str(staging / rel) for rel in parts if rel.split("/")[0] == t] for t in tables}


def _write_run_checks(staging: Path, parts: list[str], lim: limits.Limits) -> None:
    """The checks that need every rank (clocks far apart), as the run's own `warnings` file."""
    (staging / "warnings").mkdir(exist_ok=True)
    ranks = [views.escape_path(f) for f in _of_tables(staging, parts, ("ranks",))["ranks"]]
    with db.for_trace(1, lim.memory) as con:
        rows = con.sql(f"SELECT {schema.select_list('warnings')} FROM ({quality.CLOCK_SKEW_SQL})",
                       params={"ranks": ranks})
        store.write_relation(rows, staging / "warnings" / store.run_checks_name(staging))


def _write_run_labels(staging: Path, parts: list[str], run_id: str, given: dict, lim: limits.Limits) -> None:
    """The run's row of the `runs` table: the labels its traces record, overridden by the given ones."""
    files = _of_tables(staging, parts, ("ranks", "devices", "process_groups"))
    with db.for_trace(1, lim.memory) as con:
        con.execute(views.views_sql(files)).fetchall()
        run_labels, sources = labels.merged(labels.recorded(con), given)
    (staging / "runs").mkdir(exist_ok=True)
    row = pa.table({"run_id": [run_id], "labels": [json.dumps(run_labels)], "label_sources": [json.dumps(sources)]})
    pq.write_table(schema.conform("runs", row), staging / "runs" / f"run-{store.generation(staging)}.parquet")


OP_COSTS_SQL = (Path(__file__).parent / "op_costs.sql").read_text()


#: The families of the formulas the run's ops take (of the calls op_costs.sql costs)
OP_FAMILIES_SQL = "SELECT DISTINCT k.family FROM op_calls()"


#: a memory limit under this runs the run-wide op_costs query on one thread (_write_op_costs)
SMALL_MEMORY_BYTES = 256 << 20

#: the least DuckDB memory the op_costs query gets: its ~57 hash tables (joins and groupings) take 40-90 MB on
#: one thread whatever the run's size (hta_nccl_parser_config's 14,346 ops: 53-62 MB; tracelens_b200_eager's
#: 4,809: 79-88), which a smaller --memory-limit could not hold; within the ingest's fixed overhead
#: (limits.FIXED_OVERHEAD)
OP_COSTS_MIN_MEMORY = "128MB"


def _write_op_costs(staging: Path, parts: list[str], lim: limits.Limits) -> None:
    """The run's `op_costs` table: every op's cost, by the formulas of functions/30_flops.sql, over all its ranks
    at once (each distinct call costed once for the run). Under a small memory limit on one DuckDB thread: each
    thread keeps its own hash tables, and two needed ~60 MB on the bundled hta_trace_filter (one: under 48 MB;
    on the 24x tile one thread takes 7.7-9.3 s against 6.1 s)."""
    files = _of_tables(staging, parts, ("ops", "slices", "xla_ops"))
    (staging / "op_costs").mkdir(exist_ok=True)
    path = staging / "op_costs" / f"run-{store.generation(staging)}.parquet"
    memory = max(lim.memory, OP_COSTS_MIN_MEMORY, key=limits.size_bytes)
    with db.for_trace(1 if lim.memory_bytes < SMALL_MEMORY_BYTES else None, memory) as con:
        con.execute(views.views_sql({**files, "op_costs": []})).fetchall()  # op_costs: empty, of the table's columns
        if con.execute("SELECT count(*) FROM ops").fetchall()[0][0]:  # else (Nsight, rocprof, ...) no formulas to bind
            functions.install(con, names=functions.words(OP_FAMILIES_SQL))
            families = {family for family, in con.execute(OP_FAMILIES_SQL).fetchall() if family is not None}
            dispatch = functions.family_dispatch(families, temp=True)  # only those families' formulas are bound
            functions.install(con, names=functions.words(OP_COSTS_SQL + dispatch) - set(functions.FAMILY_DISPATCH))
            con.execute(dispatch).fetchall()
            # in a fixed order: the same run gives the same bytes (verify's answer), whatever DuckDB's threads did
            rows = con.sql(f"SELECT {schema.select_list('op_costs')} FROM ({OP_COSTS_SQL}) ORDER BY rank, op_id")
            store.write_relation(rows, path)
            # (the kept connection's next run may have other families)
            con.execute("".join(f"DROP MACRO temp.main.{name};" for name in functions.FAMILY_DISPATCH)).fetchall()
        else:
            store.write_relation(con.sql("SELECT * FROM op_costs"), path)


def default_jobs() -> int | None:
    """Files read at once when the caller does not say: `$TRACESQL_JOBS` (also for the ingests a query on raw
    traces does into its cache, which take no --jobs), else None: one process per core."""
    return env_number("TRACESQL_JOBS", None, int, lambda n: n >= 1, "a number of files read at once (1 or more)")


#: Archive members of up to this many unpacked bytes are read in batches (read_group): for a small member the
#: fixed cost of a source (a dozen Parquet files written, then read back by the run-wide tables) is much of its work
BATCH_MEMBER_BYTES = 1 << 20
#: the most members in a batch: the parts a batch writes (one per table) stay few while the batches still spread
#: over the processes
BATCH_MEMBERS = 500


def _batches(todo: dict, jobs: int | None, lim: limits.Limits) -> list[list[str]]:
    """The sources of `todo` (rel -> (source, fingerprint)) in the groups that are read together: the small
    members of each archive in batches (at least one per process, at most BATCH_MEMBERS members and a 16th of
    --memory-limit of unpacked bytes each: a batch's tables are held in memory until it is written), every other
    source alone."""
    alone, small = [], {}
    for rel, (src, _) in todo.items():
        if isinstance(src, archives.Member) and src.size <= BATCH_MEMBER_BYTES:
            small.setdefault(src.archive, []).append(rel)
        else:
            alone.append([rel])
    budget = max(BATCH_MEMBER_BYTES, lim.memory_bytes // 16)
    groups = []
    for rels in small.values():
        sizes = [todo[rel][0].size for rel in rels]
        count = max(min(jobs or os.cpu_count() or 1, len(rels)), -(-len(rels) // BATCH_MEMBERS),
                    -(-sum(sizes) // budget))
        most = -(-len(rels) // count)
        batch, held = [], 0
        for rel, size in zip(rels, sizes):
            if batch and (len(batch) == most or held + size > budget):
                groups.append(batch)
                batch, held = [], 0
            batch.append(rel)
            held += size
        groups.append(batch)
    return groups + alone


def _run_all(todo: dict, groups: list[list[str]], staging: Path, ranks: tuple, run_id: str, jobs: int | None,
             progress: bool, lim: limits.Limits, scratch: Path, step_pattern: str | None = None):
    """Yield (rel, summary) as files finish; one process per core when there are several groups (_batches)."""
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(groups)))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    bar = _progress(len(todo)) if progress else None

    def group_args(group: list[str]) -> dict:
        """read_group's arguments for `group`."""
        return {"files": [(str(todo[rel][0]), rel, todo[rel][2], capture_paths(todo[rel][1])) for rel in group],
                "staging": str(staging), "ranks": ranks, "run_id": run_id, "threads": threads, "lim": lim,
                "step_pattern": step_pattern, "scratch": str(scratch)}

    try:
        if jobs == 1:
            for group in groups:
                for done in read_group(**group_args(group)):
                    yield done
                    bar and bar.advance()
            return
        pool = ProcessPoolExecutor(jobs, mp_context=get_context("spawn"), initializer=_worker_start,
                                   initargs=(os.getpid(), str(scratch)))
        try:
            with _sigint_ignored():  # workers start with Ctrl-C ignored (inherited), so it never interrupts them
                futures = [pool.submit(read_group, **group_args(group)) for group in groups]
            for fut in as_completed(futures):
                for done in fut.result():
                    yield done
                    bar and bar.advance()
        except BaseException:  # an error or Ctrl-C: the other files' work is moot, stop it now
            workers = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for w in workers:
                w.kill()
            for w in workers:
                w.join()
            raise
        pool.shutdown()
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
