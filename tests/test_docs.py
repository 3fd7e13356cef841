"""The README stays true: its schema section is the schema, and it names every curated query and command."""

from conftest import REPO
from tracesql import queries, schema
from tracesql.cli import main

README = (REPO / "README.md").read_text()


def test_readme_schema_section_is_generated_from_the_schema():
    section = README.split("<!-- schema:begin -->", 1)[1].split("<!-- schema:end -->", 1)[0]
    assert section.strip() == schema.markdown().strip()


def test_readme_lists_every_curated_query_and_command():
    for q in queries.catalogue():
        assert f"| `{q.name}` |" in README, q.name
    for name in main.commands:
        assert f"`tracesql {name}" in README, name
