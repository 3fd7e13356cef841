"""Shared fixtures: bundled datasets (always there) and the larger corpus (tests skip cleanly without it)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

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


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    """Raw-trace targets are ingested into a cache: keep it out of the user's home."""
    monkeypatch.setenv("TRACESQL_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def ingested(tmp_path_factory):
    """ingested(path) -> run folder of that trace file or folder, ingested once per test session."""
    runs: dict[str, Path] = {}

    def get(source: Path) -> Path:
        key = str(source)
        if key not in runs:
            out = tmp_path_factory.mktemp("runs") / source.name.split(".")[0]
            tracesql.ingest([source], out)
            runs[key] = out
        return runs[key]

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
