"""Shared fixtures: bundled datasets (always there) and the larger corpus (tests skip cleanly without it)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import pytest
from filelock import FileLock

import tracesql

REPO = Path(__file__).resolve().parent.parent
DATASETS = REPO / "datasets"
CORPUS = Path(os.environ.get("TRACESQL_CORPUS", REPO.parent / "shared" / "corpus"))
HTA_DATA = CORPUS / "hta" / "tests" / "data"


def corpus_path(*parts) -> Path:
    path = CORPUS.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"corpus not available: {path}")
    return path


def raw_events(path: Path) -> list[dict]:
    """The trace's events as plain json.loads sees them: the second method that numbers are checked against."""
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return json.loads(f.read())["traceEvents"]


def session_root(tmp_path_factory) -> Path:
    """A folder shared by the whole test session. Under pytest-xdist each worker has its own basetemp
    (`pytest-N/popen-gwK`); their parent is the session's, so what one worker ingests the others reuse."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def _test_environment(tmp_path_factory):
    """Raw-trace targets are ingested into a cache: keep it out of the user's home, one per test session (set for
    the whole session, so module fixtures use it too: the home cache may hold another tracesql's runs). Tables
    are laid out for the terminal's width: 120 columns (tracesql's default without a terminal) wherever the tests
    run, pytest-xdist's workers included (they report 80). An ingest reads its files one after another unless a
    test says otherwise (`jobs=2`, `-j 2`: tests/test_ingest.py checks that both ways give the same run): the
    test workers already keep the cores busy, and starting a process per core costs more than these small
    traces take to read (half of a bundled run's ingest)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRACESQL_CACHE", str(session_root(tmp_path_factory) / "cache"))
        patch.setenv("COLUMNS", "120")
        patch.setenv("TRACESQL_JOBS", "1")
        yield


@pytest.fixture(scope="session")
def ingested(tmp_path_factory):
    """ingested(path) -> run folder of that trace file or folder, ingested once per test session (across workers:
    the first worker to ask ingests it under a lock, the others wait and reuse it)."""
    root = session_root(tmp_path_factory) / "runs"
    root.mkdir(exist_ok=True)

    def get(source: Path) -> Path:
        key = hashlib.sha1(str(source).encode()).hexdigest()[:10]
        out = root / key / source.name.split(".")[0]
        with FileLock(root / f"{key}.lock"):
            if not (root / f"{key}.done").exists():
                tracesql.ingest([source], out)
                (root / f"{key}.done").touch()
        return out

    return get


def write_trace(path: Path, events: list[dict], gz: bool = False, **top) -> Path:
    """A small synthetic Kineto trace for edge cases (real traces cover the rest)."""
    data = json.dumps({"schemaVersion": 1, **top, "traceEvents": events}).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def empty_session():
    """A plain DuckDB session with tracesql's functions over empty tables: for calling the scalar macros."""
    import duckdb

    from tracesql import functions, schema

    con = duckdb.connect()
    for name, table in schema.TABLES.items():
        con.execute(f"CREATE TABLE {name} ({', '.join(f'{c.name} {c.type}' for c in table.columns)})")
    functions.install(con)
    return con


SLOW_GROUPS = ("spark", "browser", "concurrency", "benchmark", "docs")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """A test in a slow group is slow: `pytest` (-m "not slow") leaves the group out, `pytest -m ""` runs it.
    The tests that share a module-scoped fixture of their module (an ingested run, a report, open sessions) run on
    one pytest-xdist worker (an xdist_group per module and such fixtures, kept with --dist loadgroup): spread over
    both, each worker built the fixture again (a report took 12 s of each)."""
    for item in items:
        if any(item.get_closest_marker(group) for group in SLOW_GROUPS):
            item.add_marker(pytest.mark.slow)
        module = item.getparent(pytest.Module).nodeid
        shared = sorted(name for name, defs in item._fixtureinfo.name2fixturedefs.items()
                        if any(d.scope == "module" and d.baseid == module for d in defs))
        if shared and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(f"{module}:{','.join(shared)}"))
