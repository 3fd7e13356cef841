"""rocprofv3 JSON reader: a real MI350X trace checked against a plain json.loads walk, and small edge cases."""

from __future__ import annotations

import gzip
import json

import pytest

import tracesql
from conftest import corpus_path
from tracesql import queries

ROCPROF = ("tracelens", "tests", "rocprof", "908_results.json.gz")


def _tool(path):
    with gzip.open(path, "rb") as f:
        return json.loads(f.read())["rocprofiler-sdk-tool"]


@pytest.fixture(scope="module")
def rocprof_run(tmp_path_factory):
    trace = corpus_path(*ROCPROF)
    out = tmp_path_factory.mktemp("rocprof") / "run"
    tracesql.ingest([trace], out)
    return trace, out


def test_kernels_match_a_json_walk(rocprof_run):
    trace, run = rocprof_run
    dispatches = [r for proc in _tool(trace) for r in proc["buffer_records"]["kernel_dispatch"]]
    expected = (len(dispatches), sum(r["end_timestamp"] - r["start_timestamp"] for r in dispatches),
                len({r["dispatch_info"]["queue_id"]["handle"] for r in dispatches}))
    assert expected == (43915, 4_441_741_378, 5)  # 4.44 s of kernel time on 5 queues
    got = tracesql.connect(run).execute(
        "SELECT count(*), sum(dur), count(DISTINCT stream) FROM slices WHERE kind = 'kernel'").fetchone()
    assert got == expected
    # every dispatch keeps its own correlation id, and every kernel got a name from kernel_symbols
    assert tracesql.connect(run).execute(
        "SELECT count(DISTINCT correlation), count(*) FILTER (name LIKE 'kernel %') FROM slices").fetchone() == (
        43915, 0)


def test_kernel_names_come_from_the_symbol_table(rocprof_run):
    trace, run = rocprof_run
    proc = _tool(trace)[0]
    symbols = {k["kernel_id"]: k["formatted_kernel_name"] for k in proc["kernel_symbols"]}
    first = min(proc["buffer_records"]["kernel_dispatch"], key=lambda r: r["correlation_id"]["internal"])
    row = tracesql.connect(run).execute(
        "SELECT name, ts, dur, device_id, stream FROM slices WHERE correlation = ?",
        [first["correlation_id"]["internal"]]).fetchone()
    assert row == (symbols[first["dispatch_info"]["kernel_id"]], first["start_timestamp"],
                   first["end_timestamp"] - first["start_timestamp"], 0, first["dispatch_info"]["queue_id"]["handle"])
    assert row[0] == "__amd_rocclr_copyBuffer"


def test_devices_are_the_gpu_agents(rocprof_run):
    trace, run = rocprof_run
    gpus = [a for a in _tool(trace)[0]["agents"] if a["type"] == 2]
    got = tracesql.connect(run).execute(
        "SELECT device_id, name, compute_capability, sm_count FROM devices ORDER BY device_id").fetchall()
    assert got == [(a["gpu_index"], a["product_name"], a["name"], a["cu_count"]) for a in gpus]
    assert got[0] == (0, "AMD Instinct MI350X", "gfx950", 256) and len(got) == 8


def test_every_curated_query_runs(rocprof_run):
    con = tracesql.connect(rocprof_run[1])
    for query in queries.catalogue():
        queries.run(con, query).fetchall()


def _tiny(tmp_path):
    """One HIP launch that causes a kernel and a host-to-device copy, in the layout rocprofv3 writes."""
    ops = [{"kind": "NONE", "operations": []}] * 5 + [
        {"kind": "HIP_RUNTIME_API", "operations": ["hipApiName", "hipLaunchKernel", "hipMemcpyAsync"]}]
    ops += [{"kind": "NONE", "operations": []}] * 4
    ops += [{"kind": "MEMORY_COPY", "operations": ["MEMORY_COPY_NONE", "MEMORY_COPY_HOST_TO_HOST",
                                                   "MEMORY_COPY_HOST_TO_DEVICE"]},
            {"kind": "KERNEL_DISPATCH", "operations": ["NONE", "ENQUEUE", "COMPLETE"]}]
    corr = lambda i: {"internal": i, "external": 0}  # noqa: E731
    doc = {"rocprofiler-sdk-tool": [{
        "metadata": {"pid": 42, "node": {"hostname": "node7"}},
        "agents": [{"id": {"handle": 1}, "type": 1, "name": "cpu"},
                   {"id": {"handle": 2}, "type": 2, "name": "gfx942", "product_name": "AMD Instinct MI300X",
                    "gpu_index": 0, "cu_count": 304, "mem_banks": [{"heap_type": 1, "size_in_bytes": 1 << 30}]}],
        "strings": {"buffer_records": ops},
        "kernel_symbols": [{"kernel_id": 3, "kernel_name": "gemm.kd", "formatted_kernel_name": "gemm"}],
        "buffer_records": {
            "hip_api": [{"kind": 5, "operation": 1, "thread_id": 43, "correlation_id": corr(7),
                         "start_timestamp": 1000, "end_timestamp": 1500},
                        {"kind": 5, "operation": 2, "thread_id": 43, "correlation_id": corr(8),
                         "start_timestamp": 1600, "end_timestamp": 1700}],
            "kernel_dispatch": [{"kind": 11, "operation": 2, "thread_id": 43, "correlation_id": corr(7),
                                 "start_timestamp": 2000, "end_timestamp": 2600,
                                 "dispatch_info": {"agent_id": {"handle": 2}, "queue_id": {"handle": 9},
                                                   "kernel_id": 3}}],
            "memory_copy": [{"kind": 10, "operation": 2, "thread_id": 43, "correlation_id": corr(8),
                             "start_timestamp": 1800, "end_timestamp": 1900, "src_agent_id": {"handle": 1},
                             "dst_agent_id": {"handle": 2}, "bytes": 4096}],
            "memory_allocation": [{"kind": 16, "operation": 1, "start_timestamp": 1, "end_timestamp": 1}],
        },
    }]}
    path = tmp_path / "42_results.json"
    path.write_text(json.dumps(doc))
    return path


def test_launches_copies_and_host_threads(tmp_path):
    result = tracesql.ingest([_tiny(tmp_path)], tmp_path / "run")
    assert any("1 memory_allocation records not kept" in w for w in result.warnings)
    rows = tracesql.connect(tmp_path / "run").execute("""
        SELECT s.name, s.kind, s.ts, s.dur, s.device_id, s.stream, s.track, l.name AS launched_by,
               s.args ->> 'bytes'
        FROM slices s LEFT JOIN slices l ON l.slice_id = s.launch_id ORDER BY s.ts""").fetchall()
    assert rows == [
        ("hipLaunchKernel", "runtime", 1000, 500, None, None, "process 42 / thread 43", None, None),
        ("hipMemcpyAsync", "runtime", 1600, 100, None, None, "process 42 / thread 43", None, None),
        ("MEMORY_COPY_HOST_TO_DEVICE", "memcpy", 1800, 100, 0, -1, "device 0 / stream -1", "hipMemcpyAsync", "4096"),
        ("gemm", "kernel", 2000, 600, 0, 9, "device 0 / stream 9", "hipLaunchKernel", None),
    ]


@pytest.mark.parametrize("content, problem", [
    (b"", "empty file"),
    (b'{"rocprofiler-sdk-tool": [{"metadata": {', "not valid JSON"),
    (b'{"rocprofiler-sdk-tool": 3}', "not a rocprofv3 JSON trace"),
    (b'{"rocprofiler-sdk-tool": []}', "empty trace"),
    (b'{"rocprofiler-sdk-tool": [{"buffer_records": {}}]}', "no timed records"),
])
def test_bad_files_are_one_line_errors(tmp_path, content, problem):
    path = tmp_path / "1_results.json"
    path.write_bytes(content)
    with pytest.raises(tracesql.TraceError) as e:
        tracesql.ingest([path], tmp_path / "run")
    assert problem in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_truncated_gzip_is_one_line_error(tmp_path):
    path = tmp_path / "1_results.json.gz"
    path.write_bytes(gzip.compress(_tiny(tmp_path).read_bytes())[:200])
    with pytest.raises(tracesql.TraceError) as e:
        tracesql.ingest([path], tmp_path / "run")
    assert "truncated gzip" in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)
