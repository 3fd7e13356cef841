"""The slices file of a large source is written kind by kind (store.write_table): the rows are the same, the queries'
answers the same, and DuckDB reads the row groups of the kinds a query asks for only."""

from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest

import tracesql
from tracesql import db, queries, store

from conftest import DATASETS

SOURCE = DATASETS / "tracelens_b200_eager"  # 22 k slices of nine kinds (15 k python_function)
ROWS = 1024  # a row group's rows in the grouped run, so that this small trace is laid out as a 1 GB one is


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The trace ingested as it is (one row group, rows in the order they came) and kind by kind."""
    root = tmp_path_factory.mktemp("layout")
    tracesql.ingest([SOURCE], root / "plain", run_id="r")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "SLICES_ROW_GROUP_ROWS", ROWS)
        tracesql.ingest([SOURCE], root / "grouped", run_id="r")
    return root / "plain", root / "grouped"


def slices_file(run):
    (path,) = (run / "slices").glob("*.parquet")
    return path


def test_rows_are_grouped_by_kind_in_row_groups_of_their_own(runs):
    plain, grouped = (pq.read_table(slices_file(run)) for run in runs)
    assert pq.ParquetFile(slices_file(runs[0])).metadata.num_row_groups == 1
    # the same rows: each kind's in the order they came, the kinds in name order
    kinds = sorted(set(plain["kind"].to_pylist()))
    expected = [row for kind in kinds for row in plain.to_pylist() if row["kind"] == kind]
    assert grouped.to_pylist() == expected
    meta = pq.ParquetFile(slices_file(runs[1])).metadata
    counts = {kind: plain["kind"].to_pylist().count(kind) for kind in kinds}
    assert meta.num_row_groups == sum(math.ceil(n / ROWS) for n in counts.values())
    kind_column = plain.schema.get_field_index("kind")
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(kind_column).statistics
        assert stats.min == stats.max and meta.row_group(i).num_rows <= ROWS


def test_duckdb_reads_only_the_row_groups_of_the_kinds_asked_for(runs, tmp_path):
    con = db.connect()
    profile = tmp_path / "profile.json"

    def read(run, where: str) -> tuple[int, int, int]:
        """(rows that match, rows read, row groups read) by DuckDB's Parquet scan of the run's slices"""
        con.execute("PRAGMA enable_profiling = 'json'")
        con.execute(f"PRAGMA profiling_output = '{profile}'")
        # (a sum: a bare count(*) leaves no profile)
        ((count, _),) = con.execute(f"SELECT count(*), sum(dur) FROM read_parquet('{slices_file(run)}') "
                                    f"WHERE {where}").fetchall()
        con.execute("PRAGMA disable_profiling")
        (scan,) = [node for node in _nodes(json.loads(profile.read_text())["operator"]) if node["type"] == "TABLE_SCAN"]
        return count, scan["rows_scanned"], scan["row_groups_scanned"]

    plain, grouped = runs
    # by the row groups' min and max kind: the kernels' one row group
    assert read(grouped, "kind = 'kernel'") == (768, 768, 1)
    # an IN list is no filter of the scan, only of the row groups: by their min and max, every kind between
    # cpu_op and runtime would be read (driver ... python_function, 16 k rows); by the Bloom filter, none is
    assert read(grouped, "kind IN ('cpu_op', 'runtime')") == (4809 + 1151, 4809 + 1151, 5 + 2)
    # the file as it came: its one row group, whole
    assert read(plain, "kind IN ('cpu_op', 'runtime')") == (4809 + 1151, 22355, 1)


def _nodes(nodes):
    for node in nodes:
        yield node
        yield from _nodes(node.get("children", []))


def rounded(rows):
    """The rows as a sorted list, doubles to 9 significant digits (sums in another order differ in the last bits,
    as benchmarks/compare_outputs.py compares them)."""
    def value(v):
        return float(f"{v:.9g}") if isinstance(v, float) else v
    return sorted((tuple(value(v) for v in row) for row in rows), key=repr)


@pytest.mark.slow
def test_every_query_answers_the_same_from_either_layout(runs):
    for query in queries.catalogue():
        answers = []
        for run in runs:
            con = tracesql.connect(run)
            answers.append(rounded(queries.run(con, query, {}).fetchall()))
            con.close()
        assert answers[0] == answers[1], query.name
