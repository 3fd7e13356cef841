"""`-f json` keeps the shapes the docs publish (docs: JSON output): real outputs on bundled runs validate against
tracesql/json_schemas.py's schemas, which are strict (every declared column, nothing else)."""

from __future__ import annotations

import json
import shlex
import sys

import pytest
from click.testing import CliRunner

from conftest import DATASETS, REPO
from tracesql import json_schemas, queries
from tracesql.cli import main
from tracesql.version import __version__

jsonschema = pytest.importorskip("jsonschema")  # (installed with the [mcp] extra, which [test] includes)
sys.path.insert(0, str(REPO / "docs" / "gen"))
import reference  # noqa: E402  (the documented example of each query: a bundled dataset where it has rows)


def json_of(*args) -> object:
    done = CliRunner().invoke(main, [*map(str, args), "-f", "json"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def valid(instance, schema) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(instance)


def test_schemas_are_versioned_and_valid():
    found = json_schemas.commands()
    assert len(found) == len(queries.catalogue()) + 4
    for schema in found.values():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema["$id"].startswith(f"urn:tracesql:{__version__}:")


def test_info_json_matches_its_schema_and_the_run(ingested):
    run = ingested(DATASETS / "torch_gloo_4rank_straggler")
    found = json_of("info", run)
    valid(found, json_schemas.info())
    assert [s["rank"] for s in found["sources"]] == [0, 1, 2, 3] and found["rows"]["ranks"] == 4
    with pytest.raises(jsonschema.ValidationError):  # the schema is strict: a field it does not know fails
        valid(found | {"extra": 1}, json_schemas.info())


def test_diff_and_own_sql_json_match(ingested, tmp_path):
    before, after = ingested(DATASETS / "torch_gloo_2rank"), ingested(DATASETS / "torch_gloo_4rank_straggler")
    found = json_of("diff", before, after, "--top", "3")
    assert found and {r["level"] for r in found} == {"op"}  # gloo runs on the CPU: ops are compared, no kernels
    valid(found, json_schemas.diff())
    sql = tmp_path / "mine.sql"
    sql.write_text("SELECT rank, count(*) AS n FROM slices GROUP BY ALL ORDER BY ALL")
    valid(json_of("query", sql, before), json_schemas.own_sql())
    with pytest.raises(jsonschema.ValidationError):  # a row with a column the diff query does not declare
        valid([found[0] | {"surprise": 1}], json_schemas.diff())


@pytest.mark.slow
@pytest.mark.parametrize("name", [q.name for q in queries.catalogue() if q.name != "diff"])
def test_every_curated_query_json_matches_its_schema(name):
    """On the dataset its reference page shows (where it has rows)."""
    args = shlex.split(reference.EXAMPLES[name].command)
    found = json_of(*[REPO / a if a.startswith("datasets/") else a for a in args])
    assert found, name
    valid(found, json_schemas.query(queries.find(name)))
