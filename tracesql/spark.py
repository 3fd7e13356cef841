"""tracesql on Apache Spark: the same run folders, tables and queries, on a cluster.

- `session()` opens (or reuses) a SparkSession: the active one, the one spark-submit configured, a master URL,
  or `local[2]`;
- `connect()` registers the tables of a run or fleet (local paths or URIs such as s3a://bucket/runs) as temporary
  views over the very Parquet files DuckDB reads, and the CSV tables of functions/ (kernel_classes, device_peaks);
- `sql()` / `run()` / `query()` transpile DuckDB SQL (curated queries or the user's) with tracesql.transpile —
  the macros expanded into the query — and run it; the result is the same table as on DuckDB;
- `read_files()` spreads the trace files of an ingest over the executors: each task runs ingestion's per-file
  reader and writes that file's parts into the staging run; the driver publishes the run as the DuckDB path does.
"""

from __future__ import annotations

import json
import os
import re
import sys
import warnings
from pathlib import Path
from urllib.parse import unquote, urlparse

from .errors import TraceError, install_extra

try:
    import pyspark  # noqa: F401
    import sqlglot  # noqa: F401
except ImportError as missing:
    raise TraceError("--engine spark",
                     f"needs {missing.name}: {install_extra('spark')} (and Java 17 or 21)") from None

from . import db, engine, functions, queries, schema, store, transpile  # noqa: E402

DEFAULT_MASTER = "local[2]"


def session(master: str | None = None):
    """The SparkSession tracesql uses: `master` if given; else the active session, or the master spark-submit
    (or spark-defaults.conf) configured; else `local[2]`."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # a laptop's hostname often resolves to nothing useful
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers run this interpreter, which has tracesql
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    builder = SparkSession.builder.appName("tracesql")
    chosen = master or (None if SparkConf().contains("spark.master") else DEFAULT_MASTER)
    if chosen:
        builder = builder.master(chosen)
    if (chosen or "").startswith("local"):
        # one machine: a shuffle partition per core (the default 200 are 200 tiny tasks), no web UI to bind
        cores = chosen.partition("[")[2].rstrip("]").split(",")[0]
        partitions = os.cpu_count() if cores in ("", "*") else int(cores)
        builder = (builder.config("spark.sql.shuffle.partitions", str(partitions)).config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("FATAL")  # errors reach the caller as exceptions, not as log lines
    return spark


def _spark_type(duckdb_type: str) -> str:
    from sqlglot import exp

    if duckdb_type == "JSON":
        return "STRING"  # JSON text, as DuckDB writes it into Parquet
    return exp.DataType.build(duckdb_type, dialect=transpile.READ).sql(transpile.WRITE)


def table_ddl(columns: dict[str, str]) -> str:
    """A Spark schema string (`a BIGINT, b ARRAY<STRING>`) for columns with DuckDB types."""
    return ", ".join(f"`{name}` {_spark_type(t)}" for name, t in columns.items())


def _is_uri(target) -> bool:
    return "://" in str(target)


_HADOOP_GLOB = re.compile(r"([\\*?\[\]{}])")


def exact_path(path: str) -> str:
    """`path` as Spark reads exactly that file: Spark expands Hadoop glob patterns (`*`, `?`, `[...]`, `{a,b}`)
    in the paths it is given, so each such character (and the escape, `\\`) is escaped with a backslash. (Spark's
    internal switch that turns globbing off reads each file twice when two files of one folder are named, in
    Spark 4.1.4.)"""
    return _HADOOP_GLOB.sub(r"\\\1", path)


def _hadoop_files(spark, target: str) -> dict[str, int]:
    """Every file under the folder `target` (a URI), relative to it, with its size: one recursive listing by
    Spark's file system (on object storage a LIST request per thousand files), never a glob. Hidden folders (an
    ingest's staging) are left out, as the DuckDB engine leaves them out."""
    jvm = spark._jvm
    folder = jvm.org.apache.hadoop.fs.Path(target)
    fs = folder.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(folder):
        return {}
    base = fs.makeQualified(folder).toUri().getPath().rstrip("/") + "/"
    found, files = {}, fs.listFiles(folder, True)
    while files.hasNext():
        status = files.next()
        rel = status.getPath().toUri().getPath()[len(base):]
        if not any(part.startswith(".") for part in rel.split("/")):
            found[rel] = status.getLen()
    return found


def find_runs(spark, target) -> dict[str, list[str]]:
    """The runs at `target` (a run, or a folder of runs; a URI on any file system Spark reads: s3a://, hdfs://,
    file://), each checked for its schema version and for holding exactly the Parquet files its manifest lists
    (the check `tracesql.connect` makes, with its messages): run -> its files, `table/file.parquet`."""
    target = str(target).rstrip("/")
    listing = _hadoop_files(spark, target)
    if store.MANIFEST in listing:
        found = {"": listing}
    else:
        found = {}
        for rel, size in listing.items():
            run, _, inside = rel.partition("/")
            found.setdefault(run, {})[inside] = size
        found = {run: files for run, files in found.items() if store.MANIFEST in files}
    if not found:
        raise TraceError(target, f"no tracesql run here ({store.MANIFEST} in it or in its subfolders)")
    runs = {run: f"{target}/{run}" if run else target for run in sorted(found)}
    manifests = {}
    for row in (spark.read.text([exact_path(f"{r}/{store.MANIFEST}") for r in runs.values()], wholetext=True)
                .selectExpr("_metadata.file_path AS path", "value").collect()):
        manifests[unquote(urlparse(row.path).path).rsplit("/", 2)[-2]] = row.value  # the run's folder name
    out = {}
    for run, uri in runs.items():
        name = uri.rsplit("/", 1)[-1]
        if name not in manifests:  # removed since the listing
            raise TraceError(f"{uri}/{store.MANIFEST}", "missing: the run's manifest vanished while it was read")
        manifest = store.check_manifest(_parse_manifest(uri, manifests[name]), uri)
        tables = {rel: size for rel, size in found[run].items()
                  if rel.split("/")[0] in schema.TABLES and rel.count("/") == 1 and rel.endswith(".parquet")}
        out[uri] = store.files_of(uri, manifest, tables)
    return out


def _parse_manifest(run: str, text: str) -> dict:
    try:
        manifest = json.loads(text)
        if not isinstance(manifest, dict):
            raise ValueError("the manifest is not a JSON object")
    except ValueError as e:
        raise TraceError(run, f"not a readable tracesql run ({e})") from None
    return manifest


def run_files(spark, target) -> dict[str, list[str]]:
    """The runs of `target` and the Parquet files of each (`table/file.parquet`), as their manifests list them
    and after checking that the folders hold exactly those files: URIs through Spark's file system; local runs,
    fleets and raw traces (ingested into the cache) as `tracesql.connect` opens them, with its one-line errors.
    A run is a URI, or a local path as a `file://` URI."""
    if isinstance(target, (list, tuple)):  # several targets read as one fleet (as `tracesql diff` does)
        return {run: files for t in target for run, files in run_files(spark, t).items()}
    if _is_uri(target):
        return find_runs(spark, target)
    out = {}
    for run in engine.resolve(target):
        run = run.absolute()
        out[f"file://{run}"] = store.files_of(run, store.load_manifest(run))
    return out


def register_tables(spark, runs: dict[str, list[str]]) -> None:
    """Each table of `runs` (run -> its files, as `run_files` gives them) as a temporary view over exactly those
    Parquet files, typed by the schema (so that every run and every part reads alike, and a column that an older
    run lacks reads as NULL), plus kernel_classes and device_peaks from functions/."""
    for name, table in schema.TABLES.items():
        ddl = table_ddl({c.name: c.type for c in table.columns})
        paths = [exact_path(f"{run}/{rel}") for run, files in runs.items() for rel in files
                 if rel.split("/")[0] == name]
        df = spark.read.schema(ddl).parquet(*paths) if paths else spark.createDataFrame([], ddl)
        df.createOrReplaceTempView(name)
    con = db.connect()
    for name, columns in transpile.data_tables().items():
        con.execute(functions.csv_table_sql(functions.HERE / f"{name}.csv")).fetchall()
        rows = con.sql(f"SELECT * FROM {name}").fetchall()
        spark.createDataFrame(rows, schema=table_ddl(columns)).createOrReplaceTempView(name)


_macro_connection = None


def evaluate_macro(name: str, *columns):
    """A tracesql macro evaluated by DuckDB over Arrow columns (the body of the Arrow UDFs of DUCKDB_UDFS, run
    on Spark's workers): the very definition the DuckDB path uses, so the values are the same."""
    import pyarrow as pa

    global _macro_connection
    if _macro_connection is None:
        con = db.connect(threads=1)
        for table, spec in schema.TABLES.items():  # table macros bind their tables when created: empty ones do
            con.execute(f"CREATE TABLE {table} ({', '.join(f'{c.name} {c.type}' for c in spec.columns)})").fetchall()
        functions.install(con)
        _macro_connection = con
    con = _macro_connection
    args = pa.table({f"a{i}": c for i, c in enumerate(columns)})
    con.register("tracesql_udf_args", args)
    try:
        out = con.sql(f"SELECT {name}({', '.join(args.column_names)}) FROM tracesql_udf_args").to_arrow_table()
    finally:
        con.unregister("tracesql_udf_args")
    return out.column(0).combine_chunks()


def register_functions(spark) -> None:
    """The macros of DUCKDB_UDFS as Spark functions (the others are expanded into the SQL by the transpiler)."""
    from functools import partial

    from pyspark.sql.functions import ArrowUDFType, arrow_udf

    for name, return_type in transpile.DUCKDB_UDFS.items():
        with warnings.catch_warnings():  # "prefer type hints": a partial has none to give
            warnings.simplefilter("ignore", UserWarning)
            udf = arrow_udf(partial(evaluate_macro, name), return_type, ArrowUDFType.SCALAR)
        spark.udf.register(transpile.udf_name(name), udf)


def connect(target, *, spark=None, master: str | None = None):
    """A SparkSession where the tables of the run, fleet or raw traces at `target` are temporary views.
    tracesql's functions are expanded into the SQL that `sql()` runs.

    >>> spark = tracesql.spark.connect("s3a://bucket/runs/")                           # doctest: +SKIP
    >>> tracesql.spark.sql(spark, "SELECT kernel_family(name), count(*) FROM slices GROUP BY 1").show()
    ... # doctest: +SKIP
    """
    spark = spark or session(master)
    # DuckDB semantics: a failed cast or a division by zero is NULL, not an error
    spark.conf.set("spark.sql.ansi.enabled", "false")
    register_tables(spark, run_files(spark, target))
    register_functions(spark)
    return spark


def sql(spark, text: str, variables: dict[str, str] | None = None):
    """Run DuckDB SQL (tracesql functions allowed) on Spark; returns the Spark DataFrame of the last statement.
    `variables` are SQL literals for getvariable('name')."""
    statements = transpile.to_spark(text, variables)
    for statement in statements[:-1]:
        spark.sql(statement).collect()
    return spark.sql(statements[-1])


def run(spark, query: queries.Query, params: dict | None = None):
    """A curated query (or the user's SQL file) on Spark, with `params`; a Spark DataFrame."""
    try:
        return sql(spark, query.sql, queries.variables(query, params))
    except transpile.Untranspilable as e:
        raise TraceError(query.label, f"cannot run on Spark: {e}") from None


def to_arrow(df):
    """A Spark result as an Arrow table (the same value the DuckDB path returns, for printing and saving)."""
    return df.toArrow()


def query(name_or_path, target, *, spark=None, master: str | None = None, **params):
    """Run a curated query (or a SQL file) on Spark and return a pandas DataFrame, like tracesql.query().

    >>> tracesql.spark.query("overlap", "s3a://bucket/runs/", class_scheme="hta")   # doctest: +SKIP
    """
    query = queries.find(name_or_path)
    queries.check(query, params)  # before Spark starts
    spark = connect(target, spark=spark, master=master)
    return to_arrow(run(spark, query, params)).to_pandas()


def _read_task(item):
    """One trace file on an executor: ingestion's per-file reader, the parts written into the shared staging run.
    Bad input comes back as (path, problem), to be raised on the driver with its one-line message."""
    from .ingestion import read_file

    rel, path, staging, ranks, run_id, threads, shown, lim, step_pattern, captures = item
    try:
        return rel, read_file(path, rel, staging, ranks, run_id, threads, shown, lim, step_pattern,
                              captures=captures), None
    except TraceError as e:
        return rel, None, (e.path, e.problem)


def read_files(spark, todo: dict, staging: Path, ranks: tuple, run_id: str, lim, step_pattern: str | None = None):
    """Yield (rel, summary) for the files of `todo` (rel -> (path, fingerprint, name shown in errors)), read by
    Spark tasks, one file per task, under the ingest's limits `lim`. Executors must see `staging` and the files at
    the same paths (one machine, or a shared file system)."""
    threads = int(spark.conf.get("spark.task.cpus", "1"))
    from .ingestion import capture_paths

    items = [(rel, str(f), str(staging), ranks, run_id, threads, shown, lim, step_pattern, capture_paths(fp))
             for rel, (f, fp, shown) in todo.items()]
    results = spark.sparkContext.parallelize(items, len(items)).map(_read_task).collect()
    for rel, summary, error in results:
        if error:
            raise TraceError(*error)
        yield rel, summary
