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

@pytest.mark.parametrize("column, values, header, cells", [
    ("comm_ns", [396199000, 59216000, 850], "comm_ms", ["396.2", "59.2", "0.0"]),
    ("comm_ns", [1_223_000_000, 5_000_000], "comm_s", ["1.223", "0.005"]),
    ("delta_ns", [-12300, 2048], "delta_us", ["-12.30", "2.05"]),
    ("gap_ns", [850, 0, 3], "gap_ns", ["850", "0", "3"]),
    ("gap_ns", [2.5, 0.25], "gap_ns", ["2.500", "0.250"]),
    ("dur", [61_234_000_000, None], "dur_s", ["61.23", "NULL"]),
    ("size_bytes", [1536, 3], "size_KiB", ["1.500", "0.003"]),
    ("peak_allocated_bytes", [int(1.5 * 2**30)], "peak_allocated_GiB", ["1.500"]),
    ("achieved_flops_per_s", [4.5e12, 1.5e12], "achieved_tflops_per_s", ["4.500", "1.500"]),
    ("link_bytes_per_s", [3.35e12, 12], "link_tb_per_s", ["3.350", "0.000"]),
    ("start_skew_ns", [[3, 3000]], "start_skew_us", ["[0.003, 3.000]"]),
    ("trace_start_ns", [1_700_000_000_123_456_789], "trace_start_ns", ["1700000000123456789"]),
])
def test_each_column_in_one_unit_named_in_its_header(column, values, header, cells):
    """Issue 24: `comm_ns` showed "396.2 ms" under a header that says ns. Now one unit per column, the one its
    largest value reaches, named in the header, with the decimals that give that value four significant digits."""
    unit = output.column_unit(column, values)
    shown = [unit.text(v) for v in values] if unit else [output.plain(v) for v in values]
    assert ((unit.header if unit else column), shown) == (header, cells)


def test_plain_numbers_never_use_an_exponent():
    """Issue 24: Markdown mixed `8.641e+07` with plain integers in one row."""
    assert [output.plain(v) for v in (86410000.7, 0.14953, 1295.568, 1.5e-05, -0.5, 12.0, 3)] == \
        ["86410001", "0.1495", "1296", "0.000015", "-0.5", "12", "3"]


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


def test_table_shows_units_and_right_aligns_numbers():
    text = output.table(result_of(WIDE), width=400)
    lines = text.splitlines()
    header = lines[0].split()
    assert header[:4] == ["run_id", "rank", "comm_s", "peak_allocated_KiB"] and "achieved_tflops_per_s" in header
    assert "792398000" not in text
    row = lines[3]
    assert row.split()[1:4] == ["2", "0.792", "3.000"] and "[0.002, 2.000]" in row
    assert row.index("0.792") + len("0.792") == lines[0].index("comm_s") + len("comm_s")
    assert lines[-1] == "(3 rows)"


@pytest.mark.slow
def test_headers_break_only_between_words(ingested):
    """Issue 24 (headers wrapped mid-word): at any width, every line of a wrapped header is whole `_`-separated
    pieces of it, for every curated query's real result."""
    con = engine.connect(ingested(TRACE_FILTER))
    checked = 0
    for q in queries.catalogue():
        if q.name == "diff":
            continue
        result = Result.of(queries.run(con, q, {}))
        for width in range(40, 201, 8):
            lines = output.table(result, width).splitlines()
            rule = next((i for i, line in enumerate(lines) if line.startswith("─")), None)
            if rule is None or "─[ row" in lines[rule]:
                continue  # folded into records: a header per line, never wrapped
            for column in re.finditer("─+", lines[rule]):
                pieces = [line[column.start():column.end()].strip() for line in lines[:rule]]
                pieces = [p for p in pieces if p]
                header = "".join(pieces)
                whole = output.wrap_header(header, max(len(p) for p in pieces))
                assert all(p.endswith("_") for p in pieces[:-1]) and whole == pieces, (q.name, width, pieces)
                checked += 1
    assert checked > 1000


def test_wide_result_folds_into_records():
    text = output.table(result_of(WIDE), width=60)
    assert text.count("─[ row ") == 3 and "-c/--columns" in text.splitlines()[-1]
    block = text.split("─[ row 2 ]")[1].split("─[ row 3 ]")[0]
    assert re.search(r"\ncomm_s +0.792\n", block) and re.search(r"\npeak_allocated_KiB +3.000\n", block)


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
    assert lines[0].split() == ["rank", "overlap_pct", "comm_ms"] and lines[2].split() == ["0", "14.95", "396.2"]
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
    first = result.output.split("─[ row 2 ]")[0]
    labels = [line.split()[0] for line in first.splitlines()[1:]]
    assert len(labels) == len(queries.find("roofline").columns) and "device_us" in labels or "device_ms" in labels


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
    assert result.exit_code == 0 and "(1 row)" in result.output and result.output.startswith("dur_s\n"), result.output


def test_help_lists_each_command_on_one_uncut_line():
    """Issue 24: the command list cut `query`'s line at "e.g." (click's first-sentence short help)."""
    text = run_cli("--help", columns=80).output
    listed = text.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed] == sorted(cli.main.commands)  # one line each, none wrapped
    assert all(len(line) <= 80 and not line.endswith("...") for line in listed), listed
    assert any(line.split()[0] == "query" and "(e.g. overlap) or your .sql file on a run." in line for line in listed)


def test_help_examples_do_not_wrap():
    """Issue 24: `query --help`'s example wrapped at 80 columns, so a copy-paste broke it: every command's example
    is printed on one line whatever the width."""
    for name, command in cli.main.commands.items():
        examples = [line.strip() for line in (command.help or "").splitlines() if line.strip().startswith("tracesql ")]
        text = run_cli(name, "--help", columns=60).output
        assert all(f"\n      {example}\n" in text for example in examples), (name, examples, text)
    assert "-c rank,step,*_pct\n" in run_cli("query", "--help", columns=60).output


def test_queries_are_listed_aligned():
    """Issue 24: `collective_stragglers` (21 characters) pushed its title out of the column."""
    lines = run_cli("queries").output.splitlines()
    starts = {len(line) - len(line.split(None, 1)[1]) for line in lines}
    assert len(lines) == len(queries.catalogue()) and len(starts) == 1


# ---- fixed cost ----

def _python_after(args: list[str], then: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """A fresh Python that runs the command line `args` in-process (its SystemExit caught), then the code `then`."""
    code = ("import sys\nfrom tracesql.cli import main\ntry:\n    main(%r)\nexcept SystemExit:\n    pass\n" % (args,)
            + then)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={"PYTHONPATH": str(REPO), "PATH": "", "TRACESQL_CACHE": "/nonexistent"} | (env or {}))


def _modules_after(*args) -> set[str]:
    return set(_python_after(list(args), "print(' '.join(sys.modules), file=sys.stderr)").stderr.split())


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


@pytest.fixture(scope="module")
def full_session(ingested):
    """A session of the trace-filter run with all views and functions (opening one: 0.07 s, the macros attached from the cache)."""
    return engine.connect(ingested(TRACE_FILTER))


@pytest.mark.parametrize("attached", [True, False], ids=["macros-attached", "macros-created"])
@pytest.mark.parametrize("query", [q.name for q in queries.catalogue()])
def test_query_on_only_its_names_is_the_same(ingested, full_session, query, attached, monkeypatch):
    """Every curated query returns the same rows on a connection with only the views it uses (and, where the
    compiled macros cannot be attached, only the functions it uses, created) as on one with all of them."""
    run = ingested(TRACE_FILTER)
    q = queries.find(query)
    params = {"before": "hta_trace_filter", "after": "hta_trace_filter"} if query == "diff" else {}
    if not attached:
        monkeypatch.setattr(functions, "compiled", lambda cache: None)
    lean = engine.connect(run, names=queries.names_used(q))
    views = "SELECT count(*) FROM duckdb_views() WHERE NOT internal"
    macros = "SELECT count(*) FROM duckdb_functions() WHERE function_type LIKE '%macro%' AND NOT internal"
    (lean_views, lean_macros), (all_views, all_macros) = (
        (con.execute(views).fetchall()[0][0], con.execute(macros).fetchall()[0][0]) for con in (lean, full_session))
    assert lean_views < all_views
    assert lean_macros == all_macros if attached else lean_macros < all_macros
    a, b = (queries.run(con, q, params).fetchall() for con in (full_session, lean))
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
    # (one run; beside it, the folder of the compiled macros' database: functions.compiled)
    assert sorted(p.name.split("-")[0] for p in cache.iterdir() if not p.name.startswith(".")) == ["functions", "gloo"]


def test_the_program_exits_without_collecting_garbage(monkeypatch):
    """The `tracesql` program (pyproject's script, `python -m tracesql`) freezes the objects it leaves for Python's
    exit, out of the exit's garbage collections (0.27 s after findings at 24x), whatever the command's outcome."""
    import gc

    assert re.search(r'^\[project\.scripts\]\ntracesql = "tracesql\.cli:command_line"$',
                     (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert "command_line()" in (REPO / "tracesql" / "__main__.py").read_text()
    frozen = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(True))
    for argv, code in ((["--version"], 0), (["query", "no_such_query", "nowhere"], 1)):
        frozen.clear()
        monkeypatch.setattr(sys, "argv", ["tracesql", *argv])
        with pytest.raises(SystemExit) as exited:
            cli.command_line()
        assert exited.value.code == code and frozen == [True]


def test_numpy_asks_for_no_huge_pages_in_a_command():
    """A command's numpy arrays take the kernel's usual pages, not huge ones it zeroes whole and compacts memory
    for (NUMPY_MADVISE_HUGEPAGE=0 before numpy is imported: 0.26 s less of findings at 24x), unless the user says."""
    for given, expected in ((None, "False"), ("1", "True")):
        done = _python_after(["schema", "steps"], "import numpy\nprint(numpy._core.multiarray._set_madvise_hugepage(True))",
                             env=None if given is None else {"NUMPY_MADVISE_HUGEPAGE": given})
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[-1] == expected
