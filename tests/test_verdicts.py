"""Issue 30, CI verdicts you can trust, on real runs: run labels (the runs table), steady-state steps (--steps),
noise-aware gates and their baselines, sweeps, history, and the proof: a fleet made from a bundled run by
warping its timeline per step, where the noise-aware gate raises no false alarm and catches both planted
regressions."""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
import sys
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner

import tracesql
from conftest import DATASETS, raw_events
from tracesql import steady
from tracesql.cli import main
from tracesql.errors import TraceError

REPO = Path(__file__).resolve().parent.parent
GLOO2, GLOO4 = DATASETS / "torch_gloo_2rank", DATASETS / "torch_gloo_4rank_straggler"
sys.path.insert(0, str(REPO / "benchmarks"))


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def run_labels(run: Path) -> tuple[dict, dict]:
    con = tracesql.connect(run)
    text, sources = con.sql("SELECT CAST(labels AS VARCHAR), CAST(label_sources AS VARCHAR) FROM runs").fetchall()[0]
    con.close()
    return json.loads(text), json.loads(sources)


def relabeled(ingested, source: Path, tmp_path: Path, *options) -> Path:
    """A copy of the session's ingest of `source`, ingested again with label options: only the labels change
    (no file is read again)."""
    run = tmp_path / source.name
    shutil.copytree(ingested(source), run)
    result = tracesql.ingest([source], run, label=options)
    assert result.ingested == [] and result.relabeled
    return run


# ---------------------------------------------------------------- labels


def test_recorded_labels_match_the_traces_distributed_info(ingested):
    found, sources = run_labels(ingested(GLOO4))
    info = json.loads(gzip.decompress((GLOO4 / "rank-0.pt.trace.json.gz").read_bytes()))["distributedInfo"]
    assert found == {"world_size": str(info["world_size"]), "backend": info["backend"],
                     "pg_layout": f"default_pg:{info['world_size']}"} == {"world_size": "4", "backend": "gloo",
                                                                          "pg_layout": "default_pg:4"}
    assert set(sources.values()) == {"trace"}


def test_xplane_metadata_gives_framework_versions(ingested):
    found, _ = run_labels(ingested(DATASETS / "jax_cpu_8dev_ffn"))
    assert found["jax_version"] == found["jaxlib_version"] == "0.10.2" and found["world_size"] == "1"


@pytest.mark.slow
def test_given_labels_from_file_folder_pattern_and_option_override_in_order(tmp_path):
    src = tmp_path / "sweep" / "dp4-remat_full"
    shutil.copytree(DATASETS / "viztracer_counters", src)
    (src / "tracesql.toml").write_text('[labels]\nmodel = "mlp"\nremat = "none"\nbatch = 8\n')
    run = tmp_path / "run"
    tracesql.ingest([src], run, label=["model=gpt", "seed=3"], label_pattern=r"dp(?P<dp>\d+)-remat_(?P<remat>\w+)")
    found, sources = run_labels(run)
    given = {k: v for k, v in found.items() if sources[k] != "trace"}
    assert given == {"batch": "8", "dp": "4", "model": "gpt", "remat": "full", "seed": "3"}
    assert {k: sources[k] for k in given} == {"batch": "file", "dp": "folder", "model": "option", "remat": "folder",
                                              "seed": "option"}
    # SQL reads them like any column
    (tmp_path / "q.sql").write_text("SELECT labels->>'dp' AS dp, labels->>'remat' AS remat FROM runs")
    out = cli("query", tmp_path / "q.sql", run, "-f", "csv")
    assert out.exit_code == 0 and out.output.splitlines() == ["dp,remat", "4,full"]


@pytest.mark.parametrize("make, message", [
    (lambda d: cli("ingest", d, "-o", d.parent / "r", "--label", "no-equals"),
     "--label 'no-equals': expected KEY=VALUE"),
    (lambda d: (d / "labels.json").write_text("[1, 2]") and cli("ingest", d, "-o", d.parent / "r"),
     "labels.json: expected key = value pairs"),
    (lambda d: (d / "tracesql.toml").write_text("a = ") and cli("ingest", d, "-o", d.parent / "r"),
     "tracesql.toml: cannot read its labels"),
    (lambda d: cli("ingest", d, "-o", d.parent / "r", "--label-pattern", "dp\\d+"), "has no named group"),
])
def test_bad_labels_are_one_line_errors_before_anything_is_read(tmp_path, make, message):
    src = tmp_path / "src"
    shutil.copytree(DATASETS / "viztracer_counters", src)
    result = make(src)
    assert result.exit_code == 1 and message in result.output and len(result.output.splitlines()) == 1
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- steady-state steps


def test_query_steps_restricts_every_step_table(ingested):
    run = ingested(GLOO2)
    whole = cli("query", "steps", run, "-f", "json")
    some = cli("query", "steps", run, "-f", "json", "--steps", "3..4")
    assert sorted({r["step"] for r in json.loads(whole.output)}) == [2, 3, 4]
    assert sorted({r["step"] for r in json.loads(some.output)}) == [3, 4]
    con = tracesql.connect(run)
    kept = steady.steady(steady.step_times(tracesql.queries.run(con, tracesql.queries.find("steps")).df()),
                         steady.parse("3..4"))[0]
    steady.restrict(con, kept)
    for table in steady.STEP_TABLES:
        n, expected = (con.sql(f"SELECT count(*) FROM {t}").fetchall()[0][0] for t in
                       (table, f"(SELECT * FROM {table}_all_steps WHERE step IN (3, 4))"))
        assert n == expected, table
    assert con.sql("SELECT count(*) FROM slices").fetchall()[0][0] < con.sql(
        "SELECT count(*) FROM slices_all_steps").fetchall()[0][0]


@pytest.mark.parametrize("text, message", [("9..3", "the first step (9) is after the last (3)"),
                                           ("three", "expected FIRST..LAST (e.g. 3..9, 3.., ..9), auto or all")])
def test_bad_steps_are_refused(text, message):
    with pytest.raises(TraceError) as e:
        steady.parse(text)
    assert str(e.value) == f"--steps {text!r}: {message}"


def test_warmup_rule_on_a_real_run(ingested):
    """jax_cpu_8dev_ffn's first step compiles: auto drops it, by the documented rule computed here by hand."""
    con = tracesql.connect(ingested(DATASETS / "jax_cpu_8dev_ffn"))
    times = steady.step_times(tracesql.queries.run(con, tracesql.queries.find("steps")).df())
    t = list(times.sort_values("step").step_ns)
    rest = t[1:]
    med = statistics.median(rest)
    spread = max(1.4826 * statistics.median(abs(x - med) for x in rest), 0.01 * med)
    assert t[0] > med + 3 * spread and steady.warmup(t) == 1
    _, used = steady.steady(times, steady.parse("auto"))
    assert used == {"jax_cpu_8dev_ffn": "auto: 1..2 (2 steps, warm-up 0 dropped)"}


# ---------------------------------------------------------------- report: labels, steps, sweeps, history


@pytest.fixture(scope="module")
def dp_runs(ingested, tmp_path_factory):
    """The bundled 2- and 4-rank gloo runs labelled as a data-parallel sweep (dp=2, dp=4)."""
    tmp = tmp_path_factory.mktemp("dp")
    (tmp / "a").mkdir(), (tmp / "b").mkdir()
    return relabeled(ingested, GLOO2, tmp / "a", "dp=2"), relabeled(ingested, GLOO4, tmp / "b", "dp=4")


@pytest.mark.slow
def test_report_shows_labels_steps_used_and_a_sweep(dp_runs, tmp_path):
    two, four = dp_runs
    result = cli("report", two, four, "-o", tmp_path / "r", "--steps", "3..4", "--history", tmp_path / "h")
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "r" / "metrics.json").read_text())
    runs = {r["run_id"]: r for r in data["runs"]}
    assert data["steps"] == "3..4" and {r["steps_used"] for r in runs.values()} == {"3..4 (2 steps)"}
    assert runs["torch_gloo_2rank"]["labels"]["dp"] == "2" and runs["torch_gloo_2rank"]["given"] == {"dp": "2"}
    # steps 3 and 4 only: the median of their slowest rank's host ranges, from the raw JSON
    per_step = {}
    for f in GLOO2.glob("*.json.gz"):
        for e in raw_events(f):
            if e.get("name") in ("ProfilerStep#3", "ProfilerStep#4"):
                per_step[e["name"]] = max(per_step.get(e["name"], 0), e["dur"] * 1000)
    assert runs["torch_gloo_2rank"]["step_time_p50"] == pytest.approx(statistics.median(per_step.values()), abs=1)
    sweep = {r["dp"]: r for r in data["sweep"]}
    assert sweep["2"]["best"] and not sweep["4"]["best"] and sweep["2"]["runs"] == 1
    assert sweep["2"]["step_time_p50"] == runs["torch_gloo_2rank"]["step_time_p50"]
    summary = (tmp_path / "r" / "summary.md").read_text()
    assert "| dp | runs | step time | MFU | exposed comm | peak memory |" in summary
    assert f"| 2 | 1 | **{sweep['2']['step_time_p50'] / 1e6:.2f} ms** ★ |" in summary
    page = (tmp_path / "r" / "index.html").read_text()
    assert '<section id="sweep">' in page and "3..4 (2 steps)" in page and '<th class="tag">dp</th>' in page
    # the history keeps the report's metrics as plain Parquet
    rows = duckdb.sql(f"SELECT run_id, value FROM '{tmp_path / 'h'}/*.parquet' WHERE metric = 'step_time_p50' "
                      "ORDER BY run_id").fetchall()
    assert rows == [(r, runs[r]["step_time_p50"]) for r in sorted(runs)]


@pytest.mark.slow
def test_history_brings_earlier_runs_into_the_trends(dp_runs, tmp_path):
    from tracesql import report

    two, four = dp_runs
    report.build([two], history=tmp_path / "h").write(tmp_path / "r1")
    later = report.build([four], history=tmp_path / "h")
    assert list(later.earlier.run_id) == ["torch_gloo_2rank"]
    trend = next(fig for section, name, fig in later.charts if name == "step_time_p50")
    assert sorted(trend["data"][0]["x"]) == ["torch_gloo_2rank", "torch_gloo_4rank_straggler"]
    colors = dict(zip(trend["data"][0]["x"], trend["data"][0]["marker"]["color"]))
    assert colors["torch_gloo_2rank"] == "#BAB0AC"  # an earlier report's run: grey


@pytest.mark.slow
def test_gate_without_a_run_sharing_the_labels_fails_and_says_why(dp_runs, tmp_path):
    two, four = dp_runs
    result = cli("report", two, four, "-o", tmp_path / "r", "--order", "given", "--fail-on", "step_time_p50>+5%")
    assert result.exit_code == 3
    assert "FAIL step_time_p50>+5%: torch_gloo_4rank_straggler: no baseline: no other run has its labels " \
           "{'dp': '4'}" in result.output
    ok = cli("report", two, four, "-o", tmp_path / "r", "--order", "given", "--baseline", "dp=2",
             "--fail-on", "step_time_p50>+5%")
    assert ok.exit_code == 3 and "vs 27.89 ms in baseline torch_gloo_2rank (+151.2%)" in ok.output


# ---------------------------------------------------------------- the proof: a fleet with noise


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """bench_gates' fleet at CI size: 10 replicates of the bundled gloo run tiled to 12 steps, each step's
    timeline stretched by 1–2 % noise, and the two planted regressions (+3 %, +10 %)."""
    import bench_gates

    scratch = tmp_path_factory.mktemp("gates")
    out = scratch / "result.json"
    assert bench_gates.main(["--replicates", "10", "--scratch", str(scratch), "--json", str(out)]) == 0
    return scratch / "fleet-10-4-0", json.loads(out.read_text())


@pytest.mark.slow
def test_noise_aware_gate_raises_no_false_alarm_and_catches_both_regressions(fleet):
    _, result = fleet
    assert result["steps_per_run"] == 12
    aware, threshold = result["noise_aware"], result["threshold_only"]
    assert aware["false_alarms"] <= 1 and aware["caught"] == {"reg-3pct": True, "reg-10pct": True}
    assert threshold["caught"] == {"reg-3pct": True, "reg-10pct": True}
    assert aware["false_alarms"] <= threshold["false_alarms"]
    assert "significant at 99 %" in aware["reasons"]["reg-3pct"]


@pytest.mark.slow
def test_report_gate_within_noise_passes_and_says_so_strict_fails(fleet):
    folder, _ = fleet
    reps = sorted(folder.glob("rep-*"))[:5]  # 5 of the 10: a report over fewer runs is quicker
    # any replicate is within 5 % below or above the others: the threshold holds, the noise does not let it trip
    result = cli("report", *reps, "-o", folder.parent / "r", "--order", "given", "--fail-on", "step_time_p50>-5%")
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.output.splitlines() if x.startswith("WITHIN NOISE")]
    assert "4 replicate runs" in line and "within noise at 99 %" in line
    assert "passes (the change is within noise" in line
    strict = cli("report", *reps, "-o", folder.parent / "r", "--order", "given", "--fail-on", "step_time_p50>-5%",
                 "--strict")
    assert strict.exit_code == 3
    regressed = cli("report", *reps, folder / "reg-10pct", "-o", folder.parent / "r", "--order", "given",
                    "--baseline", "config=gloo2", "--fail-on", "step_time_p50>+5%")
    assert regressed.exit_code == 3 and "significant at 99 %" in regressed.output


@pytest.mark.browser
def test_sweep_chart_renders_in_headless_chromium(dp_runs, tmp_path):
    from test_report import CHROMIUM, open_in_browser

    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    two, four = dp_runs
    assert cli("report", two, four, "-o", tmp_path / "r", "--steps", "3..4").exit_code == 0
    seen = open_in_browser(tmp_path / "r" / "index.html", tmp_path / "sweep.png")
    assert seen["charts"] == seen["rendered"] and seen["console"] == [] and seen["dialogs"] == []
    assert "Sweep: runs by configuration" in seen["text"] and "ridge" not in seen["chart_text"]
    assert "dp=2" in seen["chart_text"] and "dp=4" in seen["chart_text"]  # the sweep chart's points, labelled
    assert all(url.startswith("file:") for url in seen["requests"])


@pytest.mark.slow
def test_roofline_draws_each_roof_and_its_ridge_point(ingested):
    """B200 bf16: 2,250 TFLOP/s dense over 8 TB/s puts the ridge at 281.25 FLOP/byte, from the peaks table."""
    from tracesql import report

    run = ingested(DATASETS / "tracelens_b200_eager")
    fig = next(f for _, name, f in report.build([run]).charts if name == "roofline")
    con = tracesql.connect(run)
    peaks = {d: (f, b) for d, f, b in con.sql(
        "SELECT DISTINCT dtype, peak_flops_per_s, peak_bytes_per_s FROM rank_device_peaks(device_key := NULL) "
        "WHERE peak_flops_per_s IS NOT NULL").fetchall()}
    ridges = {t["name"].split()[1]: (t["x"][0], t["y"][0]) for t in fig["data"] if t["name"].endswith("ridge point")}
    assert ridges and ridges["bf16"] == (281.25, 2250.0)
    for dtype, (x, y) in ridges.items():
        flops, bandwidth = peaks[dtype]
        assert x == pytest.approx(flops / bandwidth) and y == pytest.approx(flops / 1e12)
