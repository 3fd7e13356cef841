"""rocprofv3's rocpd database and CSV files: the same rows as the JSON export of the same records, checked against
the database's own tables and rocprofiler-sdk's own views (sqlite3) and against the CSV files (the csv module).

No public rocpd database or CSV export is paired with a public JSON export of one run (making one needs ROCm and an
AMD GPU): the bundled files hold 1,000 real MI350X dispatches of the corpus's rocprofv3 JSON (TraceLens's
908_results.json.gz), written by datasets/generators/rocprofv3_exports.py as rocprofv3 7.0 writes them, through
rocprofiler-sdk's own schema files. API calls, copies and markers (the JSON has none) come from a small process of
this file's own, written in all three formats, the database with the schema of the bundled one.
"""

from __future__ import annotations

import csv
import gzip
import json
import shutil
import sqlite3
import sys

import pytest

import tracesql
from conftest import DATASETS, REPO
from tracesql.errors import TraceError

sys.path.insert(0, str(DATASETS / "generators"))
import rocprofv3_exports as exports  # noqa: E402

DB = DATASETS / "rocprofv3_mi350x_rocpd" / "908_results.db"
CSV = DATASETS / "rocprofv3_mi350x_csv"
JSON = DATASETS / "rocprofv3_mi350x_json" / "908_results.json.gz"
COLUMNS = "kind, category, name, ts, dur, pid, tid, device_id, stream, track, correlation, external_id"


def _rows(run, columns: str = COLUMNS) -> list[tuple]:
    return tracesql.connect(run).execute(f"SELECT {columns} FROM slices ORDER BY ts, correlation, kind").fetchall()


def _sqlite(path):
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def test_rocpd_kernels_are_the_databases(ingested):
    # rocprofiler-sdk's own `kernels` view of the file (joins dispatches, symbols, agents, queues, events)
    con = _sqlite(DB)
    expected = con.execute("SELECT count(*), sum(duration), count(DISTINCT queue_id), count(DISTINCT name) "
                           "FROM kernels").fetchone()
    assert expected == (1000, 48_894_080, 5, 80)
    run = ingested(DB)
    assert tracesql.connect(run).execute("SELECT count(*), sum(dur), count(DISTINCT stream), count(DISTINCT name) "
                                         "FROM slices WHERE kind = 'kernel'").fetchone() == expected
    first = con.execute("SELECT name, start, duration, agent_type_index, queue_id, stack_id FROM kernels "
                        "ORDER BY start LIMIT 1").fetchone()
    assert first[:3] == ("ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)", 63_871_374_479_980, 1_304_613)
    assert tracesql.connect(run).execute("SELECT name, ts, dur, device_id, stream, correlation FROM slices "
                                         "ORDER BY ts LIMIT 1").fetchone() == first
    gpus = con.execute("SELECT type_index, product_name, name FROM rocpd_info_agent WHERE type = 'GPU' "
                       "ORDER BY type_index").fetchall()
    assert tracesql.connect(run).execute("SELECT device_id, name, compute_capability FROM devices "
                                         "ORDER BY 1").fetchall() == gpus
    assert len(gpus) == 8 and gpus[0] == (0, "AMD Instinct MI350X", "gfx950")


def test_rocpd_and_csv_give_the_rows_of_the_json_export(ingested):
    from_json = _rows(ingested(JSON), COLUMNS + ", args")
    assert len(from_json) == 1000
    assert _rows(ingested(DB), COLUMNS + ", args") == from_json
    from_csv = _rows(ingested(CSV), COLUMNS + ", args")
    assert [r[:-1] for r in from_csv] == [r[:-1] for r in from_json]
    # the CSV has the dispatch's scratch size but the kernel's static LDS (in 512-byte blocks), not the dispatch's
    same = ("dispatch_id", "kernel_id", "queue", "hip_stream", "grid_size", "workgroup_size", "private_segment_size",
            "sgpr_count", "arch_vgpr_count", "accum_vgpr_count")
    assert [{k: json.loads(r[-1])[k] for k in same} for r in from_csv] == \
        [{k: json.loads(r[-1])[k] for k in same} for r in from_json]
    with open(CSV / "908_kernel_trace.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert {r[10]: json.loads(r[-1])["lds_block_size"] for r in from_csv} == \
        {int(r["Correlation_Id"]): int(r["LDS_Block_Size"]) for r in table}
    devices = "SELECT device_id, name, compute_capability, sm_count FROM devices ORDER BY 1"
    assert tracesql.connect(ingested(CSV)).execute(devices).fetchall() == \
        tracesql.connect(ingested(JSON)).execute(devices).fetchall()


def _process() -> dict:
    """One process as rocprofv3 records it: HIP calls (one without a duration), a roctx range and mark with their
    messages, a host-to-device copy and the kernel a launch caused."""
    kinds = [{"kind": "NONE", "operations": []}] * 17
    kinds[5] = {"kind": "HIP_RUNTIME_API", "operations": ["hipApiName", "hipLaunchKernel", "hipMemcpyAsync",
                                                          "hipGetLastError"]}
    kinds[9] = {"kind": "MARKER_CORE_API", "operations": ["roctxMarkA", "roctxRangePushA", "roctxRangePop"]}
    kinds[10] = {"kind": "MEMORY_COPY", "operations": ["MEMORY_COPY_NONE", "MEMORY_COPY_HOST_TO_HOST",
                                                       "MEMORY_COPY_HOST_TO_DEVICE"]}
    kinds[11] = {"kind": "KERNEL_DISPATCH", "operations": ["NONE", "ENQUEUE", "COMPLETE"]}

    def call(kind, op, corr, start, end, **more):
        return {"kind": kind, "operation": op, "thread_id": 43, "correlation_id": {"internal": corr, "external": 0},
                "start_timestamp": start, "end_timestamp": end, **more}

    gpu = {"id": {"handle": 2}, "type": 2, "node_id": 1, "logical_node_id": 1, "logical_node_type_id": 0,
           "gpu_index": 0, "name": "gfx942", "product_name": "AMD Instinct MI300X", "vendor_name": "AMD",
           "model_name": "", "cu_count": 304, "cpu_cores_count": 0, "simd_count": 1216, "wave_front_size": 64,
           "gpu_id": 7, "device_id": 29857}
    cpu = {**gpu, "id": {"handle": 1}, "type": 1, "node_id": 0, "logical_node_id": 0, "name": "EPYC",
           "product_name": "EPYC", "gpu_index": -1, "cu_count": 96}
    return {
        "metadata": {"pid": 42, "node": {"hostname": "node7", "machine_id": "m7"}, "command": ["./app"]},
        "agents": [cpu, gpu],
        "strings": {"buffer_records": kinds, "marker_api": [{"key": 1, "value": "step 0"},
                                                            {"key": 6, "value": "after copy"}]},
        "code_objects": [{"code_object_id": 1, "agent_id": {"handle": 2}, "uri": "file://app", "load_base": 0,
                          "load_size": 0, "load_delta": 0, "storage_type": 1}],
        "kernel_symbols": [{"kernel_id": 3, "code_object_id": 1, "kernel_name": "gemm.kd",
                            "formatted_kernel_name": "gemm", "kernel_object": 0, "kernarg_segment_size": 8,
                            "kernarg_segment_alignment": 8, "group_segment_size": 0, "private_segment_size": 0,
                            "sgpr_count": 16, "arch_vgpr_count": 32, "accum_vgpr_count": 0}],
        "buffer_records": {
            "marker_api": [call(9, 1, 1, 900, 3000), call(9, 0, 6, 1950, 1950)],
            "hip_api": [call(5, 1, 7, 1000, 1500), call(5, 2, 8, 1600, 1700), call(5, 3, 9, 1750, 1750)],
            "kernel_dispatch": [call(11, 2, 7, 2000, 2600, stream_id={"handle": 0}, dispatch_info={
                "agent_id": {"handle": 2}, "queue_id": {"handle": 9}, "kernel_id": 3, "dispatch_id": 1,
                "private_segment_size": 0, "group_segment_size": 0, "workgroup_size": {"x": 64, "y": 1, "z": 1},
                "grid_size": {"x": 4096, "y": 1, "z": 1}})],
            "memory_copy": [call(10, 2, 8, 1800, 1900, src_agent_id={"handle": 1}, dst_agent_id={"handle": 2},
                                 bytes=4096, stream_id={"handle": 5})],
        },
    }


@pytest.fixture(scope="module")
def three_exports(tmp_path_factory):
    """The same process as a rocpd database, CSV files and the JSON export, each ingested."""
    root = tmp_path_factory.mktemp("rocprofv3")
    process = _process()
    (root / "db").mkdir()
    exports.write_rocpd(process, root / "db" / "42_results.db", exports.schema_from_database(DB))
    exports.write_csv(process, root / "csv")
    (root / "json").mkdir()
    (root / "json" / "42_results.json").write_text(json.dumps({"rocprofiler-sdk-tool": [process]}))
    runs = {}
    for name, source in (("db", root / "db" / "42_results.db"), ("csv", root / "csv"),
                         ("json", root / "json" / "42_results.json")):
        runs[name] = root / f"run-{name}"
        runs[name + "_warnings"] = tracesql.ingest([source], runs[name]).warnings
    runs["db_file"] = root / "db" / "42_results.db"
    return runs


def test_api_calls_copies_and_markers(three_exports):
    expected = [
        ("user_annotation", "MARKER_CORE_API", "step 0", 900, 2100, 42, 43, None, None, "process 42 / thread 43", 1,
         None),
        ("runtime", "HIP_RUNTIME_API", "hipLaunchKernel", 1000, 500, 42, 43, None, None, "process 42 / thread 43", 7,
         None),
        ("runtime", "HIP_RUNTIME_API", "hipMemcpyAsync", 1600, 100, 42, 43, None, None, "process 42 / thread 43", 8,
         None),
        ("runtime", "HIP_RUNTIME_API", "hipGetLastError", 1750, 0, 42, 43, None, None, "process 42 / thread 43", 9,
         None),
        ("memcpy", "MEMORY_COPY", "MEMORY_COPY_HOST_TO_DEVICE", 1800, 100, 42, 43, 0, 5, "device 0 / stream 5", 8,
         None),
        ("user_annotation", "MARKER_CORE_API", "after copy", 1950, 0, 42, 43, None, None, "process 42 / thread 43", 6,
         None),
        ("kernel", "KERNEL_DISPATCH", "gemm", 2000, 600, 42, 43, 0, 9, "device 0 / stream 9", 7, None),
    ]
    # memory_copy_trace.csv has no Thread_Id column
    assert _rows(three_exports["csv"]) == [r[:6] + (None,) + r[7:] if r[0] == "memcpy" else r for r in expected]
    # a call without a duration is a sample in the database, which keeps its category but not its name
    nameless = [r[:2] + ("HIP_RUNTIME_API",) + r[3:] if r[2] == "hipGetLastError" else r for r in expected]
    assert _rows(three_exports["db"]) == nameless
    assert _rows(three_exports["json"]) == expected  # markers named by strings.marker_api
    # the database's own rows: regions are the calls with a duration, samples those without
    con = _sqlite(three_exports["db_file"])
    assert con.execute("SELECT (SELECT count(*) FROM rocpd_region), (SELECT count(*) FROM rocpd_sample), "
                       "(SELECT count(*) FROM rocpd_memory_copy)").fetchone() == (3, 2, 1)
    # the copy launched by hipMemcpyAsync, the kernel by hipLaunchKernel (correlation ids)
    launches = tracesql.connect(three_exports["db"]).execute(
        "SELECT s.name, l.name FROM slices s JOIN slices l ON l.slice_id = s.launch_id ORDER BY s.ts").fetchall()
    assert launches == [("MEMORY_COPY_HOST_TO_DEVICE", "hipMemcpyAsync"), ("gemm", "hipLaunchKernel")]


def test_rocm6_csv_layout(tmp_path):
    """rocprofv3's kernel_trace.csv of ROCm 6.x (bare agent node ids, Private/Group_Segment_Size, no Stream_Id):
    the sample of rocprofiler-sdk's documentation."""
    source = REPO / "tests" / "data" / "rocprofv3_rocm6_kernel_trace.csv"
    shutil.copy(source, tmp_path / "69_kernel_trace.csv")
    result = tracesql.ingest([tmp_path], tmp_path / "run")
    assert any("no 69_agent_info.csv" in w for w in result.warnings)
    with open(source, newline="") as f:
        table = list(csv.DictReader(f))
    got = tracesql.connect(tmp_path / "run").execute(
        "SELECT name, ts, dur, stream, correlation, args ->> 'group_segment_size' FROM slices ORDER BY ts").fetchall()
    assert got == sorted(((r["Kernel_Name"], int(r["Start_Timestamp"]),
                           int(r["End_Timestamp"]) - int(r["Start_Timestamp"]), int(r["Queue_Id"]),
                           int(r["Correlation_Id"]), r["Group_Segment_Size"]) for r in table), key=lambda r: r[1])
    assert len(got) == 7


def _rpd(tmp_path):
    path = tmp_path / "trace.rpd"
    shutil.copy(REPO / "tests" / "data" / "matmul_result.rpd", path)
    return path


def _table(tmp_path, name, table):
    path = tmp_path / name
    con = sqlite3.connect(path)
    con.execute(f"CREATE TABLE {table} (id INTEGER)")
    con.close()
    return path


def _rocpd_without_views(tmp_path):
    path = tmp_path / "1_results.db"
    shutil.copy(DB, path)
    con = sqlite3.connect(path)
    for (view,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'view'").fetchall():
        con.execute(f"DROP VIEW {view}")
    con.close()
    return path


@pytest.mark.parametrize("make, what", [
    (_rpd, "an RPD database"),
    (lambda tmp: _table(tmp, "results.db", "KERN"), "a rocprof (v1) results database"),
    (lambda tmp: _table(tmp, "rocprof_compute.db", "compute_workload"), "a rocprof-compute (Omniperf) database"),
    (_rocpd_without_views, "a rocpd database without rocprofv3's views"),
    (lambda tmp: (tmp / "report1.nsys-rep").write_bytes(b"\x00" * 64) and tmp / "report1.nsys-rep",
     "an Nsight Systems report"),
])
def test_other_tools_files_are_named_in_one_line(tmp_path, make, what):
    path = make(tmp_path)
    with pytest.raises(TraceError) as e:
        tracesql.ingest([path], tmp_path / "run")
    message = str(e.value)
    assert what in message and str(path) in message and "\n" not in message


def test_damaged_csv_is_one_line(tmp_path):
    (tmp_path / "7_kernel_trace.csv").write_text('"Kind","Correlation_Id","Start_Timestamp","End_Timestamp"\n'
                                                 '"KERNEL_DISPATCH",1,"x",2\n')
    with pytest.raises(TraceError) as e:
        tracesql.ingest([tmp_path / "7_kernel_trace.csv"], tmp_path / "run")
    assert "no timed records" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow  # the whole corpus file, parsed twice
def test_bundled_json_is_the_corpus_records():
    """The bundled JSON's dispatches are positions 20,000-20,999 of the corpus file, unchanged."""
    from conftest import corpus_path

    corpus = corpus_path("tracelens", "tests", "rocprof", "908_results.json.gz")
    whole = json.loads(gzip.open(corpus).read())["rocprofiler-sdk-tool"][0]["buffer_records"]["kernel_dispatch"]
    cut = json.loads(gzip.open(JSON).read())["rocprofiler-sdk-tool"][0]["buffer_records"]["kernel_dispatch"]
    assert cut == whole[20000:21000]


@pytest.mark.parametrize("query", ["hotspots", "overlap", "collectives", "kernel_breakdown"])
def test_queries_answer_the_same_on_the_three_formats(ingested, query):
    answers = [tracesql.query(query, ingested(source)).drop(columns="run_id", errors="ignore")
               for source in (DB, CSV, JSON)]
    assert len(answers[0]) and answers[0].equals(answers[1]) and answers[0].equals(answers[2])


@pytest.mark.slow  # two ingests
def test_a_folder_of_all_three_formats_is_read_once(tmp_path):
    """rocprofv3 --output-format rocpd csv json writes the same process three times: the JSON export is read."""
    folder = tmp_path / "out"
    folder.mkdir()
    for source in (DB, JSON, *CSV.iterdir()):
        shutil.copy(source, folder / source.name)
    tracesql.ingest([folder], tmp_path / "run")
    con = tracesql.connect(tmp_path / "run")
    assert con.execute("SELECT count(*), sum(dur) FROM slices").fetchone() == (1000, 48_894_080)
    assert con.execute("SELECT source_format FROM ranks").fetchall() == [("rocprof",)]
    (folder / JSON.name).unlink()  # then the database
    tracesql.ingest([folder], tmp_path / "run2")
    con = tracesql.connect(tmp_path / "run2")
    assert con.execute("SELECT count(*), any_value(source_format) FROM ranks JOIN slices USING (rank)").fetchone() \
        == (1000, "rocpd")
