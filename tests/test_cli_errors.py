"""Every command × every class of bad argument (missing, unwritable or odd paths, bad environment values, bad
parameters, interrupted with Ctrl-C): one line on stderr, `Error: ...`, a non-zero exit status (1 bad input,
2 usage error, 130 interrupted), never a traceback (issue 16, item 8)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import tracesql
from conftest import DATASETS, write_trace
from tracesql.cli import main

TRACE = DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz"


@pytest.fixture(scope="module")
def ws(tmp_path_factory, ingested):
    """A workspace: a good run, a file, a folder, a damaged run."""
    root = tmp_path_factory.mktemp("cli")
    shutil.copytree(ingested(TRACE), root / "run")
    (root / "file.txt").write_text("not a folder")
    (root / "folder").mkdir()
    damaged = root / "damaged"
    damaged.mkdir()
    (damaged / "tracesql.json").write_text("{ not json")
    (root / "q.sql").write_text("SELECT count(*) AS n FROM slices")
    return root


def _cases(ws):
    run, f, d = ws / "run", ws / "file.txt", ws / "folder"
    missing = ws / "nope"
    return [
        # (args, env, exit code, what the line says)
        (["ingest", missing, "-o", ws / "r1"], {}, 1, f"{missing}: no such file or folder"),
        (["ingest", TRACE, "-o", f / "run"], {}, 1, "cannot write the run"),
        (["ingest", TRACE, "-o", f], {}, 1, "exists and is not a tracesql run"),
        (["ingest", TRACE, "-o", ws / "r2", "--memory-limit", "lots"], {}, 1, "'lots' is not a size"),
        (["ingest", TRACE, "-o", ws / "r2"], {"TRACESQL_MEMORY_LIMIT": "abc"}, 1, "'abc' is not a size"),
        (["ingest", TRACE, "-o", ws / "r2"], {"TRACESQL_MAX_EVENTS": "many"}, 1, "TRACESQL_MAX_EVENTS: not an integer"),
        (["ingest", TRACE, "-o", ws / "r2"], {"TRACESQL_MAX_ARCHIVE_BYTES": "abc"}, 1,
         "TRACESQL_MAX_ARCHIVE_BYTES: 'abc' is not a number of bytes"),
        (["ingest", TRACE, "-o", ws / "r2"], {"TRACESQL_MAX_GZIP_RATIO": "0"}, 1,
         "TRACESQL_MAX_GZIP_RATIO: '0' is not a number above 1"),
        (["ingest", TRACE, "-o", ws / "r2"], {"TRACESQL_JOBS": "0"}, 1,
         "TRACESQL_JOBS: '0' is not a number of files read at once (1 or more)"),
        (["ingest", TRACE, "-o", ws / "r2", "--rank", "x"], {}, 2, "'x' is not a valid integer"),
        (["ingest", TRACE, "-o", ws / "r2", "--max-events", "0"], {}, 1, "--max-events: must be at least 1"),
        (["ingest", TRACE], {}, 2, "Missing option '-o' / '--output'"),
        (["ingest", TRACE, "-o", ws / "r2", "--bogus"], {}, 2, "No such option '--bogus'"),
        (["query", "no_such_query", run], {}, 1, "no_such_query: no such query file or curated query"),
        (["query", "overlp", run], {}, 1, "Error: overlp: no such query file or curated query (did you mean overlap?)"),
        (["query", "steps", missing], {}, 1, f"{missing}: no such file or folder"),
        (["query", "steps", ws / "damaged"], {}, 1, "not a readable tracesql run"),
        (["query", "steps", run, "-o", d], {}, 1, f"{d}: is a folder: --output names the file to write"),
        (["query", "steps", run, "-o", missing / "x.csv"], {}, 1, f"{missing / 'x.csv'}: no such folder"),
        (["query", "steps", run, "-o", f / "x.csv"], {}, 1, "no such folder"),
        (["query", "steps", run, "-f", "parquet"], {}, 2, "--format parquet needs --output FILE"),
        (["query", "steps", run, "-p", "novalue"], {}, 2, "expected NAME=VALUE"),
        (["query", "steps", run, "-p", "no_such_param=1"], {}, 1, "Error: steps: unknown parameter no_such_param"),
        (["query", "overlap", run, "-p", "class_scheme=bogus"], {}, 1, "Error: overlap: parameter class_scheme"),
        (["query", ws / "q.sql", run, "-p", "x=1"], {}, 1, f"Error: {ws / 'q.sql'}: unknown parameter x"),
        (["query", ws / "q.sql", run, "-f", "xml"], {}, 2, "Invalid value for '-f' / '--format'"),
        (["info", missing], {}, 1, f"{missing}: no such file or folder"),  # as query says (issue 24)
        (["info", d], {}, 1, f"{d}: not a tracesql run"),
        (["info", ws / "damaged"], {}, 1, "not a readable tracesql run"),
        (["verify", missing], {}, 1, f"{missing}: no such file or folder"),
        (["verify", d], {}, 1, f"{d}: not a tracesql run"),
        (["verify", ws / "damaged"], {}, 1, "not a readable tracesql run"),
        (["shell", missing], {}, 1, f"{missing}: no such file or folder"),
        (["diff", run, missing], {}, 1, f"{missing}: no such file or folder"),
        (["diff", run, run, "-o", d], {}, 1, f"{d}: is a folder"),
        (["diff", run, run, "--top", "0"], {}, 2, "0 is not in the range x>=1"),
        (["report", missing, "-o", ws / "rep"], {}, 1, f"{missing}"),
        (["report", run, "-o", f / "rep"], {}, 1, "cannot write the report"),
        (["report", run, "-o", ws / "rep", "--fail-on", "nonsense"], {}, 1, "nonsense"),
        (["schema", "no_table"], {}, 1, "no table 'no_table'"),
        (["export", missing, "-o", ws / "x.pftrace"], {}, 1, f"{missing}: no such file or folder"),
        (["export", run, "-o", d, "--rank", "0"], {}, 1, f"{d}: is a folder"),
        (["export", run, "-o", ws / "x.pftrace", "--rank", "99"], {}, 1, "99"),
        (["export", run, "-o", ws / "x.pftrace", "--step", "x"], {}, 2, "'x' is not a valid integer"),
        (["no_command"], {}, 2, "No such command 'no_command'"),
    ]


def test_every_command_and_bad_argument_gives_one_line(ws, monkeypatch):
    failures = []
    for args, env, code, says in _cases(ws):
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            result = CliRunner().invoke(main, [str(a) for a in args])
        out = result.output.strip()
        ok = (result.exit_code == code and len(out.splitlines()) == 1 and out.startswith("Error: ")
              and says in out and "Traceback" not in out)
        if not ok:
            failures.append((args, env, result.exit_code, out, repr(result.exception)))
    assert not failures, "\n".join(map(str, failures))


def _cli(*args, stdin: bytes | None = None, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tracesql", *map(str, args)], input=stdin, capture_output=True,
                          env={**os.environ, **(env or {})}, timeout=300, **kw)


def test_real_process_one_line_and_exit_code(ws):
    """The installed entry point (not only click's test runner): a usage error is exit 2, bad input exit 1."""
    done = _cli("query", "steps", ws / "nope")
    assert done.returncode == 1 and done.stderr.decode() == f"Error: {ws / 'nope'}: no such file or folder\n"
    done = _cli("ingest", TRACE, "-o", ws / "r3", "--rank", "-5")
    assert done.returncode == 2 and done.stderr.decode().count("\n") == 1, done.stderr


def test_shell_reads_a_line_that_is_not_utf8(ws):
    done = _cli("shell", ws / "run", stdin=b"SELECT '\xff\xfe' AS x;\nSELECT count(*) AS n FROM slices;\n")
    assert done.returncode == 0, done.stderr
    assert "4811" in done.stdout.decode() and "Traceback" not in done.stderr.decode()


def test_missing_extra_says_how_to_install_it_from_the_checkout(ws, monkeypatch):
    """Issue 24: the hint named the package index's distribution while the README installs from the checkout."""
    monkeypatch.setitem(sys.modules, "plotly", None)  # `import plotly` raises ImportError
    result = CliRunner().invoke(main, ["report", str(ws / "run"), "-o", str(ws / "rep-noextra")])
    assert result.exit_code == 1 and result.output.startswith(
        'Error: the report needs the [report] extra: pip install ".[report]" in the tracesql checkout (')
    assert not (ws / "rep-noextra").exists()


def test_shell_piped_exits_1_after_a_failed_statement(ws):
    """Issue 24: `Binder Error` printed but exit status 0 before, so a script could not tell. Every statement still
    runs (the one after the failure on the same line too); the status says one failed."""
    done = _cli("shell", ws / "run", stdin=b"SELECT nosuch FROM slices; SELECT 41 + 1 AS answer;\n")
    assert done.returncode == 1
    assert done.stderr.decode().startswith("Error: Binder Error: ") and done.stderr.decode().count("\n") == 1
    assert "42" in done.stdout.decode()
    done = _cli("shell", ws / "run", stdin=b"SELECT 1 AS one")  # the input ends inside a statement
    assert (done.returncode, done.stderr.decode()) == (1, "Error: statement not terminated with ';'\n")


@pytest.mark.concurrency  # a kill, like test_cleanup's kill -9: in the concurrency group (5 s in CI)
def test_ctrl_c_during_ingest_is_one_line_exit_130(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while workers read: 49 lines of
    tracebacks before; now one line, exit status 130, no worker left, the run as it was (absent)."""
    src = tmp_path / "src"
    src.mkdir()
    for rank in range(4):
        events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i % 50}", "ts": i * 10, "dur": 5, "pid": 1, "tid": 1}
                  for i in range(60_000)]
        write_trace(src / f"rank-{rank}.json", events, distributedInfo={"rank": rank})
    proc = subprocess.Popen([sys.executable, "-m", "tracesql", "ingest", str(src), "-o", str(tmp_path / "run"),
                             "-j", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline and not list(tmp_path.glob(".run.staging-*")):
        time.sleep(0.05)
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the ingest finished before the interrupt")
    assert (proc.returncode, err.decode()) == (130, "Error: interrupted\n")
    assert not (tmp_path / "run").exists()
    assert not _children_alive(proc.pid)


def _children_alive(parent: int) -> list[int]:
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                alive.append(int(entry))
    return alive


def test_damaged_manifest_then_reingest(ws, tmp_path):
    """`AttributeError` before: a manifest whose sources are not objects."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(ws / "run", run)
    manifest = json.loads((run / "tracesql.json").read_text())
    manifest["sources"] = ["not", "a", "dict"]
    (run / "tracesql.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(main, ["ingest", str(TRACE), "-o", str(run)])
    assert result.exit_code == 0, result.output
    assert "Warning: " in result.output and "damaged manifest: 'sources' is not an object" in result.output
