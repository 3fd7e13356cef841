"""tracesql on Apache Spark: every curated query gives on Spark (local[2]) what it gives on DuckDB, over the same
ingested runs; ingest on Spark writes the same run; the transpiler's DuckDB semantics hold value by value.

One SparkSession for the whole module (a JVM start costs seconds on two cores). Skipped only without Java."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracesql
from tracesql import db, engine, functions, queries, store, transpile
from tracesql.cli import main
from tracesql.errors import TraceError

from conftest import CORPUS, DATASETS

# slow (a JVM, every query twice); one worker holds the module's SparkSession
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]

if shutil.which("java") is None:
    pytest.skip("Spark needs Java (17 or 21): none on PATH", allow_module_level=True)

pytest.importorskip("pyspark", reason="needs pyspark: pip install '.[spark]' (the test extra has it)")
pytest.importorskip("sqlglot", reason="needs sqlglot: pip install '.[spark]' (the test extra has it)")
from tracesql import spark as tsp  # noqa: E402

BUNDLED = ["hta_trace_filter", "torch_gloo_4rank_straggler", "jax_cpu_mlp", "tracelens_b200_eager",
           "tracelens_mi210_gpu_only", "hta_cupti_profiler", "torch_pipeline_1f1b_2stage"]
# diverse formats and features: send/recv pairs of a pipeline, collectives metadata, GEMM/attention shapes, XPlane, Nsight, MTIA, rocprof
CORPUS_RUNS = {
    "nccl_parser_config": "hta/tests/data/nccl_parser_config/nccl_data.json.gz",
    "qwen_h100": "tracelens/tests/traces/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "jax_conv_mi300": "tracelens/tests/traces/mi300/jax_conv_minimal_08/tw003.xplane.pb",
    "cloverleaf_nsys": "pipit/pipit/tests/data/cloverleaf-nsys/perlmutter-cloverleaf-cuda.sqlite",
    "mtia_inference": "hta/tests/data/mtia_inference_trace/mtia_inference_rank_0.json.gz",
    "rocprof_mi350": "tracelens/tests/rocprof/908_results.json.gz",
}
# the queries that walk a graph with tracesql's Python function run on DuckDB only
DUCKDB_ONLY = [q.name for q in queries.catalogue()  # calling a Python function, or a macro that does
               if set(transpile.DUCKDB_ONLY) & (functions.words(q.sql) | functions.words(
                   "\n".join(functions.needed(functions.words(q.sql))[0])))]
CATALOGUE = [q.name for q in queries.catalogue() if q.name not in DUCKDB_ONLY]
# the code paths that parameters switch on (and that the defaults leave out), each once
VARIANTS = [
    ("overlap", {"per": "process_group"}),
    ("temporal_breakdown", {"per": "step", "class_scheme": "hta", "analysis_window": "hta", "time_unit_ns": 1000}),
    ("bubbles", {"scope": "device"}),
    ("bubbles_largest", {"class_scheme": "hta", "analysis_window": "hta", "time_unit_ns": 1000}),
    ("hotspots", {"levels": "kernel_family,op_args", "top": 5}),
    ("memory_ops", {"op_level": "top"}),
    ("memory_curve", {"points": 7}),
    ("annotations", {"projection": "thread"}),
    ("modules", {"per": "instance", "top": 20}),
]


@pytest.fixture(scope="module")
def spark():
    session = tsp.session()
    yield session
    session.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Path:
    """The bundled datasets, plus the corpus runs when the corpus is there: one fleet, read as one dataset."""
    root = tmp_path_factory.mktemp("fleet")
    sources = {name: DATASETS / name for name in BUNDLED}
    sources.update({name: CORPUS / path for name, path in CORPUS_RUNS.items() if (CORPUS / path).exists()})
    for name, source in sources.items():
        tracesql.ingest([source], root / name)
    return root


@pytest.fixture(scope="module")
def duck(fleet):
    """One DuckDB session over the fleet for the module (each connection checks every file it reads again):
    `queries.run` sets every parameter of the query it runs, so none carries over to the next."""
    return engine.connect(fleet)


def _value(v):
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, dict):
        return tuple(sorted((k, _value(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_value(x) for x in v)
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _same(a, b) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _sort_key(row: tuple):
    """Rows in an order both engines agree on, floats compared to 9 significant digits."""
    return tuple((v is None, f"{v:.9g}" if isinstance(v, float) else repr(v)) for v in row)


def assert_same_table(duck, spark_table, what: str):
    """Same column names, same rows, floats within a relative 1e-9: in the same order, or — where the query's
    ORDER BY leaves ties (e.g. launch's two NULL-step rows of a rank, the total and the steps-less group) — as
    the same multiset of rows."""
    assert duck.column_names == spark_table.column_names, what
    d = [tuple(_value(v) for v in row.values()) for row in duck.to_pylist()]
    s = [tuple(_value(v) for v in row.values()) for row in spark_table.to_pylist()]
    assert len(d) == len(s), f"{what}: {len(d)} rows on DuckDB, {len(s)} on Spark"
    if all(_same(x, y) for x, y in zip(d, s)):
        return
    for i, (x, y) in enumerate(zip(sorted(d, key=_sort_key), sorted(s, key=_sort_key))):
        assert _same(x, y), f"{what}, row {i} (rows sorted):\n  DuckDB {x}\n  Spark  {y}"


_views_of = {}  # the fleet whose tables the session's views show (registering them again costs seconds)


def _on(spark, fleet: Path):
    if _views_of.get(spark) != fleet:
        tsp.connect(fleet, spark=spark)
        _views_of[spark] = fleet
    return spark


def _parity(spark, duck, fleet: Path, name: str, params: dict) -> int:
    q = queries.find(name)
    want = queries.run(duck, q, params).to_arrow_table()
    session = _on(spark, fleet)
    assert_same_table(want, tsp.to_arrow(tsp.run(session, q, params)), f"{name} {params}")
    return want.num_rows


@pytest.mark.parametrize("name", CATALOGUE)
def test_every_query_same_on_spark(spark, duck, fleet, name):
    assert _parity(spark, duck, fleet, name, {}) > 0


@pytest.mark.parametrize("name,params", [pytest.param(n, p, id=f"{n}-{'-'.join(p)}") for n, p in VARIANTS])
def test_parameter_variants_same_on_spark(spark, duck, fleet, name, params):
    assert _parity(spark, duck, fleet, name, params) > 0


@pytest.mark.corpus
def test_parity_covers_the_corpus_runs(fleet):
    missing = [p for p in CORPUS_RUNS.values() if not (CORPUS / p).exists()]
    if missing:
        pytest.skip(f"corpus not available: {CORPUS / missing[0]}")
    runs = sorted(p.name for p in fleet.iterdir() if not p.name.startswith("."))  # not the ingest locks
    assert runs == sorted(BUNDLED + list(CORPUS_RUNS))


def test_aggregates_over_op_costs_same_on_spark(spark, duck, fleet):
    """Spark aggregates op_costs() like DuckDB: it reads the costs the ingest stored (when the formulas ran in a
    DuckDB UDF inside the query, count(*) with sum(flops) failed: INTERNAL_ERROR "Cannot evaluate expression:
    tracesql_duckdb_op_flops"), in both attention conventions."""
    text = " UNION ALL ".join(
        f"SELECT '{convention}' AS convention, family, count(*) AS ops, sum(flops) AS flops, sum(bytes) AS bytes, "
        f"count(*) FILTER (WHERE counted) AS counted FROM op_costs(attention_convention := '{convention}') "
        "GROUP BY family" for convention in ("flash", "torch")) + " ORDER BY convention, family"
    want = duck.sql(text).to_arrow_table()
    assert_same_table(want, tsp.to_arrow(tsp.sql(_on(spark, fleet), text)), "op_costs() aggregated")
    totals = {(r["convention"], r["family"]): r["flops"] for r in want.to_pylist()}
    # causal attention halved in the flash convention: the fleet has such ops only with the corpus beside it
    causal = duck.sql("SELECT count(*) FROM op_costs WHERE torch_flops <> flops").fetchall()
    causal = causal[0][0]
    assert totals["torch", "attention"] >= totals["flash", "attention"] > 0
    assert (totals["torch", "attention"] > totals["flash", "attention"]) == (causal > 0)
    assert totals["torch", "gemm"] == totals["flash", "gemm"] > 0 and totals["flash", None] is None


def test_transpiler_knows_every_macro():
    # the macro files' comments must not hide a macro from the Spark rewrite (duckdb 2.0.1 keeps them)
    defined = {m.lower() for _, text in functions.sql_files()
               for m in re.findall(r"CREATE OR REPLACE MACRO (\w+)", text, re.I)}
    assert len(defined) > 40 and set(transpile.macros()) == defined


def test_no_curated_query_is_untranspilable():
    for q in queries.catalogue():
        if q.name in DUCKDB_ONLY:
            with pytest.raises(transpile.Untranspilable, match=r"critical_path_walk\(\) is a Python function"):
                transpile.to_spark(q.sql, queries.variables(q))
        else:
            assert transpile.to_spark(q.sql, queries.variables(q)), q.name
    assert DUCKDB_ONLY == ["bound", "critical_path", "what_if"]


# DuckDB expressions whose Spark rewrite is easy to get wrong, each checked value by value against DuckDB
SEMANTICS = [
    "[10, 20, 30][1]", "[10, 20, 30][-1]", "[10, 20, 30][4]", "[10, 20, 30][0]",
    "[10, 20, 30][2:]", "[10, 20, 30][1:2]", "[10, 20, 30][1:-1]", "[10, 20, 30][3:1]", "[[1, 2], [3]][1][-1]",
    "len([1, 2, NULL])", "len(CAST(NULL AS INTEGER[]))",
    "list_product([2, 3, NULL])", "list_product(CAST([] AS BIGINT[]))", "list_sum([1.5, NULL, 2])",
    "range(3)", "range(2, 2)", "range(1, 4)", "list_reverse([1, 2, 3])",
    "list_transform([5, 6, 7], lambda x, i: x * i)", "list_filter(['a', 'b', 'c'], lambda s, i: i <> 2)",
    "regexp_replace('ab_12_34', '_\\d+$', '')", "regexp_replace('a<b<c>>', '<[^<>]*>', '', 'g')",
    "regexp_replace('f(x)', '^(\\w+)\\(.*$', '\\1!')", "regexp_matches('NCCL kernel', '(?i)nccl')",
    "TRY_CAST('[2, 3]' AS BIGINT[])", "TRY_CAST('[]' AS BIGINT[])", "TRY_CAST('7' AS BIGINT[])",
    "TRY_CAST('[True, false]' AS BOOLEAN[])",
    "CAST(['', 'a b', 'a,b', 'it''s', NULL] AS VARCHAR)", "CAST([[1, NULL], NULL, []] AS VARCHAR)",
    "floor(log10(1000))", "7 // 2", "1 / 0", "0.1 + 0.2", "{'a': 1, 'b': 2.5}.b",
    "arg_max(x, (x % 2, x)) FROM range(5) t(x)", "list(x ORDER BY -x) FROM range(3) t(x)",
    "histogram(x % 2)[1] FROM range(5) t(x)", "quantile_cont(x, 0.3) FROM range(10) t(x)",
    "string_agg(s, '') FROM (SELECT trim(unnest(string_split(' a, b ', ','))) AS s)",
]


@pytest.mark.parametrize("expression", SEMANTICS)
def test_duckdb_semantics_on_spark(spark, expression):
    sql = f"SELECT {expression}"
    duck = db.connect().sql(sql).fetchall()[0][0]
    spark.conf.set("spark.sql.ansi.enabled", "false")
    got = tsp.sql(spark, sql).collect()[0][0]
    got = got.asDict() if hasattr(got, "asDict") else got
    assert _same(_value(duck), _value(got)), f"{expression}: DuckDB {duck!r}, Spark {got!r}"


def test_window_over_a_union_of_aliased_columns(spark):
    """The shape of range_launches (annotations, phases, modules) reduced: a running max_by over a UNION ALL whose
    sides and select lists carry `t.x AS x` aliases, as qualify() writes them. Spark 4.1's RemoveRedundantAliases
    made an invalid plan of it (PLAN_VALIDATION_FAILED_RULE_IN_BATCH); the transpiler leaves such aliases out."""
    sql = ("WITH p AS (SELECT l.a AS a, l.t AS t, 1 AS o, CAST(NULL AS BIGINT) AS r FROM x l UNION ALL "
           "SELECT h.a AS a, h.t AS t, 0 AS o, h.id AS r FROM x h), w AS (SELECT p.a AS a, p.t AS t, p.o AS o, "
           "p.r AS r, max_by(p.r, CASE WHEN p.o = 0 THEN p.t END) OVER (PARTITION BY p.a ORDER BY p.t, p.o ROWS UNBOUNDED PRECEDING) AS m "
           "FROM p) SELECT w.a AS a, w.t AS t, w.m AS m FROM w WHERE w.o = 1 ORDER BY t")
    rows = [(1, 10, 100), (1, 20, 200), (2, 5, 300)]
    con = db.connect()
    con.execute("CREATE TABLE x (a BIGINT, t BIGINT, id BIGINT)")
    con.executemany("INSERT INTO x VALUES (?, ?, ?)", rows)
    spark.createDataFrame(rows, "a BIGINT, t BIGINT, id BIGINT").createOrReplaceTempView("x")
    assert con.sql(sql).fetchall() == [(2, 5, 300), (1, 10, 100), (1, 20, 200)]
    assert [tuple(r) for r in tsp.sql(spark, sql).collect()] == con.sql(sql).fetchall()


def test_untranspilable_query_named_with_reason(spark, fleet, tmp_path):
    user = tmp_path / "first_match.sql"
    user.write_text("-- first_match: the first 'a' replaced\nSELECT regexp_replace(name, 'a', 'b') AS n FROM slices\n")
    session = _on(spark, fleet)
    with pytest.raises(TraceError, match=r"first_match.sql: cannot run on Spark: regexp_replace\(\) of the first"):
        tsp.run(session, queries.find(user))
    result = CliRunner().invoke(main, ["query", str(user), str(fleet), "--engine", "spark"])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {user}: cannot run on Spark: regexp_replace()")


def test_cli_prints_the_same_table(spark, fleet):
    run = str(fleet / "torch_gloo_4rank_straggler")
    out = {}
    _views_of.clear()
    for eng in ("duckdb", "spark"):
        result = CliRunner().invoke(main, ["query", "collective_stragglers", run, "-f", "markdown", "--engine", eng])
        assert result.exit_code == 0, result.output
        out[eng] = result.output
    assert out["spark"] == out["duckdb"]
    assert "| torch_gloo_4rank_straggler | 2 | 1 | 27 | 23 |" in out["spark"]  # rank 2, the known straggler


def test_python_api(spark, fleet):
    _views_of.clear()
    df = tracesql.query("steps", fleet / "hta_trace_filter", engine="spark")
    duck = tracesql.query("steps", fleet / "hta_trace_filter")
    assert list(df.columns) == list(duck.columns) and len(df) == len(duck) == 4
    assert df["device_ns"].tolist() == duck["device_ns"].tolist()


def test_uri_fleet_and_schema_version(spark, fleet, tmp_path):
    """Runs named by URI (file:// here, s3a:// on a cluster) are found through Spark's file systems."""
    copy = tmp_path / "fleet"
    for name in ("hta_trace_filter", "torch_gloo_4rank_straggler"):
        shutil.copytree(fleet / name, copy / name)
    assert [r.rsplit("/", 1)[1] for r in tsp.find_runs(spark, copy.as_uri())] == ["hta_trace_filter",
                                                                                   "torch_gloo_4rank_straggler"]
    session = tsp.connect(copy.as_uri(), spark=spark)
    _views_of.clear()
    assert_same_table(queries.run(engine.connect(copy), queries.find("steps")).to_arrow_table(),
                      tsp.to_arrow(tsp.run(session, queries.find("steps"))), "steps over file://")
    manifest = copy / "hta_trace_filter" / store.MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "schema_version": 99}))
    with pytest.raises(TraceError, match="with schema version 99; .* install a tracesql that reads schema version 99"):
        tsp.connect(copy.as_uri(), spark=spark)
    with pytest.raises(TraceError, match="no tracesql run here"):
        tsp.connect((tmp_path / "nothing").as_uri(), spark=spark)


def _rows(run: Path, table: str):
    con = db.connect()
    return sorted(map(repr, con.sql(f"SELECT * EXCLUDE (args) FROM read_parquet('{run}/{table}/*.parquet')"
                                      if table == "slices" else
                                      f"SELECT * FROM read_parquet('{run}/{table}/*.parquet')").fetchall()))


def test_ingest_on_spark_writes_the_same_run(spark, tmp_path):
    source = DATASETS / "torch_gloo_4rank_straggler"
    local = tracesql.ingest([source], tmp_path / "local" / "straggler")
    distributed = tracesql.ingest([source], tmp_path / "spark" / "straggler", spark=spark)
    assert distributed.ingested == local.ingested and distributed.rows == local.rows
    for table in tracesql.schema.TABLES:
        assert _rows(distributed.run, table) == _rows(local.run, table), table
    a, b = (json.loads((r.run / store.MANIFEST).read_text()) for r in (local, distributed))

    def unnamed(name: str) -> str:  # every ingest names its parts anew (a generation's key): compare the rest
        return re.sub(r"-[0-9a-f]{6,}\.parquet$", "-*.parquet", name)

    def sources(manifest: dict) -> dict:
        return {k: (v["ranks"], [unnamed(p) for p in v["parts"]], v["size"]) for k, v in manifest["sources"].items()}

    assert sources(a) == sources(b)
    assert sorted(unnamed(p.name) for p in distributed.run.iterdir()) == \
        sorted(unnamed(p.name) for p in local.run.iterdir())


def test_ingest_on_spark_bad_file_is_one_line_and_keeps_the_run(spark, tmp_path):
    traces = tmp_path / "traces"
    shutil.copytree(DATASETS / "torch_gloo_2rank", traces)
    out = tmp_path / "run"
    tracesql.ingest([traces], out, spark=spark)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    bad = next(traces.rglob("*.json*"))
    bad.write_bytes(bad.read_bytes()[:200])
    result = CliRunner().invoke(main, ["ingest", str(traces), "-o", str(out), "--engine", "spark"])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {bad}: ") and result.output.count("\n") == 1
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.staging")]


def test_cli_ingest_engine_spark(spark, tmp_path):
    out = tmp_path / "gloo"
    result = CliRunner().invoke(main, ["ingest", str(DATASETS / "torch_gloo_2rank"), "-o", str(out),
                                       "--engine", "spark"])
    assert result.exit_code == 0, result.output
    assert "2 file(s) ingested" in result.output and "2 rank(s)" in result.output
    assert len(tracesql.query("steps", out)) > 0


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> Path:
    return tracesql.ingest([DATASETS / "torch_gloo_2rank"], tmp_path_factory.mktemp("small") / "run").run


@pytest.mark.parametrize("folder", ["exp[1]", "a*", "what?"])
def test_spark_reads_exactly_the_runs_own_files(spark, small_run, tmp_path, folder):
    """Runs under glob characters are read, by path and by URI, and only their own files: not the sibling run
    that `a*` or `what?` would match, nor the files of the `exp1` that `exp[1]` would."""
    _views_of.clear()
    run = tmp_path / folder / "run"
    shutil.copytree(small_run, run)
    for sibling in ("ab", "whatX", "exp1"):
        shutil.copytree(small_run, tmp_path / sibling / "run")
        (tmp_path / sibling / "run" / "slices" / "rank00000-sibling.parquet").write_bytes(b"not parquet")
    want = engine.connect(run).execute("SELECT count(*), count(DISTINCT run_id) FROM slices").fetchone()
    assert want == (12103, 1)
    for target in (run, f"file://{run}", f"file://{tmp_path / folder}"):
        session = tsp.connect(target, spark=spark)
        assert tuple(session.sql("SELECT count(*), count(DISTINCT run_id) FROM slices").first()) == want, target
        assert len(session.table("slices").inputFiles()) == 2, target


@pytest.mark.parametrize("damage", ["missing", "extra", "resized"])
def test_spark_refuses_a_run_whose_parts_are_not_the_manifests(spark, small_run, tmp_path, damage):
    """The DuckDB engine's check and one-line message, for a local run and (the same problem) a run named by a
    URI, listed through Spark's file system."""
    _views_of.clear()
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    part = sorted((run / "slices").glob("*.parquet"))[0]
    if damage == "missing":
        part.unlink()
    elif damage == "extra":
        shutil.copy(part, run / "slices" / "rank00000-foreign.parquet")
    else:
        part.write_bytes(part.read_bytes() + b"\0")
    with pytest.raises(TraceError) as duck:
        engine.connect(run)
    with pytest.raises(TraceError) as local:
        tsp.connect(run, spark=spark)
    assert str(local.value) == str(duck.value)
    with pytest.raises(TraceError) as uri:
        tsp.connect(f"file://{tmp_path}", spark=spark)  # a fleet of the one run
    assert (uri.value.path, uri.value.problem) == (f"file://{duck.value.path}", duck.value.problem)
    expected = {"missing": "missing: the run's manifest lists it", "extra": "not part of the run",
                "resized": "changed: "}[damage]
    assert duck.value.problem.startswith(expected)
    assert duck.value.path == str(run / "slices" / ("rank00000-foreign.parquet" if damage == "extra" else part.name))
    result = CliRunner().invoke(main, ["query", "steps", str(run), "--engine", "spark"])
    assert (result.exit_code, result.output) == (1, f"Error: {duck.value}\n")
