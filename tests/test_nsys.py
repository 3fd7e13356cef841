"""Nsight Systems SQLite exports: real exports from pipit's tests (4xA100 Perlmutter, MPI), every number checked
against plain sqlite3 queries on the same file."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

import tracesql
from conftest import corpus_path
from tracesql import queries

EXPORTS = ["saxpy-mpi-cuda_nsys_perlmutter0.sqlite", "cloverleaf-nsys/perlmutter-cloverleaf-cuda.sqlite"]


def _export(name):
    return corpus_path("pipit", "pipit", "tests", "data", name)


def raw(path, sql):
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute(sql).fetchall()


def run_sql(run, sql):
    return tracesql.connect(run).execute(sql).fetchall()


@pytest.mark.parametrize("name", EXPORTS)
def test_counts_and_times_match_sqlite(name, ingested):
    path = _export(name)
    run = ingested(path)
    got = dict((k, (n, t)) for k, n, t in run_sql(run, "SELECT kind, count(*), sum(dur) FROM slices GROUP BY kind"))
    kernels = raw(path, 'SELECT count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL')[0]
    copies = raw(path, 'SELECT count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY')[0]
    # eventClass 0: runtime calls; 1: driver calls; 67 (backtrace) repeats a call and is not one
    runtime = raw(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 0")[0][0]
    assert got["kernel"] == kernels and got["memcpy"] == copies
    assert got["runtime"][0] == runtime
    start = raw(path, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0][0]
    first = raw(path, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    assert run_sql(run, "SELECT min(ts) FROM slices WHERE kind = 'kernel'") == [(start + first,)]
    assert run_sql(run, "SELECT source_format, base_time_ns FROM ranks") == [("nsys", start)]


def test_exact_numbers_of_the_saxpy_export(ingested):
    """Pinned (the same numbers plain sqlite3 gives): 5 kernels of 88.6 ms, 15 copies, 56 runtime calls (the 38
    backtrace records dropped), 1 driver call, 22 NVTX ranges (the thread-name and domain records are no ranges)."""
    run = ingested(_export(EXPORTS[0]))
    assert run_sql(run, "SELECT kind, count(*), sum(dur) FROM slices GROUP BY kind ORDER BY kind") == [
        ("driver", 1, 1213), ("kernel", 5, 88573480), ("memcpy", 15, 284699600), ("runtime", 56, 703102906),
        ("user_annotation", 22, 896325758)]
    # the NVTX range around each launch encloses it on the host thread's track
    assert run_sql(run, "SELECT DISTINCT p.name FROM slices s JOIN slices p ON p.slice_id = s.parent_id "
                        "WHERE s.name = 'cudaLaunchKernel'") == [("saxpy",)]


@pytest.mark.parametrize("name", EXPORTS)
def test_launches_linked_by_correlation(name, ingested):
    path = _export(name)
    run = ingested(path)
    expected = raw(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE EXISTS (SELECT 1 FROM "
                         "CUPTI_ACTIVITY_KIND_RUNTIME r WHERE r.correlationId = k.correlationId)")[0][0]
    linked = run_sql(run, "SELECT count(*) FROM slices k JOIN slices r ON r.slice_id = k.launch_id "
                          "WHERE k.kind = 'kernel' AND r.correlation = k.correlation AND r.kind = 'runtime'")
    assert linked == [(expected,)] and expected > 0
    assert run_sql(run, "SELECT DISTINCT r.name FROM slices k JOIN slices r ON r.slice_id = k.launch_id "
                        "WHERE k.kind = 'kernel'") == [("cudaLaunchKernel",)]


@pytest.mark.parametrize("name", EXPORTS)
def test_devices_from_target_info(name, ingested):
    path = _export(name)
    expected = raw(path, "SELECT id, name, totalMemory, computeMajor || '.' || computeMinor, smCount "
                         "FROM TARGET_INFO_GPU ORDER BY id")
    got = run_sql(ingested(path), "SELECT device_id, name, total_memory_bytes, compute_capability, sm_count "
                                  "FROM devices ORDER BY device_id")
    assert got == expected and got[0][1].startswith("NVIDIA A100-SXM4")


@pytest.mark.parametrize("name", EXPORTS)
def test_every_curated_query_runs(name, ingested):
    con = tracesql.connect(ingested(_export(name)))
    for query in queries.catalogue():
        queries.run(con, query)


def test_export_without_optional_tables(tmp_path):
    """No NVTX, no memcpy, no session start time: the rest still reads; times stay relative (base 0)."""
    path = tmp_path / "lean.sqlite"
    shutil.copy(_export(EXPORTS[0]), path)
    with sqlite3.connect(path) as con:
        for table in ("NVTX_EVENTS", "CUPTI_ACTIVITY_KIND_MEMCPY", "TARGET_INFO_SESSION_START_TIME",
                      "TARGET_INFO_GPU", "ThreadNames"):
            con.execute(f"DROP TABLE {table}")
    tracesql.ingest([path], tmp_path / "run")
    run = tmp_path / "run"
    assert run_sql(run, "SELECT kind, count(*) FROM slices GROUP BY kind ORDER BY kind") == [
        ("driver", 1), ("kernel", 5), ("runtime", 56)]
    assert run_sql(run, "SELECT min(ts), max(base_time_ns) FROM slices, ranks WHERE kind = 'kernel'") == [
        (924922186, 0)]
    assert run_sql(run, "SELECT device_id, name FROM devices") == [(0, None)]


def _second_process(path, pid: int) -> None:
    """Give the export a second process (as `nsys profile mpirun -n 2` would): a copy of every CUDA record of
    the first, under another pid, its threads moved along (globalTid: vm id + pid in bits 24-47, tid below)."""
    with sqlite3.connect(path) as con:
        tables = {t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        for table, column in (("CUPTI_ACTIVITY_KIND_KERNEL", "globalPid"), ("CUPTI_ACTIVITY_KIND_MEMCPY", "globalPid"),
                              ("CUPTI_ACTIVITY_KIND_MEMSET", "globalPid"), ("CUPTI_ACTIVITY_KIND_RUNTIME", "globalTid"),
                              ("NVTX_EVENTS", "globalTid")):
            if table not in tables:
                continue
            columns = [c[1] for c in con.execute(f"PRAGMA table_info({table})")]
            moved = f"(({pid} << 24) | ({column} & {0xFFFFFF}))"
            values = ", ".join(moved if c == column else f'"{c}"' for c in columns)
            con.execute(f"INSERT INTO {table} SELECT {values} FROM {table} WHERE {column} IS NOT NULL")


def test_each_process_of_an_export_is_a_rank(tmp_path):
    path = tmp_path / "two.sqlite"
    shutil.copy(_export(EXPORTS[0]), path)
    _second_process(path, 4242)
    result = tracesql.ingest([path], tmp_path / "run")
    assert any("2 processes with CUDA activity: ranks 0-1 in pid order (pids 4242, 1230493)" in w
               for w in result.warnings), result.warnings
    per_rank = run_sql(tmp_path / "run", """
        SELECT rank, kind, count(*), sum(dur), count(launch_id) FROM slices GROUP BY ALL ORDER BY ALL""")
    one = [("driver", 1), ("kernel", 5), ("memcpy", 15), ("runtime", 56), ("user_annotation", 22)]
    kernels = raw(path, 'SELECT count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL')[0]
    assert [(r, k, n) for r, k, n, _, _ in per_rank] == [(r, k, n) for r in (0, 1) for k, n in one]
    # the same work in each process: equal times, every kernel linked to its own process's launch
    for r in (0, 1):
        kernel = next(row for row in per_rank if row[:2] == (r, "kernel"))
        assert kernel[2:] == (kernels[0] // 2, kernels[1] // 2, 5)
    assert run_sql(tmp_path / "run", "SELECT rank, source_path FROM ranks ORDER BY 1") == [
        (0, "two.sqlite"), (1, "two.sqlite")]
    # unchanged on the next ingest: both ranks' parts are kept
    again = tracesql.ingest([path], tmp_path / "run")
    assert again.reused == ["two.sqlite"] and not again.ingested
    assert run_sql(tmp_path / "run", "SELECT count(DISTINCT rank) FROM slices") == [(2,)]


def _no_kernel_table(path):
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")


BAD_FILES = {
    "truncated": (lambda p: p.write_bytes(_export(EXPORTS[0]).read_bytes()[:200_000]),
                  "damaged or unsupported SQLite export"),
    "no kernel table": (_no_kernel_table, "not an Nsight Systems export: no CUPTI_ACTIVITY_KIND_KERNEL table"),
    "zero-length": (lambda p: p.write_bytes(b""), "empty file"),
    "wrong magic": (lambda p: p.write_bytes(b"SQLite format 2\x00" + bytes(4096)), "not an SQLite database"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_bad_file_is_one_line_naming_it(case, tmp_path):
    make, problem = BAD_FILES[case]
    bad = tmp_path / "report.sqlite"
    make(bad)
    with pytest.raises(tracesql.TraceError) as err:
        tracesql.ingest([bad], tmp_path / "run")
    message = str(err.value)
    assert message.startswith(str(bad) + ": ") and problem in message and "\n" not in message
    assert not (tmp_path / "run").exists()


def test_a_kernel_table_that_is_a_view_is_read_and_rows_of_no_process_are_counted(tmp_path):
    """An export rewritten by a tool (the kernel table a view over another) reads like the original; kernels whose
    globalPid names no process (NULL, text) belong to no rank: left out, and said with their number."""
    from crafted import nsys_export

    path = nsys_export(tmp_path / "view.sqlite", 99, huge=10)
    with sqlite3.connect(path) as con:
        con.executescript("""
            ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO kernels_raw;
            CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS SELECT * FROM kernels_raw;
            UPDATE kernels_raw SET globalPid = NULL WHERE rowid <= 3;
            UPDATE kernels_raw SET globalPid = 'pid 4242' WHERE rowid IN (10, 11);""")
    result = tracesql.ingest([path], tmp_path / "run")
    assert f"{path}: 5 rows of CUPTI_ACTIVITY_KIND_KERNEL left out: their globalPid is not an integer, so they " \
           "belong to no process" in result.warnings
    expected = raw(path, "SELECT count(*), sum(\"end\" - start) FROM kernels_raw WHERE typeof(globalPid) = 'integer'")
    assert run_sql(tmp_path / "run", "SELECT count(*), sum(dur) FROM slices WHERE kind = 'kernel'") == expected
    assert expected[0][0] == 94
