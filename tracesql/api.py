"""The Python API, as `tracesql.X`: ingest traces into a run, connect to a run, run a query on it.

Each function is the one the `tracesql` command calls; it picks the engine (DuckDB, or Spark when asked) so that
the layers below never import the ones above them (see docs/concepts/architecture.md).
"""

from __future__ import annotations

from functools import partial

from . import engine as duckdb_engine
from . import ingestion, queries, store
from .engine import connect
from .errors import TraceError

__all__ = ["connect", "ingest", "query", "TraceError"]


def ingest(sources, out, *, rank: int | None = None, run_id: str | None = None, jobs: int | None = None,
           strict: bool = False, progress: bool = False, memory_limit: str | None = None,
           max_events: int | None = None, step_pattern: str | None = None, spark=None, label=(),
           label_pattern: str | None = None, capture_traces=None) -> ingestion.IngestResult:
    """Ingest trace files or folders into the run folder `out`. Unchanged files already in `out` are not re-read.
    `memory_limit` caps DuckDB's working memory per file (it spills to disk beyond it); `max_events` reads only
    the first N events of each file (see `tracesql.limits`). With `spark` (a SparkSession, see
    tracesql.spark.session) the files are read by Spark tasks instead of local processes; the run is published
    the same way. `step_pattern`: a regular expression naming the ranges that are steps (named groups step, phase,
    batch, tokens, prefill_tokens; see tracesql.step_rules), tried before the built-in rules; files are read again
    when it changes. `label` (KEY=VALUE texts), `label_pattern` and label files beside the traces: the run's
    labels (see tracesql.labels). `capture_traces`: the folder of the CUDA/HIP-graph capture traces that attribute
    graph-replayed kernels to ops, when it is not a `capture_traces` folder beside the traces (see ingestion).

    >>> tracesql.ingest(["traces/run-1234/"], "runs/1234")          # doctest: +SKIP
    """
    read_files = None
    if spark is not None:
        from . import spark as spark_engine

        read_files = partial(spark_engine.read_files, spark)
    return ingestion.ingest(sources, out, rank=rank, run_id=run_id, jobs=jobs, strict=strict, progress=progress,
                            memory_limit=memory_limit, max_events=max_events, step_pattern=step_pattern,
                            read_files=read_files, label=label, label_pattern=label_pattern,
                            capture_traces=capture_traces)


def query(name_or_path, target, *, engine: str = "duckdb", sandbox: bool = False, **params):
    """Run a curated query (or a SQL file) on a run, fleet or raw traces and return a DataFrame.
    engine="spark" runs it on Spark (tracesql.spark.query: the same table). sandbox=True: for a SQL file a program
    feeds in, run in a session that reads the run's tables and nothing else (see `tracesql.connect`).

    >>> tracesql.query("overlap", "runs/1234", class_scheme="hta")   # doctest: +SKIP
    """
    if engine == "spark":
        if sandbox:
            raise TraceError("sandbox", "the sandbox is DuckDB's (engine='duckdb')")
        from .spark import query as spark_query

        return spark_query(name_or_path, target, **params)
    if engine != "duckdb":
        raise TraceError(engine, "unknown engine (duckdb or spark)")
    query = queries.find(name_or_path)
    queries.check(query, params)  # before the target is opened (raw traces would be ingested first)
    # with only the views and functions the query uses, as `tracesql query` opens it: all of them take longer
    # to set up (and to check the files of) than most queries take to run
    return duckdb_engine.on_fresh_connection(target, lambda con: queries.run(con, query, params).df(),
                                             names=queries.names_used(query), sandbox=sandbox)


def diff_runs(before, after) -> tuple[list, dict]:
    """The two run folders `tracesql diff BEFORE AFTER` compares, and the diff query's `before`/`after` parameters
    (their run ids); one line when a target holds other than one run, or both runs have one name."""
    runs = [duckdb_engine.resolve(t) for t in (before, after)]
    for target, found in zip((before, after), runs):
        if len(found) != 1:
            raise TraceError(target, f"diff compares two runs; this holds {len(found)}")
    ids = [store.load_manifest(r[0])["run_id"] for r in runs]
    if ids[0] == ids[1] and runs[0][0].absolute() != runs[1][0].absolute():
        raise TraceError(after, f"both runs are named {ids[0]!r}; ingest one with another --run-id")
    return [runs[0][0], runs[1][0]], {"before": ids[0], "after": ids[1]}
