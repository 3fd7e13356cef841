"""The JSON that `-f json` writes, as JSON Schema (draft 2020-12), for programs that read it.

Made from what defines each shape, so that it cannot drift from the output: a curated query's result is its
header's `Columns:` (names, SQL types, meanings: `query NAME -f json` and `diff -f json`), `info -f json` is
`info.as_json` over the `ranks` and `warnings` tables. Each schema's `$id` names the tracesql version
(`urn:tracesql:0.1.0:query:overlap`): a shape changes only with a new version. The reference page
(docs/gen/reference.py, "JSON output") prints them; tests/test_json_schemas.py validates real outputs against them.
"""

from __future__ import annotations

from . import queries, schema
from .version import __version__

DIALECT = "https://json-schema.org/draft/2020-12/schema"
_SCALARS = {"BIGINT": "integer", "INTEGER": "integer", "SMALLINT": "integer", "TINYINT": "integer",
            "HUGEINT": "integer", "UBIGINT": "integer", "UINTEGER": "integer", "DOUBLE": "number",
            "FLOAT": "number", "REAL": "number", "DECIMAL": "number", "BOOLEAN": "boolean", "VARCHAR": "string",
            "JSON": "string", "TIMESTAMP": "string", "DATE": "string"}
#: `info -f json`'s source and warning fields: (field, table, column)
_SOURCE = [("source_path", "ranks", "source_path"), ("rank", "ranks", "rank"), ("format", "ranks", "source_format"),
           ("bytes", "ranks", "source_bytes"), ("events", "ranks", "event_count"),
           ("skipped", "ranks", "skipped_count")]
_WARNING = [(c, "warnings", c) for c in ("rank", "source_path", "check_name", "event_count", "example", "message")]


def value(sql_type: str, doc: str | None = None) -> dict:
    """The JSON Schema of a value of a DuckDB type as `-f json` writes it: NULL (and NaN) as null, lists as
    arrays."""
    if sql_type.endswith("[]"):
        found = {"type": ["array", "null"], "items": value(sql_type[:-2])}
    else:
        kind = _SCALARS.get(sql_type.split("(")[0].upper())
        found = {"type": [kind, "null"]} if kind else {}
    return found | ({"description": doc} if doc else {})


def _id(name: str) -> str:
    return f"urn:tracesql:{__version__}:{name}"


def rows(name: str, title: str, columns: list[tuple[str, str, str]] | None) -> dict:
    """An array of one object per row; with `columns` (name, SQL type, meaning), exactly those properties."""
    row: dict = {"type": "object"}
    if columns is not None:
        row |= {"properties": {c: value(t, doc) for c, t, doc in columns}, "required": [c for c, _, _ in columns],
                "additionalProperties": False}
    return {"$schema": DIALECT, "$id": _id(name), "title": title, "type": "array", "items": row}


def query(q: queries.Query) -> dict:
    """`tracesql query NAME -f json` for a curated query (its declared columns)."""
    return rows(f"query:{q.name}", f"tracesql query {q.name} -f json: {q.title}", q.columns)


def own_sql() -> dict:
    """`tracesql query my.sql -f json`: one object per row, the columns your SQL makes."""
    return rows("query", "tracesql query FILE.sql -f json: one object per row, keyed by column name", None)


def diff() -> dict:
    q = queries.find("diff")
    return rows("diff", f"tracesql diff -f json: {q.title}", q.columns)


def findings() -> dict:
    """`tracesql findings RUN -f json`: one object per finding, largest saving first (tracesql/findings.py)."""
    from . import findings as rules

    return rows("findings", "tracesql findings RUN -f json: what limits each step and what fixing it would save",
                list(rules.FINDING_COLUMNS))


def _fields(fields) -> dict:
    columns = {(t, c.name): c for t in ("ranks", "warnings") for c in schema.TABLES[t].columns}
    return {"type": "object", "additionalProperties": False, "required": [f for f, _, _ in fields],
            "properties": {f: value(columns[t, c].type, columns[t, c].doc) for f, t, c in fields}}


def info() -> dict:
    """`tracesql info RUN -f json` (also the MCP tool describe_run's core)."""
    string, integer = {"type": "string"}, {"type": "integer"}
    return {
        "$schema": DIALECT, "$id": _id("info"), "title": "tracesql info RUN -f json: what a run holds",
        "type": "object", "additionalProperties": False,
        "required": ["run", "run_id", "schema_version", "tracesql_version", "note", "start_ns", "end_ns", "rows",
                     "sources", "warnings"],
        "properties": {
            "run": string | {"description": "the run folder, as given"},
            "run_id": string,
            "schema_version": integer | {"description": "the schema version the run was written with"},
            "tracesql_version": {"type": ["string", "null"], "description": "the tracesql that wrote it"},
            "note": {"type": ["string", "null"], "description": "how a run of an older schema version is read"},
            "start_ns": {"type": ["integer", "null"], "description": "first trace start, ns on the trace's clock"},
            "end_ns": {"type": ["integer", "null"], "description": "last trace end, ns on the trace's clock"},
            "rows": {"type": "object", "description": "rows per table", "additionalProperties": False,
                     "required": list(schema.TABLES), "properties": {t: integer for t in schema.TABLES}},
            "sources": {"type": "array", "description": "one per trace file (the ranks table)",
                        "items": _fields(_SOURCE)},
            "warnings": {"type": "array", "description": "data-quality warnings found at ingest (the warnings "
                                                         "table)", "items": _fields(_WARNING)},
        },
    }


def commands() -> dict[str, dict]:
    """Every command's `-f json` shape: command line -> JSON Schema."""
    return {"tracesql info RUN": info(), "tracesql diff BEFORE AFTER": diff(), "tracesql findings RUN": findings(),
            "tracesql query FILE.sql TARGET": own_sql(),
            **{f"tracesql query {q.name} TARGET": query(q) for q in queries.catalogue()}}
