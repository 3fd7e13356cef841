"""`tracesql info RUN`: what a run holds — its sources, ranks, formats, rows per table, time span, schema version
and the data-quality warnings found at ingest."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from . import engine, schema, store
from .errors import OlderSchemaWarning


@dataclass
class RunInfo:
    run: Path
    run_id: str
    schema_version: int
    tracesql_version: str | None
    note: str | None  # for a run of an older schema version: how it is read
    sources: list[dict] = field(default_factory=list)  # source_path, rank, format, bytes, events, skipped
    rows: dict[str, int] = field(default_factory=dict)
    start_ns: int | None = None
    end_ns: int | None = None
    warnings: list[dict] = field(default_factory=list)  # rank, source_path, check_name, event_count, example, message


def info(run) -> RunInfo:
    """The summary of one run folder.

    >>> tracesql.info.info("runs/1234").rows["slices"]        # doctest: +SKIP
    """
    run = Path(run)
    store.require_run(run)
    return engine.while_unchanged([run], lambda: _info(run))  # again if an ingest swaps the run in meanwhile


def _info(run: Path) -> RunInfo:
    manifest = store.load_manifest(run)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OlderSchemaWarning)  # said once, in `note`
        con = engine.connect(run, names=set(schema.TABLES))  # the tables; no function is used
    try:
        result = RunInfo(run=run, run_id=manifest.get("run_id"), schema_version=manifest["schema_version"],
                         tracesql_version=manifest.get("tracesql_version"), note=store.older_schema_note(manifest))
        cur = con.execute("SELECT source_path, rank, source_format, source_bytes, event_count, skipped_count "
                          "FROM ranks ORDER BY rank, source_path")
        keys = ("source_path", "rank", "format", "bytes", "events", "skipped")
        result.sources = [dict(zip(keys, row)) for row in cur.fetchall()]
        for name in schema.TABLES:
            result.rows[name] = con.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
        result.start_ns, result.end_ns = con.execute(
            "SELECT min(trace_start_ns), max(trace_end_ns) FROM ranks").fetchone()
        cur = con.execute("SELECT rank, source_path, check_name, event_count, example, message FROM warnings "
                          "ORDER BY rank, source_path, check_name")
        keys = ("rank", "source_path", "check_name", "event_count", "example", "message")
        result.warnings = [dict(zip(keys, row)) for row in cur.fetchall()]
    finally:
        con.close()
    return result


def as_json(i: RunInfo) -> dict:
    """The summary as plain JSON values (`tracesql info -f json`; its JSON Schema: docs, JSON output)."""
    return {"run": str(i.run), "run_id": i.run_id, "schema_version": i.schema_version,
            "tracesql_version": i.tracesql_version, "note": i.note, "start_ns": i.start_ns, "end_ns": i.end_ns,
            "rows": i.rows, "sources": i.sources, "warnings": i.warnings}
