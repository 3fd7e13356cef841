"""The `tracesql` command. Thin: each command calls the Python API (tracesql.ingest / connect / queries.run).

Start-up is part of every command's time, so this module imports only click and tracesql's light modules at the
top; DuckDB, Arrow and the rest are imported by the commands that use them (`tracesql --help` loads none).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import warnings
from pathlib import Path

import click

from .errors import OlderSchemaWarning, TraceError, install_extra
from .version import __version__

FORMATS = ("table", "csv", "json", "markdown", "parquet")  # output.FORMATS (a test checks)
ENGINES = ("duckdb", "spark")


def _show():
    """tracesql.output, imported when a command prints a result (`output` is also the name of the -o option)."""
    from . import output

    return output


def _spark_session(master: str | None):
    from .spark import session

    return session(master)


def _errors_as_messages(fn):
    """Bad input and SQL errors become one line `Error: ...` with exit status 1, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            with warnings.catch_warnings(record=True) as notes:
                warnings.simplefilter("always", OlderSchemaWarning)
                try:
                    return fn(*args, **kwargs)
                finally:
                    for note in notes:
                        click.echo(f"Note: {note.message}", err=True)
        except TraceError as e:
            raise click.ClickException(str(e)) from None
        except OSError as e:  # a file the command writes or reads (permissions, a full disk, a folder)
            where = e.filename or "tracesql"
            raise click.ClickException(f"{where}: {e.strerror or e}") from None
        except Exception as e:
            duckdb = sys.modules.get("duckdb")  # not imported: then no DuckDB error can have happened
            sql_error = (duckdb is not None and isinstance(e, duckdb.Error)) or \
                type(e).__module__.startswith(("pyspark", "py4j"))
            if not sql_error:
                raise
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise click.ClickException(f"SQL error: {first}") from None

    return wrapper


class _OneLineErrors(click.Group):
    """Every error is one line on stderr, never a traceback: `Error: ...` with exit status 1 (bad input), 2 (a
    usage error: unknown option, bad value) or 130 (interrupted, Ctrl-C). TRACESQL_DEBUG=1 shows tracebacks of
    unexpected errors instead."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:  # before click's own handling, which prints an empty line first
            raise _Interrupted() from None

    def main(self, args=None, prog_name=None, **extra):
        # numpy's OpenBLAS starts a thread per core at import, which spins a while (0.04 CPU s of each command
        # that imports numpy); tracesql does no linear algebra. Set before any command imports numpy.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        # numpy asks the kernel for huge pages for its arrays of 4 MB or more (madvise): each is zeroed and charged
        # whole when first touched, and where huge pages are not the default the kernel compacts memory to find
        # them. `findings` at 24x spent 0.4 CPU-s more in the kernel, 0.26 s more wall (5 runs each); other
        # commands the same either way (docs/benchmarks.md).
        os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")
        try:
            code = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.exceptions.Exit as e:
            code = e.exit_code
        except click.exceptions.NoArgsIsHelpError as e:  # `tracesql` alone: the help, as click shows it
            click.echo(e.ctx.get_help(), err=True)
            code = 2
        except click.UsageError as e:
            where = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
            _fail(f"{e.format_message()}{where}", 2)
        except click.ClickException as e:
            _fail(e.format_message(), e.exit_code)
        except (KeyboardInterrupt, click.Abort):
            _fail("interrupted", 130)
        except BrokenPipeError:  # `tracesql query ... | head`: the reader left, nothing more to say
            sys.stderr.close()
            code = 1
        except Exception as e:
            if os.environ.get("TRACESQL_DEBUG"):
                raise
            _fail(f"internal error: {type(e).__name__}: {e} (a tracesql bug: please report it; TRACESQL_DEBUG=1 "
                  "shows where)", 1)
        sys.exit(code if isinstance(code, int) else 0)


def command_line() -> None:
    """The `tracesql` program (and `python -m tracesql`): `main`, then Python's exit without its garbage
    collections. Exiting, the interpreter collects garbage over every object still alive, several times (0.27 s of
    the 0.35 s exit after `findings` at 24x, 0.06 s after a quick query): the process ends, nothing left needs
    collecting, so the objects are frozen out of those collections. Not in `main`, which tests call in-process."""
    import gc

    try:
        main()
    finally:
        gc.freeze()


class _Interrupted(click.ClickException):
    exit_code = 130

    def __init__(self):
        super().__init__("interrupted")


def _fail(message: str, code: int):
    click.echo(f"Error: {' '.join(str(message).split())}", err=True)
    sys.exit(code)


@click.group(cls=_OneLineErrors)
@click.version_option(__version__, prog_name="tracesql")
def main():
    """ML profiler traces as SQL: ingest traces into Parquet tables, then query them."""


@main.command(short_help="Read traces (files, folders, archives) into a run folder.")
@click.argument("sources", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path), help="Run folder to write.")
@click.option("--rank", type=click.IntRange(0, 2**31 - 1),
              help="Rank of a single trace file that does not say its rank.")
@click.option("--run-id", help="Name of the run stored in every row (default: the output folder's name).")
@click.option("-j", "--jobs", type=click.IntRange(1, 1024), help="Files read in parallel (default: one per core).")
@click.option("--strict", is_flag=True, help="Fail on damaged events instead of skipping them with a warning.")
@click.option("--memory-limit", metavar="SIZE",
              help="DuckDB working memory per file, e.g. 2GB; it spills to disk beyond it "
                   "(default: $TRACESQL_MEMORY_LIMIT or 1GB).")
@click.option("--max-events", type=int, metavar="N", help="Read only the first N events of each file (a quick look).")
@click.option("--step-pattern", metavar="REGEX",
              help="Ranges whose names match REGEX are the steps (named groups step, phase, batch, tokens, "
                   "prefill_tokens), before the built-in rules (ProfilerStep, vLLM, SGLang iterations).")
@click.option("--label", "label", multiple=True, metavar="KEY=VALUE",
              help="A label of the run's configuration, e.g. remat=full (repeatable; see docs/guides/ci.md).")
@click.option("--label-pattern", metavar="REGEX",
              help="Labels from the sources' folder names: the named groups of REGEX, e.g. 'dp(?P<dp>\\d+)'.")
@click.option("--capture-traces", type=click.Path(exists=True, file_okay=False, path_type=Path), metavar="DIR",
              help="The traces of the CUDA/HIP-graph captures (vLLM, SGLang), which attribute graph-replayed kernels "
                   "to the ops that captured them, when they are not in a capture_traces/ folder beside the traces.")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar or summary.")
@click.option("--engine", type=click.Choice(ENGINES), default="duckdb", show_default=True,
              help="spark: read the files in Spark tasks (see --master), one file per task.")
@click.option("--master", help="Spark master URL for --engine spark (default: spark-submit's, else local[2]).")
@_errors_as_messages
def ingest(sources, out, rank, run_id, jobs, strict, memory_limit, max_events, step_pattern, label, label_pattern,
           capture_traces, quiet, engine, master):
    """Read trace files (or folders of them) into a run folder of Parquet tables.

    Unchanged files already in the run are not read again. On any error the run folder is left as it was.

    Example:

    \b
        tracesql ingest traces/run-1234/ -o runs/1234/
    """
    from . import api

    t0 = time.perf_counter()
    spark = _spark_session(master) if engine == "spark" else None
    result = api.ingest(list(sources), out, rank=rank, run_id=run_id, jobs=jobs, strict=strict,
                        progress=not quiet and sys.stderr.isatty(), memory_limit=memory_limit,
                        max_events=max_events, step_pattern=step_pattern, spark=spark, label=label,
                        label_pattern=label_pattern, capture_traces=capture_traces)
    for w in result.warnings:
        click.echo(f"Warning: {w}", err=True)
    if quiet:
        return
    if not result.changed:
        click.echo(f"{out}: up to date ({len(result.reused)} files unchanged)")
        return
    n = result.rows
    click.echo(f"{out}: {len(result.ingested)} file(s) ingested, {len(result.reused)} unchanged, "
               f"{len(result.removed)} removed in {time.perf_counter() - t0:.2f} s — {n['ranks']} rank(s), "
               f"{n['slices']:,} slices, {n['ops']:,} ops, {n['collectives']:,} collectives")


def _parse_params(pairs) -> dict:
    params = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise click.BadParameter(f"expected NAME=VALUE, got {pair!r}", param_hint="--param")
        params[name.strip()] = value
    return params


SANDBOX_HELP = ("SQL reads the run's tables and nothing else: no other file, no network, no COPY ... TO, ATTACH, "
                "INSTALL or LOAD, no SET; for SQL that a program feeds in.")
STEPS_HELP = ("Only these steps count (the steady state): e.g. 3..9; auto drops the warm-up (leading steps slower "
              "than the rest by more than their spread); default all.")
COLUMNS_HELP = ("Only these columns, in this order: names or patterns, comma-separated (e.g. "
                "'rank,step,*_ns').")


@main.command(short_help="Run a curated query (e.g. overlap) or your .sql file on a run.")
@click.argument("query")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("-p", "--param", "params", multiple=True, metavar="NAME=VALUE", help="Query parameter (repeatable).")
@click.option("-f", "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="table: for people (fits the terminal, one unit per column); the others keep raw values.")
@click.option("-c", "--columns", metavar="NAMES", help=COLUMNS_HELP)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the result to this file.")
@click.option("--engine", type=click.Choice(ENGINES), default="duckdb", show_default=True,
              help="spark: transpile the query to Spark SQL and run it on Spark (see --master).")
@click.option("--master", help="Spark master URL for --engine spark (default: spark-submit's, else local[2]).")
@click.option("--sandbox", is_flag=True, help=SANDBOX_HELP)
@click.option("--steps", "steps_text", metavar="FIRST..LAST|auto|all", help=STEPS_HELP)
@_errors_as_messages
def query(query, target, params, fmt, columns, output, engine, master, sandbox, steps_text):
    """Run a curated query (by name, e.g. `overlap`) or your own .sql file on a run.

    TARGET is a run folder, a folder of runs, or raw traces (ingested on the fly into a cache).

    The table format fits the terminal (a block per row when the columns do not fit: pick some with -c) and
    shows each duration or size column in one unit, named in its header (comm_ns in ms is headed comm_ms); csv,
    json, markdown and parquet keep the raw integers.

    Example:

    \b
        tracesql query overlap runs/1234/ --param class_scheme=hta -c rank,step,*_pct
    """
    from . import queries, steady

    q = queries.find(query)
    params = queries.check(q, _parse_params(params))  # before the target is opened or Spark starts
    steps = steady.parse(steps_text)
    if steps.mode != "all" and engine == "spark":
        raise click.UsageError("--steps runs on DuckDB: not with --engine spark")
    check_output(output)
    if sandbox and (engine == "spark" or fmt == "parquet"):
        raise click.UsageError("--sandbox writes no file and runs on DuckDB: not with --engine spark or -f parquet "
                               "(-f csv or json with -o write the file instead)")
    picked = _show().parse_columns(columns)
    if engine == "spark":
        from . import db
        from . import spark as spark_engine

        session = spark_engine.connect(target, spark=_spark_session(master))
        table = spark_engine.to_arrow(spark_engine.run(session, q, params))
        rows = _emit(db.connect().from_arrow(table), fmt, output, picked)
        why = None
    else:
        from . import engine as duckdb_engine

        def run_and_explain(con):  # printed after: a second attempt (the run swapped meanwhile) prints once
            if steps.mode != "all":
                steady.apply(con, steps)
            rows, deliver = _prepare(queries.run(con, q, params), fmt, output, picked)
            return rows, deliver, queries.explain(con, q, params, rows)

        names = None if steps.mode != "all" else queries.names_used(q)  # --steps reads the steps query too
        rows, deliver, why = duckdb_engine.on_fresh_connection(target, run_and_explain, names=names,
                                                               sandbox=sandbox)
        deliver(_echo)
    if rows == 0:
        click.echo(f"Note: no rows: {why or q.name + ' needs ' + (q.needs or 'data this run does not have')}.",
                   err=True)
    elif why:
        click.echo(f"Note: {why}.", err=True)


@main.command(short_help="What limits each step and what fixing it would save.")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("-p", "--param", "params", multiple=True, metavar="NAME=VALUE",
              help="A rule parameter, for every rule that takes it (e.g. min_saving_pct=2); repeatable.")
@click.option("-f", "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="table: for people (fits the terminal, one unit per column); the others keep raw values.")
@click.option("-c", "--columns", metavar="NAMES", help=COLUMNS_HELP)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the result to this file.")
@_errors_as_messages
def findings(target, params, fmt, columns, output):
    """What limits each step and what fixing it would save: every rule of findings/ that fires above its
    threshold, one row per rank and step, largest saving first.

    TARGET is a run folder, a folder of runs, or raw traces. Each saving is the what-if replay's (the what_if
    query's), and each row's `query` is the command that shows its evidence.

    Example:

    \b
        tracesql findings runs/1234/ -c rank,step,finding,saving_ns,evidence
    """
    import shlex
    import threading

    from . import engine as duckdb_engine
    from . import findings as rules
    from . import longest_path

    params = rules.check(_parse_params(params))  # before the target is opened
    check_output(output)
    picked = _show().parse_columns(columns)
    # (the walks' compiled loops loaded while the run is opened, which keeps one core busy, not beside the event
    # lists' SQL, on two: rules.run waits for them)
    threading.Thread(target=longest_path.load, name="tracesql-load", daemon=True).start()
    rows, deliver = duckdb_engine.on_fresh_connection(
        target, lambda con: _prepare(rules.run(con, shlex.quote(str(target)), params), fmt, output, picked),
        names=rules.names_used())
    deliver(_echo)
    if rows == 0:
        click.echo("Note: no finding: no rule fired above its threshold (`tracesql query bound` says what bounds "
                   "each step).", err=True)


def check_output(output: Path | None, makes_folders: bool = False) -> None:
    """Refuse an --output that cannot be a file to write, before any work is done (`makes_folders`: the command
    creates missing folders)."""
    if output is None:
        return
    if output.is_dir():
        raise TraceError(output, "is a folder: --output names the file to write")
    if makes_folders:
        return
    parent = output.absolute().parent
    if not parent.is_dir():
        raise TraceError(output, f"no such folder: {parent}")
    if not os.access(parent, os.W_OK) or output.exists() and not os.access(output, os.W_OK):
        raise TraceError(output, "cannot write: permission denied")


def _emit(rel, fmt: str, out: Path | None, columns: list[str] | None = None) -> int:
    """Write the result in `fmt` (only `columns`, when given); returns the number of rows."""
    rows, deliver = _prepare(rel, fmt, out, columns)
    deliver(_echo)
    return rows


def _prepare(rel, fmt: str, out: Path | None, columns: list[str] | None = None):
    """The result run and rendered: (rows, deliver) as output.prepare returns them."""
    if fmt == "parquet" and out is None:
        raise click.UsageError("--format parquet needs --output FILE")
    return _show().prepare(rel, fmt, out, columns)


def _echo(text: str) -> None:
    click.echo(text, nl=False)


@main.command(name="queries", short_help="List the curated queries, one line each.")
def list_queries():
    """List the curated queries, one line each."""
    from . import queries

    catalogue = queries.catalogue()
    width = max(len(q.name) for q in catalogue)
    for q in catalogue:
        click.echo(f"{q.name:{width}s}  {q.title}")


@main.command(name="schema", short_help="The tables and what each column means.")
@click.argument("table", required=False)
@click.option("-f", "--format", "fmt", type=click.Choice(["text", "markdown"]), default="text", show_default=True)
def schema_cmd(table, fmt):
    """The tables and their columns, with what each column means."""
    from . import schema

    if fmt == "markdown":
        click.echo(schema.markdown())
        return
    if table and table not in schema.TABLES:
        raise click.ClickException(f"no table {table!r} (tables: {', '.join(schema.TABLES)})")
    click.echo(f"schema version {schema.SCHEMA_VERSION}; times in integer nanoseconds")
    for t in [schema.TABLES[table]] if table else schema.TABLES.values():
        click.echo(f"\n{t.name}: {t.doc}")
        for c in t.columns:
            click.echo(f"  {c.name:24s} {c.type:12s} {c.doc}")


def _time(ns: int) -> str:
    """Absolute ns as UTC when it looks like an epoch time (after 2001), else as ns."""
    if ns >= 10**18:
        from datetime import datetime, timezone

        return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    return f"{ns:,} ns"


@main.command(name="info", short_help="What a run holds: sources, ranks, rows, time span, warnings.")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("-f", "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json: one object, for programs (its JSON Schema is in the docs).")
@_errors_as_messages
def info_cmd(run, fmt):
    """What a run holds: sources, ranks, formats, rows per table, time span, schema version, and the
    data-quality warnings found at ingest (the `warnings` table).

    Example:

    \b
        tracesql info runs/1234/
    """
    from . import info as run_info

    i = run_info.info(run)
    if fmt == "json":
        click.echo(json.dumps(run_info.as_json(i), indent=1, ensure_ascii=False))
        return
    formats = {}
    for src in i.sources:
        formats[src["format"]] = formats.get(src["format"], 0) + 1
    ranks = sorted({src["rank"] for src in i.sources})
    click.echo(f"run:       {i.run} (run_id {i.run_id})")
    click.echo(f"schema:    version {i.schema_version} (written by tracesql {i.tracesql_version or '?'})"
               + (f"; {i.note}" if i.note else ""))
    click.echo(f"sources:   {len({src['source_path'] for src in i.sources})} file(s), {len(ranks)} rank(s) "
               f"({', '.join(map(str, ranks[:8]))}{', …' if len(ranks) > 8 else ''}); "
               + ", ".join(f"{fmt} {n}" for fmt, n in sorted(formats.items())))
    if i.start_ns is not None:
        click.echo(f"time span: {_time(i.start_ns)} → {_time(i.end_ns)} ({(i.end_ns - i.start_ns) / 1e9:.3f} s)")
    click.echo("rows:      " + ", ".join(f"{name} {n:,}" for name, n in i.rows.items()))
    for src in i.sources:
        size = f"{src['bytes'] / 1e6:.2f} MB" if src["bytes"] is not None else "? MB"
        skipped = f" ({src['skipped']:,} skipped)" if src["skipped"] else ""
        click.echo(f"  rank {src['rank']:<5} {src['format']:8s} {size:>10s} {src['events'] or 0:>11,} events"
                   f"{skipped}  {src['source_path']}")
    click.echo(f"warnings:  {len(i.warnings) or 'none'}")
    for w in i.warnings:
        click.echo(f"  rank {w['rank']:<5} {w['check_name']:22s} {w['event_count']:>9,}  {w['source_path']}: "
                   f"{w['message']}" + (f" (e.g. {w['example'][:80]})" if w["example"] else ""))


@main.command(short_help="Check a run's files against its manifest's checksums.")
@click.argument("run", type=click.Path(path_type=Path))
@_errors_as_messages
def verify(run):
    """Check a run's files against its manifest: none missing or added, and each file's size, SHA-256, XXH3-128
    and Parquet page checksums. Exit status 1 with one line naming the first damaged file.

    Example:

    \b
        tracesql verify runs/1234/
    """
    from . import engine, store

    store.require_run(run)
    checked = engine.while_unchanged([run], lambda: store.verify(run))  # again if an ingest swaps it meanwhile
    click.echo(f"{run}: ok — {checked['files']} files, {checked['bytes']:,} bytes match the manifest's checksums")


@main.command(short_help="Interactive SQL on a run (or SQL piped on standard input).")
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--sandbox", is_flag=True, help=SANDBOX_HELP)
@_errors_as_messages
def shell(target, sandbox):
    """An interactive SQL session on a run: the tables are views and the functions exist.

    End each statement with `;`. `.tables` lists the tables, `.quit` leaves. SQL piped on standard input runs
    without prompts; a statement that fails is reported and the next ones still run, and the exit status is 1
    if any failed (or the input ended inside a statement), so a script can tell. Without --sandbox the session is
    DuckDB's, unrestricted: its SQL reads and writes any file you can (COPY ... TO, read_text), as a shell does.

    Example:

    \b
        tracesql shell runs/1234/
    """
    import duckdb

    from . import engine as duckdb_engine
    from . import schema

    con = duckdb_engine.connect(target, sandbox=sandbox)
    if hasattr(sys.stdin, "reconfigure"):  # a line that is not UTF-8 reads with U+FFFD instead of failing
        sys.stdin.reconfigure(errors="replace")
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history)
        except ImportError:
            pass
        click.echo(f"tracesql {__version__} — tables: {', '.join(schema.TABLES)}. End statements with ';', .quit to leave."
                   + (" Sandbox: the run's tables only, no files, no SET." if sandbox else ""))
    buffer = ""
    failed = False
    while True:
        try:
            line = input("tracesql> " if not buffer else "     ...> ") if interactive else sys.stdin.readline()
        except EOFError:
            break
        if not interactive and line == "":
            break
        stripped = line.strip()
        if not buffer and stripped in (".quit", ".exit"):
            break
        if not buffer and stripped == ".tables":
            click.echo("  ".join(schema.TABLES))
            continue
        buffer += line + "\n"
        if not stripped.endswith(";"):
            continue
        sql, buffer = buffer, ""
        try:
            statements = [st.query for st in con.extract_statements(sql)]
        except duckdb.Error:  # a syntax error: run the chunk whole, for DuckDB's message
            statements = [sql]
        for st in statements:  # each on its own: one that fails does not skip the rest of its line
            try:
                rel = con.sql(st)  # None for statements without a result (SET, CREATE, ...)
                if rel is not None:
                    click.echo(_show().table(_show().Result.of(rel)), nl=False)
            except duckdb.Error as e:
                click.echo(f"Error: {str(e).strip().splitlines()[0]}", err=True)
                failed = True
    if buffer.strip():
        click.echo("Error: statement not terminated with ';'", err=True)
        failed = True
    if failed and not interactive:
        sys.exit(1)


@main.command(short_help="HTML report, summary, metrics and CI gates over many runs.")
@click.argument("targets", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=Path("report"), show_default=True,
              help="Folder for index.html, summary.md, metrics.json, metrics.parquet.")
@click.option("--baseline", metavar="RUN|KEY=VALUE,...",
              help="The run to compare with, or a label set naming the baseline runs (default: the runs sharing the "
                   "gated run's labels; see docs/guides/ci.md).")
@click.option("--fail-on", "fail_on", multiple=True, metavar="GATE",
              help="Exit with status 3 when the gate holds, e.g. 'step_time_p50>+5%' or 'overlap<-10pp' (repeatable).")
@click.option("--gate", "gate_runs", type=click.Choice(["latest", "all"]), default="latest", show_default=True,
              help="Gate the latest run, or every run but the baseline.")
@click.option("--order", type=click.Choice(["time", "given"]), default="time", show_default=True,
              help="Run order: by trace start time, or as given (arguments, then folder names).")
@click.option("--threshold", type=float, default=5.0, show_default=True,
              help="A metric worse than the baseline by more than this (% of it, or pp) is a regression.")
@click.option("--model-flops", type=float, help="Model FLOPs of one step of the whole job: enables MFU.")
@click.option("--params", "n_params", type=float, help="Model parameters; with --tokens-per-step, model FLOPs = 6·P·T.")
@click.option("--tokens-per-step", type=float, help="Tokens the whole job processes per step.")
@click.option("--device", help="device_peaks key for MFU/HFU and the roofline (e.g. H100-SXM); default: from the trace.")
@click.option("--top", type=click.IntRange(1), default=10, show_default=True, help="Rows of the hotspot, bubble and diff tables.")
@click.option("--steps", "steps_text", metavar="FIRST..LAST|auto|all", help=STEPS_HELP)
@click.option("--confidence", type=float, default=0.99, show_default=True,
              help="A change gate fails only when the change exceeds the noise at this confidence.")
@click.option("--strict", is_flag=True, help="Gates fail on their threshold alone, whatever the noise.")
@click.option("--history", type=click.Path(path_type=Path),
              help="A folder keeping each report's metrics (Parquet): trends span earlier reports too.")
@_errors_as_messages
def report(targets, out, baseline, fail_on, gate_runs, order, threshold, model_flops, n_params, tokens_per_step,
           device, top, steps_text, confidence, strict, history):
    """A report over many runs: metrics per run and rank, trend, regressions with what explains them, gates.

    TARGETS are run folders, folders of runs, or folders of raw-trace folders (one run per subfolder, ingested
    into the cache incrementally). Exit status: 0, 1 on bad input, 3 when a --fail-on gate failed (one line each):
    a change gate fails only when the change is larger than the noise (unless --strict).

    Example:

    \b
        tracesql report ci-runs/ --baseline ci-runs/main --fail-on "step_time_p50>+5%" -o report/
    """
    try:
        from . import report as reporting
        from .report import render  # (jinja2 and plotly: the [report] extra)
        import plotly  # noqa: F401
    except ImportError as e:
        raise click.ClickException(f"the report needs the [report] extra: {install_extra('report')} ({e})")
    mfu_params = {k: v for k, v in (("model_flops_per_step", model_flops), ("params", n_params),
                                    ("tokens_per_step", tokens_per_step)) if v is not None}
    from . import engine as duckdb_engine

    render.check_folder(out)

    def build_and_write():
        result = reporting.build(list(targets), baseline=baseline, fail_on=fail_on, order=order,
                                 gate_runs=gate_runs, threshold=threshold, mfu_params=mfu_params or None,
                                 device=device, top=top, steps=steps_text, confidence=confidence, strict=strict,
                                 history=history)
        with render.folder_locked(out):  # another report into `out` waits until this one has said what it wrote
            result.write(out)
            click.echo(f"{out}: index.html, summary.md, metrics.json, metrics.parquet — "
                       f"{len(result.metrics.runs)} run(s), baseline {result.baseline}, "
                       f"{len(result.regressions)} regressed")
        return result

    base_run = baseline is not None and reporting.baseline_labels(baseline) is None
    runs = reporting.find_runs(list(targets)) + (duckdb_engine.resolve(baseline) if base_run else [])
    try:
        result = duckdb_engine.while_unchanged(runs, build_and_write)  # again if an ingest swaps a run in
    except OSError as e:
        raise TraceError(e.filename or out, f"cannot write the report: {e.strerror or e}") from None
    for v in result.verdicts:
        if not v.passed:
            click.echo(f"FAIL {v.gate.text}: {v.reason}", err=True)
        elif "passes (the change is within noise" in v.reason:
            click.echo(f"WITHIN NOISE {v.gate.text}: {v.reason}", err=True)
    if result.failed:
        sys.exit(3)


@main.command(short_help="What changed between two runs, kernel by kernel and op by op.")
@click.argument("before", type=click.Path(path_type=Path))
@click.argument("after", type=click.Path(path_type=Path))
@click.option("--top", type=click.IntRange(1), default=20, show_default=True, help="Rows per level (kernel, op).")
@click.option("-f", "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="table: for people (fits the terminal, one unit per column); the others keep raw values.")
@click.option("-c", "--columns", metavar="NAMES", help=COLUMNS_HELP)
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Write the result to this file.")
@_errors_as_messages
def diff(before, after, top, fmt, columns, output):
    """What changed from BEFORE to AFTER, kernel by kernel and op by op, largest change first (the diff query).

    Each is a run folder or raw traces. Counts and times are per rank, names normalized (kernel families), so
    runs with other rank counts or from other formats compare.

    Example:

    \b
        tracesql diff runs/before runs/after
    """
    from . import api, queries
    from . import engine as duckdb_engine

    check_output(output)
    runs, params = api.diff_runs(before, after)
    q = queries.find("diff")

    def run_diff(con):
        rel = queries.run(con, q, {**params, "top": top})
        if fmt == "table" and not columns:
            text = _diff_table(_show().Result.of(rel), [params["before"], params["after"]])
            return lambda echo: output.write_text(text) if output is not None else echo(text)
        if fmt == "table":  # the runs once on top instead of in every row
            rel = rel.project("* EXCLUDE (before_run, after_run)")
        return _prepare(rel, fmt, output, _show().parse_columns(columns))[1]

    deliver = duckdb_engine.on_fresh_connection(runs, run_diff, names=queries.names_used(q))
    if fmt == "table" and columns:
        click.echo(f"{params['before']} -> {params['after']}: per rank, largest change first")
    deliver(_echo)


#: The diff as a person reads it: per level, the change first (time, %, part of the level's total change), then the
#: times and calls it comes from, the name last (cut to fit the terminal, never pushing the numbers out).
DIFF_COLUMNS = ("delta", "delta_pct", "share_pct", "before", "after", "calls", "name")


def _diff_table(result, ids: list[str]) -> str:
    """The diff query's rows as one compact table per level (kernels, ops) that fits the terminal: a row per
    name, not a block per row. Times of a level are in one unit (before, after and delta compare at a glance),
    changes signed."""
    import textwrap

    out = _show()
    width = out.terminal_width()
    at = {c: i for i, c in enumerate(result.columns)}
    basis = result.rows[0][at["time_basis"]] if result.rows else "device"
    op_time = "device time of the kernels each op launched itself" if basis == "device" else "host self time"
    lines = textwrap.wrap(f"{ids[0]} -> {ids[1]}: time per rank, largest change first. share_pct: a row's part of "
                          "its level's total change (negative: it went against the total)", max(width, 40))
    for level, what in (("kernel", "kernels: device time"), ("op", f"ops: {op_time}")):
        rows = [r for r in result.rows if r[at["level"]] == level]
        if not rows:
            continue
        total = rows[0][at["level_delta_ns"]]
        lines.append(f"\n{what}, total change {_signed(out.duration(total), total)} per rank")
        times = ("delta_ns", "before_ns", "after_ns")
        unit = out.column_unit("delta_ns", [r[at[c]] for r in rows for c in times])
        cells = [(_signed(unit.text(r[at["delta_ns"]]), r[at["delta_ns"]]),
                  _percent(r[at["delta_pct"]], 0), _percent(r[at["share_of_change"]], 1, scale=100),
                  unit.text(r[at["before_ns"]]), unit.text(r[at["after_ns"]]),
                  _calls(r[at["before_count"]], r[at["after_count"]]), r[at["name"]]) for r in rows]
        headers = [f"{c}_{unit.label}" if c in ("delta", "before", "after") else c for c in DIFF_COLUMNS]
        types = ["DOUBLE"] * 5 + ["VARCHAR"] * 2  # the numbers as text in their unit, right-aligned
        lines.append(out.table(out.Result(headers, types, cells), width).rstrip("\n"))
    return "\n".join(lines) + "\n"


def _signed(text: str, value: float) -> str:
    return "+" + text if value > 0 else text


def _percent(value: float | None, decimals: int, scale: float = 1) -> str:
    if value is None:
        return "NULL"
    value *= scale
    return _signed(f"{value:.{decimals}f}", round(value, decimals))


def _calls(before: float, after: float) -> str:
    """Calls per rank: '33', or '426→432' when they changed."""
    text = _show().plain
    return text(before) if before == after else f"{text(before)}→{text(after)}"


@main.command(short_help="A step of one rank (or of every rank) as a Perfetto trace.")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", required=True, type=click.Path(path_type=Path),
              help="Perfetto trace file to write (.pftrace).")
@click.option("--rank", type=int, help="The rank to export (needed when the run has several).")
@click.option("--step", type=int, help="Only this step's window (default: the rank's whole trace).")
@click.option("--run-id", help="The run, when RUN is a folder of several runs.")
@click.option("--class-scheme", type=click.Choice(["default", "hta"]), default="default", show_default=True,
              help="Kernel class rules for the tracesql lanes (kernel_classes).")
@click.option("--all-ranks", is_flag=True,
              help="Every rank in one trace: a process per rank on aligned clocks (clock_offsets), flows between "
                   "the ranks' parts of each collective and send/recv pair.")
@click.option("--host-depth", type=click.IntRange(0), metavar="N",
              help="With --all-ranks: leave out host slices nested deeper than N (communication calls stay; "
                   "default: all up to 16 ranks, 2 beyond).")
@click.option("--align-clocks/--recorded-clocks", default=True, show_default=True,
              help="With --all-ranks: move each rank onto the lowest rank's clock (clock_offsets), or keep the "
                   "clocks as recorded.")
@_errors_as_messages
def export(run, out, rank, step, run_id, class_scheme, all_ranks, host_depth, align_clocks):
    """Write one rank's step (or whole trace) of RUN as a Perfetto trace, to open in https://ui.perfetto.dev.

    Host threads and device streams as tracks, flows from launches to kernels, and tracesql's view as extra
    tracks per device: compute, communication, memory, exposed communication and idle (as `temporal_breakdown`
    counts them), the run's warnings as instants. With --all-ranks, every rank's in one trace.

    Example:

    \b
        tracesql export runs/1234 --rank 3 --step 120 -o step120.pftrace
        tracesql export runs/1234 --all-ranks --step 120 -o step120-all.pftrace
    """
    from .export import export as write_trace, export_all_ranks, summary, summary_all

    check_output(out, makes_folders=True)
    if all_ranks:
        if rank is not None:
            raise click.UsageError("--rank and --all-ranks exclude each other")
        click.echo(summary_all(export_all_ranks(run, out, step=step, run_id=run_id, class_scheme=class_scheme,
                                                host_depth=host_depth, align_clocks=align_clocks)))
        return
    if host_depth is not None:
        raise click.UsageError("--host-depth goes with --all-ranks")
    if not align_clocks:
        raise click.UsageError("--recorded-clocks goes with --all-ranks")
    click.echo(summary(write_trace(run, out, rank=rank, step=step, run_id=run_id, class_scheme=class_scheme)))


@main.command(short_help="An MCP server over runs, for agents: read-only SQL, the queries.")
@click.argument("targets", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--http", "port", type=click.IntRange(1, 65535), metavar="PORT",
              help="Serve streamable HTTP on 127.0.0.1:PORT (path /mcp) instead of stdin/stdout.")
@click.option("--time-limit", type=click.FloatRange(min=0.1), default=30.0, show_default=True, metavar="SECONDS",
              help="Each SQL call (run_query, run_sql, diff) is stopped after this long.")
@click.option("--row-limit", type=click.IntRange(1), default=200, show_default=True, metavar="N",
              help="Rows a result returns at most (all are counted).")
@click.option("--memory-limit", metavar="SIZE",
              help="DuckDB working memory of each SQL call; beyond it the call fails, nothing spills to disk "
                   "(default: 2GB).")
@click.option("--export-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Folder for export_step's Perfetto traces (default: a new temporary folder).")
@_errors_as_messages
def mcp(targets, port, time_limit, row_limit, memory_limit, export_dir):
    """A Model Context Protocol server over runs, for assistants and agents (needs the [mcp] extra).

    TARGETS are run folders, folders of runs, or raw traces (ingested into the cache on first use). Tools:
    list_runs, describe_run, schema, list_queries, run_query, run_sql, diff, export_step; every SQL call runs in
    the sandbox (`shell --sandbox`) under the time, row and memory limits, stated in each result.

    Example (an agent client's command line):

        tracesql mcp runs/1234 runs/1235
    """
    from .limits import SANDBOX_MEMORY, Limits
    from .mcp_server import CallLimits, serve

    memory = Limits.make(memory=memory_limit or SANDBOX_MEMORY).memory  # refuses what is not a size, in one line
    serve([str(t) for t in targets], CallLimits(time_limit, row_limit, memory), http_port=port, export_dir=export_dir)
