"""Terminal output (issue 17): the table fits the terminal (or folds into records), human units in `table` only,
raw values in csv/json/parquet, lists as JSON text in csv, Markdown escaped; `-c/--columns`; and the command's
fixed cost (issue 15): `tracesql --help` loads no DuckDB, Arrow or pandas, a query creates only the views and
functions it uses."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import subprocess
import sys

import duckdb
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import DATASETS, REPO

from tracesql import cli, engine, functions, output, queries, schema
from tracesql.errors import TraceError
from tracesql.output import Result

TRACE_FILTER = DATASETS / "hta_trace_filter"  # 2 ranks, kernels and NCCL
B200 = DATASETS / "tracelens_b200_eager"  # recorded with shapes: roofline has rows


def run_cli(*args, columns: int | None = None):
    env = {"COLUMNS": str(columns)} if columns else {}
    return CliRunner(env=env).invoke(cli.main, [str(a) for a in args], catch_exceptions=False)


def result_of(sql: str) -> Result:
    return Result.of(duckdb.sql(sql))


WIDE = ("SELECT 'run-' || i AS run_id, i AS rank, i * 396199000 AS comm_ns, i * 1536 AS peak_allocated_bytes, "
        "'void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float>>' || i AS name, "
        "[i, i * 1000] AS start_skew_ns, i / 7 AS overlap_ratio, 1.5e12 * i AS achieved_flops_per_s, "
        "i * 1000 AS exposed_communication_ns, i AS another_long_column_name, 12 AS yet_another_long_column "
        "FROM range(1, 4) t(i)")


# ---- units ----

@pytest.mark.parametrize("ns, text", [
    (396199000, "396.2 ms"), (850, "850 ns"), (0, "0 ns"), (1000, "1 µs"), (999, "999 ns"), (12300, "12.3 µs"),
    (-12300, "-12.3 µs"), (1_500_000_000, "1.5 s"), (61_234_000_000, "61.23 s"), (2.5, "2.5 ns"), (1234.5, "1.234 µs"),
])
def test_durations_in_human_units(ns, text):
    assert output.human_ns(ns) == text


@pytest.mark.parametrize("n, text", [(3, "3 B"), (1536, "1.5 KiB"), (1024**2 * 7.25, "7.25 MiB"),
                                     (int(1.5 * 2**30), "1.5 GiB"), (-2048, "-2 KiB")])
def test_bytes_in_human_units(n, text):
    assert output.human_bytes(n) == text


def test_rates_in_human_units():
    assert output.human_rate(1.5e12, "FLOP/s") == "1.5 TFLOP/s"
    assert output.human_rate(3.35e12, "B/s") == "3.35 TB/s" and output.human_rate(12, "B/s") == "12 B/s"


@pytest.mark.parametrize("column, duration", [
    ("comm_ns", True), ("dur", True), ("start_skew_ns", True), ("delta_ns", True),
    ("start_ns", False), ("trace_start_ns", False), ("end_ns", False), ("ts", False), ("first_ts", False),
    ("step", False), ("size_bytes", False),
])
def test_which_columns_are_durations(column, duration):
    assert output.is_duration(column) is duration


# ---- table ----

@pytest.mark.parametrize("width", [40, 60, 80, 100, 120, 200])
def test_table_never_exceeds_the_width(width):
    text = output.table(result_of(WIDE), width=width)
    assert max(len(line) for line in text.splitlines()) <= width, text


def test_table_shows_human_units_and_right_aligns_numbers():
    text = output.table(result_of(WIDE), width=400)
    lines = text.splitlines()
    assert "792.4 ms" in text and "3 KiB" in text and "4.5 TFLOP/s" in text and "[3 ns, 3 µs]" in text
    assert "792398000" not in text
    header = lines[0]
    assert header.index("rank") < header.index("comm_ns")
    row = lines[3]
    assert row.split()[1] == "2" and row.index("792.4 ms") + len("792.4 ms") == header.index("comm_ns") + len("comm_ns")
    assert lines[-1] == "(3 rows)"


def test_wide_result_folds_into_records():
    text = output.table(result_of(WIDE), width=60)
    assert text.count("─[ row ") == 3 and "-c/--columns" in text.splitlines()[-1]
    block = text.split("─[ row 2 ]")[1].split("─[ row 3 ]")[0]
    assert re.search(r"\ncomm_ns +792.4 ms\n", block) and re.search(r"\npeak_allocated_bytes +3 KiB\n", block)


def test_headers_break_after_underscores_before_folding():
    result = result_of("SELECT 1 AS device_id, 2 AS exposed_comm_ns, 3 AS overlap_pct")
    text = output.table(result, width=30)
    assert "─[ row" not in text
    first, second = (line.split() for line in text.splitlines()[:2])
    assert first == ["device_", "exposed_", "overlap_"] and second == ["id", "comm_ns", "pct"]
    assert output.wrap_header("exposed_comm_ns", 8) == ["exposed_", "comm_ns"]
    assert output.wrap_header("abcdefghij", 4) == ["abcd", "efgh", "ij"]


def test_long_text_is_cut_and_kept_on_one_line():
    result = result_of("SELECT 'a' || repeat('x', 300) AS name, 'two\nlines' AS note")
    text = output.table(result, width=100)
    assert "…" in text and "two lines" in text and max(len(line) for line in text.splitlines()) <= 100
    assert len(text.splitlines()) == 4


def test_table_row_counts_and_nulls():
    assert output.table(result_of("SELECT 1 AS a WHERE false"), width=80).splitlines() == ["a", "─", "(0 rows)"]
    one = output.table(result_of("SELECT NULL::BIGINT AS comm_ns, 2.0::DOUBLE AS x"), width=80)
    assert one.splitlines()[-1] == "(1 row)" and "NULL" in one and " 2" in one


def test_terminal_width_from_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "77")
    assert output.terminal_width() == 77
    monkeypatch.delenv("COLUMNS")
    assert output.terminal_width() >= 1  # the terminal's, or DEFAULT_WIDTH when there is none


# ---- raw formats ----

def test_csv_keeps_raw_integers_and_writes_lists_as_json():
    text = output.to_csv(result_of(WIDE))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(text.splitlines()) == 4 and len(rows) == 3
    assert rows[1]["comm_ns"] == "792398000" and rows[1]["peak_allocated_bytes"] == "3072"
    assert json.loads(rows[1]["start_skew_ns"]) == [2, 2000]


def test_csv_nulls_floats_and_nested_values():
    text = output.to_csv(result_of("SELECT NULL AS a, 0.1::DOUBLE + 0.2::DOUBLE AS b, {'x': [1, 2]} AS c, [[1, 2], [3]] AS d"))
    assert text.splitlines()[1] == ',0.30000000000000004,"{""x"": [1, 2]}","[[1, 2], [3]]"'


def test_json_is_raw_and_valid():
    rows = json.loads(output.to_json(result_of(WIDE + " UNION ALL SELECT NULL, NULL, NULL, NULL, NULL, NULL, "
                                                      "'NaN'::DOUBLE, NULL, NULL, NULL, NULL")))
    assert rows[0]["comm_ns"] == 396199000 and rows[0]["start_skew_ns"] == [1, 1000]
    assert rows[-1]["overlap_ratio"] is None and rows[1]["overlap_ratio"] == pytest.approx(2 / 7)


def test_markdown_escapes_cells():
    text = output.markdown(result_of("SELECT 'a|b' AS name, 'x\\y' AS p, 'one\ntwo' AS n, 5 AS count_ns"))
    lines = text.splitlines()
    assert lines[0] == "| name | p | n | count_ns |" and lines[1] == "|---|---|---|---:|"
    assert lines[2] == "| a\\|b | x\\\\y | one<br>two | 5 |" and len(lines) == 3


def test_pick_columns_by_name_and_pattern():
    result = result_of(WIDE)
    picked = result.pick(["rank", "*_ns", "rank"])
    assert picked.columns == ["rank", "comm_ns", "start_skew_ns", "exposed_communication_ns"]
    assert picked.rows[0] == (1, 396199000, [1, 1000], 1000)
    with pytest.raises(TraceError, match="no column 'nope' in the result .columns: run_id, rank,"):
        result.pick(["nope"])
    assert output.parse_columns(" rank, *_ns ,") == ["rank", "*_ns"] and output.parse_columns("") is None


# ---- the command ----

def test_cli_formats_match_output():
    assert cli.FORMATS == output.FORMATS


def test_cli_columns_and_raw_formats(ingested):
    run = ingested(TRACE_FILTER)
    table = run_cli("query", "overlap", run, "-c", "rank,*_pct,comm_ns", columns=100)
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].split() == ["rank", "overlap_pct", "comm_ns"] and "396.2 ms" in lines[2]
    assert run_cli("query", "overlap", run, "-f", "csv", "-c", "comm_ns").output == "comm_ns\n396199000\n379053000\n"
    bad = run_cli("query", "overlap", run, "-c", "nope")
    assert bad.exit_code == 1 and bad.output.startswith("Error: --columns: no column 'nope'")
    assert bad.output.count("\n") == 1


def test_cli_parquet_keeps_types_and_picks_columns(ingested, tmp_path):
    run = ingested(TRACE_FILTER)
    result = run_cli("query", "overlap", run, "-f", "parquet", "-o", tmp_path / "o.parquet", "-c", "rank,comm_ns")
    assert result.exit_code == 0, result.output
    table = pq.read_table(tmp_path / "o.parquet")
    assert table.column_names == ["rank", "comm_ns"] and table.column("comm_ns").to_pylist() == [396199000, 379053000]


def test_roofline_is_readable_in_100_columns(ingested):
    run = ingested(B200)
    result = run_cli("query", "roofline", run, "-p", "device=B200", columns=100)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 100
    columns = queries.find("roofline").columns
    first = result.output.split("─[ row 2 ]")[0]
    assert all(any(line.startswith(name + " ") for line in first.splitlines()) for name, _, _ in columns)
    assert " ms" in first or " µs" in first


def test_csv_of_shapes_is_one_line_per_row(ingested):
    run = ingested(B200)
    text = run_cli("query", "roofline", run, "-p", "device=B200", "-f", "csv").output
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows and len(text.splitlines()) == len(rows) + 1
    dims = json.loads(rows[0]["input_dims"])
    assert isinstance(dims, list) and all(isinstance(d, list) for d in dims)
    assert "array(" not in text and "\n " not in text


def test_shell_prints_tables(ingested):
    result = CliRunner(env={"COLUMNS": "80"}).invoke(
        cli.main, ["shell", str(ingested(TRACE_FILTER))], input="SELECT sum(dur) AS dur FROM slices WHERE rank = 0;\n")
    assert result.exit_code == 0 and "(1 row)" in result.output and " s\n" in result.output, result.output


# ---- fixed cost ----

def _modules_after(*args) -> set[str]:
    code = ("import sys\nfrom tracesql.cli import main\ntry:\n    main(%r)\nexcept SystemExit:\n    pass\n"
            "print(' '.join(sys.modules), file=sys.stderr)") % (list(args),)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "", "TRACESQL_CACHE": "/nonexistent"}, timeout=300)
    return set(done.stderr.split())


def test_help_loads_no_heavy_module():
    loaded = _modules_after("--help")
    assert "click" in loaded and not loaded & {"duckdb", "pyarrow", "pandas", "numpy", "rich", "tracesql.engine"}
    assert not _modules_after("queries") & {"duckdb", "pyarrow", "pandas"}


def test_query_loads_no_pandas(ingested):
    loaded = _modules_after("query", "overlap", str(ingested(TRACE_FILTER)), "-f", "csv")
    assert "duckdb" in loaded and "pandas" not in loaded and "rich" not in loaded


def test_names_needed_are_closed_under_use():
    statements, tables = functions.needed({"analysis_timeline"}, set(schema.TABLES))
    text = "\n".join(statements)
    for macro in ("analysis_timeline", "device_timeline", "device_activity", "kernel_classes"):
        assert f"{macro}" in text
    assert "op_costs(" not in text and "slices" in tables
    assert functions.needed(set(), set(schema.TABLES)) == ([], set())


@pytest.mark.parametrize("query", [q.name for q in queries.catalogue()])
def test_query_on_only_its_names_is_the_same(ingested, query):
    """Every curated query returns the same rows on a connection with only the views and functions it uses as on
    one with all of them."""
    run = ingested(TRACE_FILTER)
    q = queries.find(query)
    params = {"before": "hta_trace_filter", "after": "hta_trace_filter"} if query == "diff" else {}
    full = engine.connect(run)
    lean = engine.connect(run, names=queries.names_used(q))
    created = lean.execute("SELECT count(*) FROM duckdb_functions() WHERE function_type LIKE '%macro%' "
                           "AND NOT internal").fetchall()[0][0]
    everything = full.execute("SELECT count(*) FROM duckdb_functions() WHERE function_type LIKE '%macro%' "
                              "AND NOT internal").fetchall()[0][0]
    assert created < everything
    a, b = (queries.run(con, q, params).fetchall() for con in (full, lean))
    assert repr(a) == repr(b) or all(
        x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y)) for r, s in zip(a, b) for x, y in zip(r, s))


def test_raw_traces_unchanged_are_not_read_again(tmp_path, monkeypatch):
    """A query on raw traces ingests them into the cache once; afterwards, while no file under them changes, the
    cached run is used without importing the readers; a new file is seen."""
    import shutil

    import tracesql

    cache = tmp_path / "cache"
    monkeypatch.setenv("TRACESQL_CACHE", str(cache))
    traces = tmp_path / "gloo"
    traces.mkdir()
    first, second = sorted((DATASETS / "torch_gloo_2rank").glob("*.json*"))
    shutil.copy(first, traces)
    assert len(tracesql.query("steps", traces).groupby("rank")) == 1
    code = ("import sys\nfrom tracesql import engine\nengine.resolve(sys.argv[1])\n"
            "print('tracesql.ingestion' in sys.modules, 'tracesql.readers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(traces)], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "", "TRACESQL_CACHE": str(cache)}, timeout=300)
    assert done.stdout.split() == ["False", "False"], done.stderr
    shutil.copy(second, traces)  # a new file: the folder changed
    assert len(tracesql.query("steps", traces).groupby("rank")) == 2
    assert len([p for p in cache.iterdir() if not p.name.startswith(".")]) == 1
