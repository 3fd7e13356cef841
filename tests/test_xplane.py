"""XPlane reader: real JAX traces (8-GPU MI300X from the corpus, a bundled CPU run), every number checked against a
direct walk of the decoded protobuf or, for the CPU run, against the Chrome JSON the same profiler session wrote."""

from __future__ import annotations

import os
import random
import re

import pytest

import tracesql
from conftest import DATASETS, corpus_path, raw_events
from tracesql import queries
from tracesql.readers.xplane import parse

CORPUS_XPLANES = [
    ("tracelens", "tests", "test_data_jax_te_fused_attn_categorization", "934987a2fc2f.xplane.pb"),
    ("tracelens", "tests", "traces", "mi300", "jax_conv_minimal_08", "tw003.xplane.pb"),
    ("tracelens", "tests", "traces", "mi300", "jax_conv_minimal_legacy",
     "chi-mi300x-013.ord.vultr.cpe.ice.amd.com.xplane.pb"),
]
CPU_RUN = DATASETS / "jax_cpu_mlp"


def run_sql(run, sql):
    return tracesql.connect(run).execute(sql).fetchall()


def walk(path):
    """Per (plane, line): event count; per device plane: kernel/copy busy ns; the correlation ids of device
    events and of host events, from the protobuf messages directly (no reader code beyond the decoder)."""
    space = parse(path, path.read_bytes())
    per_line, busy, correlations = {}, {}, {"device": [], "host": set()}
    for plane in space.planes:
        stat_name = {k: m.name for k, m in plane.stat_metadata.items()}
        device = re.fullmatch(r"/device:GPU:(\d+)", plane.name)
        for line in plane.lines:
            per_line[(plane.name, line.name)] = len(line.events)
            ids = [s.uint64_value for e in line.events for s in e.stats if stat_name[s.metadata_id] == "correlation_id"]
            if device and line.name.startswith("Stream #"):
                d = int(device.group(1))
                busy[d] = busy.get(d, 0) + sum(e.duration_ps // 1000 for e in line.events)
                correlations["device"] += ids
            elif plane.name == "/host:CPU":
                correlations["host"].update(ids)
    return space, per_line, busy, correlations


@pytest.mark.corpus
@pytest.mark.parametrize("parts", CORPUS_XPLANES, ids=lambda p: p[-2])
def test_gpu_xplane_matches_protobuf_walk(parts, ingested):
    source = corpus_path(*parts)
    space, per_line, busy, correlations = walk(source)
    run = ingested(source)
    got = {}
    for track, n in run_sql(run, "SELECT track, count(*) FROM slices GROUP BY 1"):
        got[track] = n
    # host lines keep their plane/line names; stream lines are 'device D / stream S'
    expected = {}
    for (plane, line), n in per_line.items():
        device = re.fullmatch(r"/device:GPU:(\d+)", plane)
        stream = re.match(r"Stream #(\d+)", line)
        key = f"device {device.group(1)} / stream {stream.group(1)}" if device and stream else f"{plane} / {line}"
        expected[key] = expected.get(key, 0) + n
    assert got == {k: v for k, v in expected.items() if v}
    device_busy = dict(run_sql(run, "SELECT device_id, sum(dur) FROM slices WHERE kind IN ('kernel', 'memcpy', "
                                    "'memset') GROUP BY 1"))
    assert device_busy == {d: ns for d, ns in busy.items() if ns} and sum(busy.values()) > 1_000_000
    # device events are linked to the host launch call with their correlation id (here: all of them)
    linked = run_sql(run, "SELECT count(*), count(launch_id) FROM slices WHERE device_id IS NOT NULL")[0]
    host = correlations["host"]
    assert linked == (len(correlations["device"]), sum(c in host for c in correlations["device"])) \
        and linked[0] == linked[1]
    # one rank, 8 GPUs with the plane's properties, absolute time from the session start
    # a GPU plane names no model: the one its stats describe (MI300X: gfx 9.4, 304 CUs, 192 GiB; MI355X: gfx 9.5,
    # 256 CUs, 2.4 GHz), none for a plane that records only its vendor
    devices = run_sql(run, "SELECT device_id, name, json_extract_string(properties, '$.plane') FROM devices ORDER BY 1")
    assert [(d, plane) for d, _, plane in devices] == [(d, f"/device:GPU:{d}") for d in range(8)]
    model = "AMD Instinct MI355X" if "fused_attn" in str(source) else "AMD Instinct MI300X"
    assert devices[0][1] == model and {name for _, name, _ in devices} <= {model, None}
    start = next(p for p in space.planes if p.name == "Task Environment").stats[0].uint64_value
    ranks = run_sql(run, "SELECT count(*), min(base_time_ns), min(host_name), min(trace_start_ns) FROM ranks")[0]
    assert ranks[:3] == (1, start, space.hostnames[0]) and start <= ranks[3] < start + 10**9


@pytest.mark.corpus
def test_curated_queries_run_on_an_xplane_run(ingested):
    run = ingested(corpus_path(*CORPUS_XPLANES[1]))
    con = tracesql.connect(run)
    for query in queries.catalogue():
        queries.run(con, query).fetchall()


def test_cpu_jax_run_matches_its_chrome_json(ingested):
    """CPU JAX: XLA ops run as thunks on a host thread (kernels on device 0); StepTraceAnnotation gives steps."""
    source = CPU_RUN / "vm.xplane.pb"
    events = [e for e in raw_events(CPU_RUN / "vm.trace.json.gz.crosscheck") if e.get("ph") == "X"]
    ops = [e for e in events if "hlo_op" in e.get("args", {})]
    run = ingested(source)
    got = run_sql(run, "SELECT count(*), sum(dur), count(DISTINCT name) FROM slices WHERE kind = 'kernel'")[0]
    # Chrome JSON: µs with ns decimals; rounding the sum to ns matches the XPlane's integer ns
    assert got == (len(ops), round(sum(e["dur"] for e in ops) * 1000), len({e["name"] for e in ops})) \
        and len(ops) == 30
    assert run_sql(run, "SELECT count(*) FROM slices")[0][0] == len(events)
    steps = run_sql(run, "SELECT step, dur FROM steps ORDER BY step")
    annotations = sorted((int(e["args"]["step_num"]), round(e["dur"] * 1000)) for e in events
                         if "step_num" in e.get("args", {}))
    assert steps == annotations == [(0, 586184), (1, 262211), (2, 250995)]
    con = tracesql.connect(run)
    for query in queries.catalogue():
        queries.run(con, query).fetchall()


def _bad(tmp_path, data: bytes):
    path = tmp_path / "bad.xplane.pb"
    path.write_bytes(data)
    with pytest.raises(tracesql.TraceError) as err:
        tracesql.ingest([path], tmp_path / "run")
    message = str(err.value)
    assert str(path) in message and "\n" not in message
    return message


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_truncated_protobuf(tmp_path, cut):
    data = (CPU_RUN / "vm.xplane.pb").read_bytes()
    assert "not a valid XPlane protobuf" in _bad(tmp_path, data[:int(len(data) * cut)])


def test_zero_length_file(tmp_path):
    assert "empty file" in _bad(tmp_path, b"")


@pytest.mark.parametrize("seed", range(5))
def test_random_bytes_and_wrong_magic(tmp_path, seed):
    data = random.Random(seed).randbytes(4096) if seed else b"PK\x03\x04" + os.urandom(100)
    assert re.search(r"not a valid XPlane protobuf|no planes|no XPlane has events", _bad(tmp_path, data))
