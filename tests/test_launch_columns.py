"""slices.launch_ts/launch_dur/launch_pid/launch_tid (schema 8): each launched device event carries its launching
call's start, duration, process and thread, as the join of the event to its call (slices.launch_id) gives them, on
every bundled trace; a run of an older schema, which lacks the columns, gets them derived when read, so that the
queries that read them answer as on a current run."""

from __future__ import annotations

import json

import duckdb
import pytest

import tracesql
from conftest import DATASETS
from tracesql import queries
from tracesql.errors import OlderSchemaWarning

BUNDLED = sorted(p for p in DATASETS.iterdir() if p.is_dir() and p.name != "generators")
# the columns against the launching call's own row, by a join on launch_id
MISMATCHES = """
SELECT
    count(*) FILTER (WHERE d.launch_id IS NOT NULL) AS launched,
    count(*) FILTER (WHERE (d.launch_id IS NULL) <> (d.launch_ts IS NULL) OR (d.launch_id IS NULL) <> (d.launch_dur IS NULL)
                       OR d.launch_ts IS DISTINCT FROM l.ts OR d.launch_dur IS DISTINCT FROM l.dur
                       OR d.launch_pid IS DISTINCT FROM l.pid OR d.launch_tid IS DISTINCT FROM l.tid) AS wrong
FROM slices d LEFT JOIN slices l ON l.run_id = d.run_id AND l.rank = d.rank AND l.slice_id = d.launch_id
"""


@pytest.mark.parametrize("dataset", BUNDLED, ids=lambda p: p.name)
def test_launch_columns_are_the_launching_calls(dataset, ingested):
    con = tracesql.connect(ingested(dataset))
    launched, wrong = con.execute(MISMATCHES).fetchall()[0]
    assert wrong == 0
    kinds = {k for (k,) in con.execute("SELECT DISTINCT kind FROM slices WHERE launch_id IS NOT NULL").fetchall()}
    assert kinds <= {"kernel", "memcpy", "memset", "gpu_annotation", "sync"}
    if dataset.name in ("hta_trace_filter", "tracelens_b200_eager", "tracelens_mi210_gpu_only"):  # CUDA/HIP launches
        assert launched > 500


def test_older_run_derives_the_launch_columns(ingested, tmp_path):
    current = ingested(DATASETS / "hta_trace_filter")
    older = tmp_path / "hta_trace_filter"
    older.mkdir()
    launch_columns = ("launch_ts", "launch_dur", "launch_pid", "launch_tid")
    for table in (current / "slices").parent.iterdir():  # the run as schema 7 wrote it: slices without them
        if table.is_dir():
            (older / table.name).mkdir()
            for part in table.glob("*.parquet"):
                keep = "* EXCLUDE (" + ", ".join(launch_columns) + ")" if table.name == "slices" else "*"
                duckdb.execute(f"COPY (SELECT {keep} FROM read_parquet('{part}')) TO '{older / table.name / part.name}'")
    manifest = json.loads((current / "tracesql.json").read_text())
    manifest.pop("files")  # written before manifests listed the run's files
    (older / "tracesql.json").write_text(json.dumps({**manifest, "schema_version": 7}))

    with pytest.warns(OlderSchemaWarning):
        con = tracesql.connect(older)
    assert con.execute(MISMATCHES).fetchall()[0] == (2_358, 0)
    new = tracesql.connect(current)
    columns = ", ".join(("rank", "slice_id") + launch_columns)
    assert (con.execute(f"SELECT {columns} FROM slices ORDER BY ALL").fetchall()
            == new.execute(f"SELECT {columns} FROM slices ORDER BY ALL").fetchall())
    for name in ("launch", "bubbles", "phases", "annotations"):
        query = queries.find(name)
        assert queries.run(con, query).fetchall() == queries.run(new, query).fetchall(), name
