"""slices.class (schema 9): each kernel's, copy's and memset's class by the default rules of kernel_classes, stored
at ingest, on every bundled trace equal to the rules applied by Python's `re` to the CSV (a second implementation of
the rule order); a run of an older schema, which lacks the column, is classified when read, so that
device_activity and the queries answer as on a current run."""

from __future__ import annotations

import csv
import json
import re

import duckdb
import pytest

import tracesql
from conftest import DATASETS
from tracesql import functions, queries
from tracesql.errors import OlderSchemaWarning

BUNDLED = sorted(p for p in DATASETS.iterdir() if p.is_dir() and p.name != "generators")
DEVICE_KINDS = ("kernel", "memcpy", "memset")


def python_class(kind: str, name: str, category: str | None) -> str | None:
    """The default scheme's class of a device event: the matching rule of lowest priority (re.search, as DuckDB's
    regexp_matches matches anywhere)."""
    with open(functions.HERE / "kernel_classes.csv", newline="") as f:
        rules = sorted((r for r in csv.DictReader(f) if r["scheme"] == "default"), key=lambda r: int(r["priority"]))
    for r in rules:
        if ((not r["kind"] or r["kind"] == kind) and (not r["name_regex"] or re.search(r["name_regex"], name))
                and (not r["category_regex"] or (category is not None and re.search(r["category_regex"], category)))):
            return r["class"]
    return None


@pytest.mark.parametrize("dataset", BUNDLED, ids=lambda p: p.name)
def test_stored_class_is_the_rules(dataset, ingested):
    con = tracesql.connect(ingested(dataset))
    names = con.execute("SELECT kind, name, category, list_distinct(list(class)), count(*) FROM slices "
                        "WHERE kind IN ('kernel', 'memcpy', 'memset') GROUP BY ALL").fetchall()
    assert [(k, n, c, stored) for k, n, c, stored, _ in names if stored != [python_class(k, n, c)]] == []
    assert con.execute("SELECT count(*) FROM slices WHERE class IS NOT NULL AND kind NOT IN ('kernel', 'memcpy', "
                       "'memset')").fetchall() == [(0,)]
    if dataset.name in ("hta_trace_filter", "tracelens_b200_eager", "jax_cpu_4dev_allreduce"):
        assert sum(n for *_, n in names) > 100
    # device_activity gives every device event with its stored class
    assert (con.execute("SELECT count(*) FROM device_activity()").fetchall()
            == [(sum(n for *_, n in names),)])


def test_older_run_is_classified_when_read(ingested, tmp_path):
    current = ingested(DATASETS / "hta_trace_filter")
    older = tmp_path / "hta_trace_filter"
    older.mkdir()
    for table in current.iterdir():  # the run as schema 8 wrote it: slices without class
        if table.is_dir():
            (older / table.name).mkdir()
            for part in table.glob("*.parquet"):
                keep = "* EXCLUDE (class)" if table.name == "slices" else "*"
                duckdb.execute(f"COPY (SELECT {keep} FROM read_parquet('{part}')) TO '{older / table.name / part.name}'")
    manifest = json.loads((current / "tracesql.json").read_text())
    manifest.pop("files")  # the files' checksums are the current run's
    (older / "tracesql.json").write_text(json.dumps({**manifest, "schema_version": 8}))

    with pytest.warns(OlderSchemaWarning):
        con = tracesql.connect(older)
    new = tracesql.connect(current)
    assert con.execute("SELECT getvariable('tracesql_classes_stored')").fetchall() == [(False,)]
    assert new.execute("SELECT getvariable('tracesql_classes_stored')").fetchall() == [(True,)]
    for scheme in ("default", "hta"):
        activity = f"SELECT rank, slice_id, class FROM device_activity(class_scheme := '{scheme}') ORDER BY ALL"
        got = con.execute(activity).fetchall()
        assert len(got) == 2_358 and got == new.execute(activity).fetchall()
    for name in ("overlap", "bubbles", "phases", "kernel_breakdown"):
        query = queries.find(name)
        assert queries.run(con, query).fetchall() == queries.run(new, query).fetchall(), name


@pytest.mark.parametrize("dataset", ["tracelens_b200_eager", "jax_cpu_4dev_allreduce", "hta_trace_filter"])
def test_a_scheme_of_ones_own_is_matched_as_the_shipped_ones(dataset, ingested):
    """The shipped schemes are compiled from the CSV (shipped_kernel_class); a user's scheme is read from the table
    (docs/concepts/kernel-classes.md): the same rows under a new name give every event the same class."""
    con = tracesql.connect(ingested(DATASETS / dataset))
    for scheme in functions.SHIPPED_CLASS_SCHEMES:
        con.execute(f"INSERT INTO kernel_classes SELECT 'mine_{scheme}', * EXCLUDE (scheme) FROM kernel_classes "
                    f"WHERE scheme = '{scheme}'")
        classes = "SELECT kind, name_hash, category, class FROM device_classes(class_scheme := '{}') ORDER BY ALL"
        shipped = con.execute(classes.format(scheme)).fetchall()
        assert len({c for *_, c in shipped}) >= (2 if scheme == "default" else 1)
        assert con.execute(classes.format(f"mine_{scheme}")).fetchall() == shipped
