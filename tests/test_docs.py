"""The documentation stays true: the README is a landing page that names every curated query and command, the site
builds in strict mode with no warning, every query, table, function and command has its generated page, and the
examples in the README and the pages are today's output (docs/gen/examples.py)."""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, session_root
from tracesql import functions, queries, schema
from tracesql.cli import main

sys.path.insert(0, str(REPO / "docs" / "gen"))
import examples  # noqa: E402
import reference  # noqa: E402

README = (REPO / "README.md").read_text()


def test_readme_lists_every_curated_query_and_command():
    for q in queries.catalogue():
        assert f"| `{q.name}` |" in README, q.name
    for name in main.commands:
        assert f"`tracesql {name}" in README, name


def test_readme_is_a_landing_page():
    assert len(README.encode()) <= 15 * 1024, f"README.md is {len(README.encode()):,} bytes (at most 15 KiB)"
    # its links into the docs and the repository lead somewhere
    for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", README):
        if re.match(r"^[a-z]+://", target):
            continue
        assert (REPO / target).exists(), f"README links to {target}, which does not exist"


def test_readme_commands_are_the_ci_commands():
    """The README's install and test commands are what .ci/run runs: the fast suite is `pytest`, the whole suite
    (what CI runs) `pytest -m ""`."""
    ci = (REPO / ".ci" / "run").read_text()
    assert 'pip install ".[test]"' in README and '".[test]"' in ci
    assert re.search(r"^pytest\s*(#.*)?$", README, re.M)
    assert re.search(r'^pytest -m ""\s*(#.*)?$', README, re.M) and re.search(r'^pytest -m ""$', ci, re.M)


def test_readme_installs_light_and_says_what_runs_on_spark():
    """Issue 24: the README's only install line pulled Spark, Playwright and MkDocs (1.4 GB) to try the tool, and it
    said every command runs on Spark: the first install line is the light one, and the README names exactly the
    commands that take --engine."""
    install = README.split("## Install", 1)[1]
    assert re.search(r"```bash\n(.*?)\n", install)[1].split("#")[0].strip() == "pip install ."
    engines = sorted(name for name, c in main.commands.items() if any(p.name == "engine" for p in c.params))
    said = " ".join(README.split())
    assert engines == ["ingest", "query"] and "`ingest` and `query` also run on Spark (`--engine spark`" in said
    assert "Every command also runs on Spark" not in said and "CI runs exactly this" not in said


def test_readme_tour_outputs_are_ignored_by_git():
    """Issue 24: the tour writes runs/ and report/ in the checkout; neither shows up in `git status`."""
    ignored = (REPO / ".gitignore").read_text().split()
    written = set(re.findall(r"<!-- example: tracesql \w+ .*?-o (\w+)", README))
    assert written == {"runs", "report"} and all(f"/{folder}/" in ignored for folder in written)


def test_spark_guide_shows_what_the_duckdb_path_prints():
    """Issue 24: the Spark guide's "byte for byte" table had another alignment row than the command prints. Its
    table is the DuckDB path's output, byte for byte (tests/test_spark.py holds Spark's equality with it)."""
    from click.testing import CliRunner

    page = (REPO / "docs" / "guides" / "spark.md").read_text()
    cmd = "tracesql query collective_stragglers datasets/torch_gloo_4rank_straggler/ --engine spark -f markdown"
    shown = page.split(f"$ {cmd}\n```\n\n", 1)[1].split("\n\n", 1)[0] + "\n"
    argv = cmd.split()[1:cmd.split().index("--engine")] + ["-f", "markdown"]
    argv[2] = str(REPO / argv[2])
    printed = CliRunner().invoke(main, argv).stdout
    assert shown == printed


def test_every_query_has_a_docs_example():
    """A new curated query gets an example on a bundled dataset in docs/gen/reference.py (its page shows it)."""
    assert reference.missing_examples() == [], "add them to EXAMPLES in docs/gen/reference.py"
    assert reference.stale_examples() == []


def test_function_reference_finds_every_macro():
    sql = "\n".join(text for _, text in functions.sql_files())
    declared = set(re.findall(r"^CREATE (?:OR REPLACE )?MACRO (\w+)", sql, re.M))
    parsed = {name for _, text in functions.sql_files() for name, *_ in reference.macros(text)[1]}
    assert declared and parsed == declared


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The site, built once per session as CI builds it: `python docs/gen/build.py` (Zensical, strict)."""
    pytest.importorskip("zensical", reason="zensical is in the test extra: pip install '.[test]'")
    out = tmp_path_factory.mktemp("site") / "site"
    # the raw-trace cache the other tests use (conftest._private_cache): datasets are ingested once per session
    env = {**os.environ, "TRACESQL_CACHE": str(session_root(tmp_path_factory) / "cache"),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(REPO / "docs" / "gen" / "build.py"), "--site-dir", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    return proc, out


#: the tests that read the built site, kept on one xdist worker: each worker would build it again (18 s)
on_the_site_worker = pytest.mark.xdist_group("docs-site")


@pytest.mark.docs
@on_the_site_worker
def test_site_builds_in_strict_mode_without_warnings(site):
    """Strict: a broken link or a missing example fails the build. Issue 24: MkDocs-Material printed an end-of-life
    banner on every build; Zensical, its maintained successor, builds the same configuration."""
    proc, out = site
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    printed = proc.stdout + proc.stderr
    assert "No issues found" in printed
    assert not [line for line in printed.splitlines() if re.search(r"warning|end of life|end-of-life", line, re.I)]
    assert (out / "index.html").is_file()


def test_links_to_pages_not_written_yet_become_their_label():
    import build

    text = "See [the guide](../guides/later.md#x), [runs](runs.md) and ![a picture](../guides/later.md)."
    assert build.unlink_absent(text, "concepts/units.md", {"guides/later.md"}) == (
        "See the guide, [runs](runs.md) and ![a picture](../guides/later.md).")


@pytest.mark.docs
@on_the_site_worker
def test_site_fetches_nothing_from_the_network(site):
    """Issue 24: the theme fetched web fonts (8 console errors offline, a slow first paint): the pages load no
    stylesheet, font or script from another host."""
    _, out = site
    pages = list(out.rglob("*.html"))
    remote = re.compile(r'<(?:link|script)\b[^>]*\b(?:href|src)="(?:https?:)?//', re.I)
    assert len(pages) > 30 and not [p for p in pages if remote.search(p.read_text())]


def _page(out, rel: str) -> str:
    path = out / rel / "index.html"
    assert path.is_file(), f"no page {rel}"
    return path.read_text()


@pytest.mark.docs
@on_the_site_worker
def test_every_query_has_a_page_with_real_output(site):
    _, out = site
    index = _page(out, "reference/queries")
    for q in queries.catalogue():
        page = _page(out, f"reference/queries/{q.name}")
        assert f'href="{q.name}/"' in index, q.name
        example = page.split('id="example"', 1)[1].split('id="run-it"', 1)[0]
        assert "<table>" in example and "Error:" not in example, f"{q.name}: no result in its example"
        for name, _, _ in q.columns:
            assert f"<code>{name}</code>" in page, (q.name, name)


@pytest.mark.docs
@on_the_site_worker
def test_every_table_function_and_command_has_its_reference(site):
    _, out = site
    tables = _page(out, "reference/tables")
    for t in schema.TABLES.values():
        assert f'id="{t.name}"' in tables, t.name
        for c in t.columns:
            assert f"<code>{c.name}</code>" in tables, (t.name, c.name)
    funcs = _page(out, "reference/functions")
    for _, text in functions.sql_files():
        for name, *_ in reference.macros(text)[1]:
            assert f'id="{name}"' in funcs, name
    cli = _page(out, "reference/cli")
    for name in main.commands:
        assert f'id="tracesql-{name}"' in cli, name
    assert "torch_gloo_4rank_straggler" in _page(out, "reference/datasets")


PAGES = [p for p in examples.pages() if examples.regions(p.read_text())]


@pytest.mark.docs  # runs every example command of the README and the pages
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_examples_show_todays_output(page):
    """Each example region holds what its command prints today; `python docs/gen/examples.py PAGE` refreshes."""
    _, changed = examples.refresh_text(page.read_text())
    assert not changed, (f"{page.relative_to(REPO)}: examples changed, run python docs/gen/examples.py "
                         f"{page.relative_to(REPO)}: " + "; ".join(r.cmd for r, _ in changed))


def test_query_pages_python_calls_are_valid():
    """The Python call a query page shows (its example's arguments as keyword arguments) names real targets and
    parameters with allowed values (the page's CLI example runs the same arguments)."""
    import ast

    for name, example in reference.EXAMPLES.items():
        targets, params = reference.python_call(example)
        kwargs = {k: ast.literal_eval(reference._py(v)) for k, v in params.items()}
        assert queries.check(queries.find(name), kwargs) == kwargs, name
        assert targets and all((REPO / t).exists() for t in targets), (name, targets)


def test_no_merge_conflict_markers():
    """A merge that kept `<<<<<<<` / `>>>>>>>` lines (it happened twice in one session) fails here, not on a reader."""
    marker = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)
    found = []
    for ext in ("md", "py", "sql", "yml", "toml", "csv", "j2", "json"):
        for path in REPO.rglob(f"*.{ext}"):
            rel = path.relative_to(REPO)
            if rel.parts[0] in (".git", "site", "build", "dist", ".venv") or path.stat().st_size > 2_000_000:
                continue
            if marker.search(path.read_text(errors="replace")):
                found.append(str(rel))
    assert not found, f"merge conflict markers in {found}"
