"""Smoke runs of the benchmark scripts on tiny bundled traces, so that none rots unnoticed (issue 15). They
check that each script runs to the end and prints its table; timings are not asserted (benchmarks measure them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SMALL = REPO / "datasets" / "tracelens_vllm_graph_execution" / "graph_execution.json.gz"  # 34 KB, kernels
pytestmark = pytest.mark.benchmark


def bench(script: str, *args, tmp_path: Path, status: int = 0) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path),
           "TRACESQL_CORPUS": str(tmp_path / "no-corpus")}  # only bundled traces, with or without ../shared
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *map(str, args)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == status, f"{script} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_bench_ingest(tmp_path):
    out = bench("bench_ingest.py", SMALL, "--only", "json,tracesql", "--repeat", "1", "--scratch", tmp_path / "s",
                tmp_path=tmp_path)
    assert "graph_execution" in out


def test_bench_memory(tmp_path):
    bench("bench_memory.py", SMALL, "--out", tmp_path / "memory.jsonl", tmp_path=tmp_path)
    assert '"exit": 0' in (tmp_path / "memory.jsonl").read_text()


def test_bench_queries(tmp_path):
    out = bench("bench_queries.py", SMALL, "--tiles", "1,2", "--repeat", "1", "--only", "overlap,hotspots",
                "--scratch", tmp_path / "q", tmp_path=tmp_path)
    assert "| `overlap` | per=step |" in out and "| `hotspots` | defaults |" in out


def test_bench_queries_against_a_base_checkout(tmp_path):
    """--base times another checkout's queries (here this one's) in a second worker, shown as before / after."""
    out = bench("bench_queries.py", SMALL, "--tiles", "1", "--repeat", "1", "--only", "bubbles",
                "--base", REPO, "--scratch", tmp_path / "q", tmp_path=tmp_path)
    assert "| ×1 CPU s before / after |" in out
    row = next(line for line in out.splitlines() if line.startswith("| `bubbles` | scope=device |"))
    assert len(row.split("|")[4].split(" / ")) == 2  # a before and an after time on the ×1 tile


def test_bench_report(tmp_path):
    out = bench("bench_report.py", SMALL, "--runs", "2", "--ranks", "2", "--scratch", tmp_path / "r",
                tmp_path=tmp_path)
    assert "| (b) report over 2 runs × 2 ranks |" in out


def test_bench_cli(tmp_path):
    out = bench("bench_cli.py", SMALL, "--repeat", "1", "--scratch", tmp_path / "c", tmp_path=tmp_path)
    assert "| `--help` |" in out and "| `query overlap RUN` |" in out and "| `python -c pass` |" in out


def test_tile_trace(tmp_path):
    out = bench("tile_trace.py", SMALL, tmp_path / "tiled.json", "--min-bytes", "2e5", tmp_path=tmp_path)
    assert "copies of" in out and (tmp_path / "tiled.json").stat().st_size >= 2e5


def test_tile_trace_renumbers_steps(tmp_path):
    """Each copy's steps are steps of their own (one longer recording), each with its own device window."""
    import gzip

    import tracesql

    source = REPO / "datasets" / "hta_trace_filter" / "sampled_rank-0.json.gz"  # ProfilerStep#551, #552
    size = len(gzip.decompress(source.read_bytes()))
    bench("tile_trace.py", source, tmp_path / "tiled.json", "--min-bytes", str(2.5 * size), tmp_path=tmp_path)
    tracesql.ingest([tmp_path / "tiled.json"], tmp_path / "run")
    steps = tracesql.connect(tmp_path / "run").execute(
        "SELECT list(step ORDER BY step), count(DISTINCT device_ts) FROM steps").fetchall()
    assert steps == [([551, 552, 1104, 1105, 1657, 1658], 6)]


def test_compare_outputs(tmp_path):
    """One snapshot, diffed with itself (nothing differs) and with a copy that lost a table's row and a query's
    file (both found)."""
    import shutil

    import duckdb

    a, b = tmp_path / "a", tmp_path / "b"
    bench("compare_outputs.py", "snapshot", a, "--only", "nodejs_async", tmp_path=tmp_path)
    out = bench("compare_outputs.py", "diff", a, a, tmp_path=tmp_path)
    assert " 0 differ; 0 new, 0 gone" in out and not out.strip().startswith("0 files")
    shutil.copytree(a, b)
    table = b / "tables" / "datasets_nodejs_async" / "slices.parquet"
    con = duckdb.connect()
    [(rows,)] = con.execute(f"SELECT count(*) FROM '{table}'").fetchall()
    con.execute(f"COPY (SELECT * FROM '{a / table.relative_to(b)}' LIMIT {rows - 1}) TO '{table}' (FORMAT parquet)")
    (b / "queries" / "datasets_nodejs_async" / "overlap.parquet").unlink()
    out = bench("compare_outputs.py", "diff", a, b, tmp_path=tmp_path, status=1)
    assert f"~ tables/datasets_nodejs_async/slices.parquet: {rows} -> {rows - 1} rows, 1 only before, 0 only " \
           "after" in out and "- queries/datasets_nodejs_async/overlap.parquet: only before" in out
    assert " 2 differ; 0 new, 1 gone" in out


TARGET_ROWS = [
    "Kineto medium ingest: time", "Kineto medium ingest: against HTA", "Kineto medium ingest: CPU",
    "Kineto medium ingest: memory", "Kineto 1 GB tile: CPU", "Kineto 1 GB tile: against HTA",
    "Kineto 1 GB tile: both cores", "nsys reader: CPU", "rocprof reader: CPU", "perfetto reader: CPU",
    "xplane reader: CPU", "ascend reader: CPU", "Queries at 2× (graph_execution): slowest",
    "Queries at 2× (graph_execution): over 1 s", "Queries 1×→2× (graph_execution): slope",
    "`critical_path` one step at 2× (graph_execution)", "`what_if` one step at 2× (graph_execution)",
    "`bound` one step at 2× (graph_execution)", "`tracesql findings` at 2× (graph_execution)",
    "CLI: `tracesql --help`", "CLI: `tracesql query overlap RUN`", "Report over 2 runs × 2 ranks",
]


def _number(cell: str) -> float:
    return float(cell.split()[-2 if cell.endswith(" s") else -1].replace(",", ""))


def test_targets_smoke(tmp_path):
    """targets.py runs every section on tiny inputs and prints one row per target of issue 15: a tracesql number, a
    baseline measured in the same run, a positive ratio where the target is one, and met? as the numbers say."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_queries import variants
    from targets import ONE_STEP, SMOKE_QUERIES

    from tracesql import queries

    out = bench("targets.py", "--smoke", "--work-dir", tmp_path / "w", "--markdown", tmp_path / "t.md",
                tmp_path=tmp_path)
    written = (tmp_path / "t.md").read_text()
    assert written.strip() in out
    lines = [line for line in written.splitlines() if line.startswith("| ") and not line.startswith("| target |")]
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("| ").split(" | ")] for line in lines)}
    assert list(rows) == TARGET_ROWS
    for name, (measured, ours, base, ratio, goal, met) in rows.items():
        assert measured and goal and met in ("yes", "**no**", "–"), name
        if "against HTA" in name:  # not installed here (CI), or measured; at 1 GB only with --hta-1gb
            assert base in ("HolisticTraceAnalysis not installed", "not run (--hta-1gb)") or _number(base) > 0, name
            assert (met == "–") == (ratio == "–"), name
            continue
        if "over 1 s" in name:  # every variant of the queries with issue 24's target (not the critical-path family)
            total = sum(len(variants(q)) for q in queries.catalogue() if q.name in SMOKE_QUERIES
                        and q.name not in ONE_STEP)
            assert total >= 4 and ours.endswith(f" of {total}") and int(ours.split()[0]) <= total
            assert met == ("yes" if ours.startswith("0 ") else "**no**")
            continue
        if "one step" in name or "findings" in name:  # issue 27's: a fresh process's wall s, its own target
            limit = float(goal.split("≤ ")[1].split()[0])
            assert _number(ours) > 0 and "CPU-s" in measured and met == ("yes" if _number(ours) <= limit else "**no**")
            # the one step's every-step CPU-s beside it (the family is in the smoke's catalogue); none for findings
            assert (base == "–") == ("findings" in name) and ("every step (" in measured) == ("one step" in name), name
            continue
        if "slope" in name:  # a slope may be ~0 or below on tiny tiles; it must be a number, and met must agree
            assert met == ("yes" if float(ours) <= 1.1 else "**no**")
            continue
        assert _number(ours) > 0 and _number(base) > 0 and float(ratio) > 0, name
    time_ratio = float(rows["Kineto medium ingest: time"][3])
    assert rows["Kineto medium ingest: time"][5] == ("yes" if time_ratio <= 3 else "**no**")
    assert rows["CLI: `tracesql --help`"][5] == ("yes" if _number(rows["CLI: `tracesql --help`"][1]) <= 0.15
                                                   else "**no**")


def test_targets_refuses_an_unknown_section(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "targets.py"), "--only", "ingest,speed"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "unknown section(s) speed" in done.stderr


@pytest.mark.slow
def test_bench_mcp(tmp_path):
    pytest.importorskip("mcp")
    out = bench("bench_mcp.py", "--repeat", "1", tmp_path=tmp_path)
    assert "| initialize |" in out and "| run_sql |" in out


def test_bench_archive(tmp_path):
    out = bench("bench_archive.py", "--members", "4", "--jobs", "1", "--scratch", tmp_path / "a", "--stages",
                tmp_path=tmp_path)
    assert "| 4 | 1 |" in out and "| 16 | (60 s for 5,000) |" in out  # 4 events a member, each a slice
    assert "| read (Kineto reader) |" in out and "DuckDB statements a member" in out


def test_bench_archive_merged(tmp_path):
    import tracesql

    out = bench("bench_archive.py", "--members", "3", "--merged", "--scratch", tmp_path / "m", tmp_path=tmp_path)
    assert "| 12 | (merged: the floor) |" in out  # the 3 members' 4 events each, in one trace
    run = tracesql.connect(tmp_path / "m" / "run")  # one rank; each member's two processes kept apart
    assert run.execute("SELECT count(DISTINCT rank), count(DISTINCT pid) FROM slices").fetchone() == (1, 6)


def test_bench_file_check(tmp_path):
    import tracesql

    tracesql.ingest([SMALL], tmp_path / "run")
    out = bench("bench_file_check.py", tmp_path / "run", "--only", "^(steps|hotspots)$", "--repeat", "1",
                tmp_path=tmp_path)
    assert "| `hotspots` |" in out and "| `steps` |" in out and "\nXXH3-128: " in out and "\nSHA-256: " in out
