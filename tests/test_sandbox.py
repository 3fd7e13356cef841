"""The SQL sandbox (`tracesql.connect(run, sandbox=True)`, `shell --sandbox`, `query --sandbox`): SQL reads the
run's tables and nothing else, writes nothing, and cannot unlock itself; the plain session stays unrestricted.
Every escape is tried for real and must fail with DuckDB's one-line error, and leave nothing behind."""

from __future__ import annotations

import shutil
import subprocess
import sys

import duckdb
import pytest

import tracesql
from conftest import DATASETS, REPO

TRACE_FILTER = DATASETS / "hta_trace_filter"
GLOO = DATASETS / "torch_gloo_2rank"


def escapes(tmp_path, other_run):
    """(what is tried, SQL, the start of DuckDB's refusal): reading outside the run, writing, attaching, extending,
    reconfiguring."""
    part = next((other_run / "slices").glob("rank*.parquet"))
    return [
        ("read /etc/passwd as text", "SELECT * FROM read_text('/etc/passwd')", "Permission Error"),
        ("read /etc/passwd as CSV", "SELECT * FROM read_csv('/etc/passwd', sep = ':')", "Permission Error"),
        ("read another run's part", f"SELECT count(*) FROM read_parquet('{part}')", "Permission Error"),
        ("list a folder", "SELECT * FROM glob('/etc/*')", "Permission Error"),
        ("write a file", f"COPY (SELECT * FROM slices) TO '{tmp_path / 'out.csv'}'", "Permission Error"),
        ("export the database", f"EXPORT DATABASE '{tmp_path / 'exported'}'", "Permission Error"),
        ("attach a database file", f"ATTACH '{tmp_path / 'other.db'}' AS other", "Permission Error"),
        ("install an extension", "INSTALL httpfs", "Permission Error"),
        ("load an extension", "LOAD httpfs", "Permission Error"),
        ("read a URL", "SELECT * FROM read_json('https://example.com/x.json')", "Permission Error"),
        ("re-enable external access", "SET enable_external_access = true", "Invalid Input Error"),
        ("unlock the configuration", "RESET lock_configuration", "Invalid Input Error"),
        ("raise the memory limit", "SET memory_limit = '100GB'", "Invalid Input Error"),
        ("spill to disk", "SET temp_directory = '/tmp'", "Invalid Input Error"),
    ]


def test_sandbox_answers_as_the_plain_session(ingested):
    run = ingested(TRACE_FILTER)
    sql = "SELECT kind, count(*), sum(dur) FROM slices GROUP BY ALL ORDER BY ALL"
    plain = tracesql.connect(run).sql(sql).fetchall()
    assert len(plain) > 3
    assert tracesql.connect(run, sandbox=True).sql(sql).fetchall() == plain
    # a curated query through the API, sandboxed: the same frame
    assert tracesql.query("overlap", run, sandbox=True).equals(tracesql.query("overlap", run))


def test_every_escape_fails_with_one_line(ingested, tmp_path):
    con = tracesql.connect(ingested(TRACE_FILTER), sandbox=True)
    for what, sql, refusal in escapes(tmp_path, ingested(GLOO)):
        with pytest.raises(duckdb.Error) as e:
            con.sql(sql)
        assert str(e.value).startswith(refusal), (what, str(e.value))
        assert "\n" not in str(e.value).strip(), what
    assert list(tmp_path.iterdir()) == []  # nothing written, nothing attached
    assert con.sql("SELECT count(*) FROM slices").fetchall()[0][0] == 9487  # and the session still answers


def test_exhausting_memory_fails_with_one_line(ingested):
    con = tracesql.connect(ingested(TRACE_FILTER), sandbox=True, memory_limit="100MB")
    with pytest.raises(duckdb.OutOfMemoryException, match="^Out of Memory Error"):
        con.sql("SELECT list(i) FROM range(100000000) t(i)").fetchall()
    assert con.sql("SELECT current_setting('memory_limit')").fetchall()[0][0] == "95.3 MiB"


def test_python_variables_are_not_tables(ingested):
    secret = duckdb.sql("SELECT 42 AS answer").arrow()  # noqa: F841  (what a replacement scan would find)
    with pytest.raises(duckdb.CatalogException):
        tracesql.connect(ingested(TRACE_FILTER), sandbox=True).sql("SELECT * FROM secret").fetchall()
    assert tracesql.connect(ingested(TRACE_FILTER)).sql("SELECT * FROM secret").fetchall() == [(42,)]


def test_run_under_glob_characters_reads_in_the_sandbox(tmp_path, ingested):
    """The views name files with glob characters escaped (`exp[[]1]`): the sandbox allows that name too."""
    run = tmp_path / "exp[1]" / "run"
    shutil.copytree(ingested(GLOO), run)
    assert tracesql.connect(run, sandbox=True).sql("SELECT count(*) FROM ranks").fetchall() == [(2,)]


def _cli(*args, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracesql", *map(str, args)], input=stdin, capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def test_shell_sandbox_refuses_each_escape_in_one_line_and_plain_shell_does_not(ingested, tmp_path):
    run = ingested(TRACE_FILTER)
    tried = escapes(tmp_path, ingested(GLOO))
    script = "".join(sql + ";\n" for _, sql, _ in tried) + "SELECT count(*) AS n FROM slices;\n"
    done = _cli("shell", "--sandbox", run, stdin=script)
    assert done.returncode == 1, done.stderr  # piped statements failed (the escapes): the shell says so
    errors = done.stderr.splitlines()
    assert [line.split(":")[0] for line in errors] == ["Error"] * len(tried)
    assert [line.removeprefix("Error: ").startswith(refusal) for line, (_, _, refusal) in zip(errors, tried)] == \
        [True] * len(tried)
    assert "9487" in done.stdout and list(tmp_path.iterdir()) == []
    # the plain shell is DuckDB's own: it writes where it is told (the documented contract for a person)
    done = _cli("shell", run, stdin=f"COPY (SELECT count(*) AS n FROM slices) TO '{tmp_path / 'n.csv'}';\n")
    assert done.returncode == 0 and (tmp_path / "n.csv").read_text() == "n\n9487\n", done.stderr


def test_query_sandbox_runs_a_file_and_refuses_its_escape(ingested, tmp_path):
    run = ingested(TRACE_FILTER)
    good, bad = tmp_path / "good.sql", tmp_path / "bad.sql"
    good.write_text("SELECT count(*) AS n FROM slices WHERE kind = 'kernel'")
    bad.write_text("SELECT * FROM read_text('/etc/passwd')")
    kernels = tracesql.connect(run).sql(good.read_text()).fetchall()[0][0]
    done = _cli("query", good, run, "--sandbox", "-f", "csv")
    assert (done.returncode, done.stdout) == (0, f"n\n{kernels}\n"), done.stderr
    done = _cli("query", bad, run, "--sandbox")
    assert done.returncode == 1 and done.stderr.startswith("Error: SQL error: Permission Error: Cannot access file "
                                                           '"/etc/passwd"') and done.stderr.count("\n") == 1
    done = _cli("query", good, run, "--sandbox", "-f", "parquet", "-o", tmp_path / "x.parquet")
    assert done.returncode == 2 and "--sandbox writes no file" in done.stderr
