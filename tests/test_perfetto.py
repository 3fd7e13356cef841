"""Perfetto protobuf reader: traces built with the perfetto package's own builder, and a Kineto trace converted
to Perfetto that must give the same kernels, device busy time and hotspots as the Kineto original."""

from __future__ import annotations

import gzip
import json
import math
import os
import random

import pytest

import tracesql
from conftest import DATASETS, raw_events
from tracesql import queries
from tracesql.readers import reader_for

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
from perfetto.trace_builder.proto_builder import TraceProtoBuilder  # noqa: E402

TE = pb.TrackEvent
CLEARED = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
NEEDS_STATE = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
KINETO_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync")


def run_sql(run, sql):
    return tracesql.connect(run).execute(sql).fetchall()


def _describe(builder, uuid, *, name=None, parent=None, pid=None, tid=None, process_name=None):
    d = builder.add_packet().track_descriptor
    d.uuid = uuid
    if parent is not None:
        d.parent_uuid = parent
    if name is not None:
        d.name = name
    if tid is not None:
        d.thread.pid, d.thread.tid = pid, tid
    elif pid is not None:
        d.process.pid = pid
        d.process.process_name = process_name or ""


def _event(builder, ts, kind, track, seq=1, name=None, flows=(), ends_flows=(), **fields):
    p = builder.add_packet()
    p.timestamp = ts
    p.trusted_packet_sequence_id = seq
    e = p.track_event
    e.type = kind
    e.track_uuid = track
    if name is not None:
        e.name = name
    e.flow_ids.extend(flows)
    e.terminating_flow_ids.extend(ends_flows)
    for key, value in fields.items():
        getattr(e, key).extend(value) if isinstance(value, list) else setattr(e, key, value)
    return p


def _small_trace(path):
    """A process with a python thread: a step enclosing an op enclosing a launch (interned names, a string and an
    interned category), a kernel on 'GPU 1 / stream 7' linked by a flow, an instant, a process counter and an
    incremental device counter in KiB (one value carried by the kernel's slice begin)."""
    b = TraceProtoBuilder()
    _describe(b, 1, pid=10, process_name="trainer")
    _describe(b, 2, pid=10, tid=11, parent=1)
    b.trace.packet[-1].track_descriptor.thread.thread_name = "python"
    _describe(b, 3, name="GPU 1")
    _describe(b, 4, name="stream 7", parent=3)
    _describe(b, 5, name="loss", parent=1)
    b.trace.packet[-1].track_descriptor.counter.SetInParent()
    _describe(b, 6, name="bytes sent", parent=3)
    b.trace.packet[-1].track_descriptor.counter.is_incremental = True
    b.trace.packet[-1].track_descriptor.counter.unit_multiplier = 1024
    p = b.add_packet()
    p.trusted_packet_sequence_id = 1
    p.sequence_flags = CLEARED
    p.interned_data.event_names.add(iid=1, name="ProfilerStep#3")
    p.interned_data.event_names.add(iid=2, name="aten::mm")
    p.interned_data.event_categories.add(iid=1, name="cpu_op")
    p.interned_data.debug_annotation_names.add(iid=1, name="Input Dims")
    step = _event(b, 1000, TE.TYPE_SLICE_BEGIN, 2, name_iid=1, categories=["user_annotation"])
    step.sequence_flags = NEEDS_STATE
    mm = _event(b, 1100, TE.TYPE_SLICE_BEGIN, 2, name_iid=2, category_iids=[1])
    dims = mm.track_event.debug_annotations.add(name_iid=1)
    dims.legacy_json_value = "[[4, 8], [8, 16]]"
    mm.track_event.debug_annotations.add(name="External id", int_value=5)
    _event(b, 1200, TE.TYPE_SLICE_BEGIN, 2, name="cudaLaunchKernel", categories=["cuda_runtime"], flows=[77])
    _event(b, 1300, TE.TYPE_SLICE_END, 2)
    _event(b, 1250, TE.TYPE_INSTANT, 2, name="mark")
    _event(b, 1400, TE.TYPE_SLICE_END, 2)
    _event(b, 1500, TE.TYPE_COUNTER, 5, counter_value=3)
    _event(b, 2000, TE.TYPE_SLICE_END, 2)
    _event(b, 1550, TE.TYPE_COUNTER, 6, counter_value=1)
    _event(b, 1600, TE.TYPE_SLICE_BEGIN, 4, name="gemm", ends_flows=[77], extra_counter_track_uuids=[6],
           extra_counter_values=[2])
    _event(b, 1900, TE.TYPE_SLICE_END, 4)
    # a second sequence reusing iid 1 for another name: interning is per sequence
    p = b.add_packet()
    p.trusted_packet_sequence_id = 2
    p.sequence_flags = CLEARED
    p.interned_data.event_names.add(iid=1, name="other_thread_work")
    _event(b, 2100, TE.TYPE_SLICE_BEGIN, 1, seq=2, name_iid=1)
    _event(b, 2200, TE.TYPE_SLICE_END, 1, seq=2)
    path.write_bytes(b.serialize())
    return path


def test_slices_nesting_names_and_flows(tmp_path):
    tracesql.ingest([_small_trace(tmp_path / "small.pftrace")], tmp_path / "run")
    rows = run_sql(tmp_path / "run", """
        SELECT s.name, s.kind, s.category, s.ts, s.dur, s.depth, p.name, s.track, s.device_id, s.stream,
               l.name, s.step, s.args
        FROM slices s LEFT JOIN slices p ON p.slice_id = s.parent_id LEFT JOIN slices l ON l.slice_id = s.launch_id
        ORDER BY s.ts, s.depth""")
    assert rows == [
        ("ProfilerStep#3", "user_annotation", "user_annotation", 1000, 1000, 0, None, "trainer / python",
         None, None, None, 3, None),
        ("aten::mm", "cpu_op", "cpu_op", 1100, 300, 1, "ProfilerStep#3", "trainer / python", None, None, None, 3,
         '{"Input Dims": [[4, 8], [8, 16]], "External id": 5}'),
        ("cudaLaunchKernel", "runtime", "cuda_runtime", 1200, 100, 2, "aten::mm", "trainer / python", None, None,
         None, 3, None),
        ("mark", "instant", None, 1250, 0, 3, "cudaLaunchKernel", "trainer / python", None, None, None, 3, None),
        ("gemm", "kernel", None, 1600, 300, 0, None, "device 1 / stream 7", 1, 7, "cudaLaunchKernel", 3, None),
        ("other_thread_work", "user_annotation", None, 2100, 100, 0, None, "trainer / process", None, None,
         None, None, None),
    ]
    # the op owns the kernel its launch caused, and its input shapes come from the debug annotation
    assert run_sql(tmp_path / "run", "SELECT name, kernel_count, device_self_ns, input_dims, external_id FROM ops") == [
        ("aten::mm", 1, 300, [[4, 8], [8, 16]], 5)]
    assert run_sql(tmp_path / "run", "SELECT name, series, track, device_id, ts, value FROM counters ORDER BY ts") == [
        ("loss", None, "trainer", None, 1500, 3.0),
        ("bytes sent", None, "device 1", 1, 1550, 1024.0),
        ("bytes sent", None, "device 1", 1, 1600, 3072.0)]


def test_every_curated_query_runs(tmp_path):
    tracesql.ingest([_small_trace(tmp_path / "small.pftrace")], tmp_path / "run")
    con = tracesql.connect(tmp_path / "run")
    for query in queries.catalogue():
        queries.run(con, query).fetchall()


def _ns(us: float) -> int:
    """µs -> ns exactly as the Kineto reader converts them (the fraction rounded on its own)."""
    return math.floor(us) * 1000 + round((us - math.floor(us)) * 1000)


def kineto_to_perfetto(events: list[dict], path, base_ns: int = 0):
    """Every Kineto X event as a begin/end pair on a track per (pid, tid) (device events on 'GPU d' /
    'stream s' tracks), instants as instants, args as debug annotations; a launch and the device work it caused
    share a flow (their correlation id, which is not written as an annotation). Events that overlap an enclosing
    event without nesting in it go to a sibling track, as a begin/end stack cannot represent them."""
    b = TraceProtoBuilder()
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    tracks: dict[tuple, int] = {}

    def track(key, describe) -> int:
        if key not in tracks:
            tracks[key] = len(tracks) + 1
            describe(tracks[key])
        return tracks[key]

    labels: dict[str, int] = {}  # pid/tid labels ('Spans', ...) as negative ids, as the Kineto reader does

    def as_int(v) -> int:
        return v if isinstance(v, int) else -labels.setdefault(str(v), len(labels) + 1)

    timed = []
    for e in events:
        if e.get("ph") not in ("X", "i", "I"):
            continue
        e = {**e, "pid": as_int(e["pid"]), "tid": as_int(e["tid"])}
        args = dict(e.get("args") or {})
        corr = args.pop("correlation", None)
        if e.get("cat") in KINETO_DEVICE_CATEGORIES:
            device, stream = args.get("device", e["pid"]), args.get("stream", e["tid"])
            gpu = track(("gpu", device), lambda u, d=device: _describe(b, u, name=f"GPU {d}"))
            lane = ("stream", device, stream)
            parent, label = gpu, f"stream {stream}"
        else:
            proc = track(("pid", e["pid"]), lambda u, p=e["pid"]: _describe(b, u, pid=p, process_name=f"p{p}"))
            lane = ("thread", e["pid"], e["tid"])
            parent, label = proc, names.get((e["pid"], e["tid"]), f"thread {e['tid']}")
        start = _ns(e["ts"]) + base_ns
        end = start + (_ns(e["dur"]) if e["ph"] == "X" else 0)
        timed.append((start, -end, lane, parent, label, e, args, corr, end))
    timed.sort(key=lambda t: (t[0], t[1]))
    stacks: dict[tuple, list[int]] = {}
    out = []  # (time, order, packet fields)
    for n, (start, _, lane, parent, label, e, args, corr, end) in enumerate(timed):
        depth = 0
        while True:  # the first sibling lane where this event nests (or where nothing is open)
            key = (*lane, depth)
            stack = stacks.setdefault(key, [])
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                break
            depth += 1
        uuid = track(key, lambda u, p=parent, lb=label, d=depth: _describe(
            b, u, parent=p, name=lb if not d else f"{lb} overlap {d}",
            **({"pid": e["pid"], "tid": e["tid"] + (d << 32)} if lane[0] == "thread" else {})))
        if e["ph"] == "X":
            stack.append(end)
        out.append((start, 1, n, uuid, e, args, corr))
        if e["ph"] == "X":
            out.append((end, 0, -n, uuid, None, None, None))
    # at one time: ends before begins; among ends, the latest-begun (inner) first
    for ts, is_begin, _, uuid, e, args, corr in sorted(out, key=lambda o: (o[0], o[1], o[2])):
        if e is None:
            _event(b, ts, TE.TYPE_SLICE_END, uuid)
            continue
        device_side = e.get("cat") in KINETO_DEVICE_CATEGORIES
        p = _event(b, ts, TE.TYPE_SLICE_BEGIN if e["ph"] == "X" else TE.TYPE_INSTANT, uuid, name=e.get("name", ""),
                   categories=[e["cat"]] if e.get("cat") else [],
                   **({"ends_flows": [corr]} if device_side and corr else {"flows": [corr]} if corr else {}))
        for k, v in args.items():
            a = p.track_event.debug_annotations.add(name=k)
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                a.legacy_json_value = json.dumps(v)
            elif isinstance(v, int):
                a.int_value = v
            elif isinstance(v, float):
                a.double_value = v
            else:
                a.string_value = v
    path.write_bytes(gzip.compress(b.serialize()))
    return path


KERNELS = """SELECT count(*), sum(dur), count(DISTINCT (device_id, stream)), count(launch_id)
             FROM slices WHERE kind = 'kernel'"""


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory):
    source = DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz"
    tmp = tmp_path_factory.mktemp("xformat")
    converted = kineto_to_perfetto(raw_events(source), tmp / "sampled_rank-0.perfetto-trace.gz")
    assert (reader_for(source).FORMAT, reader_for(converted).FORMAT) == ("kineto", "perfetto")
    tracesql.ingest([source], tmp / "kineto")
    tracesql.ingest([converted], tmp / "perfetto")
    return tmp / "kineto", tmp / "perfetto"


def test_converted_trace_gives_the_same_kernels(both_runs):
    kineto, perfetto = both_runs
    expected = run_sql(kineto, KERNELS)
    assert expected[0][0] > 1000 and expected[0][3] == expected[0][0]  # every kernel linked to its launch
    assert run_sql(perfetto, KERNELS) == expected


def test_converted_trace_gives_the_same_busy_time_and_hotspots(both_runs):
    kineto, perfetto = both_runs

    def breakdown(run):
        return queries.run(tracesql.connect(run), queries.find("temporal_breakdown")).df()[
            ["device_id", "window_ns", "compute_ns", "idle_ns", "exposed_comm_ns", "exposed_memory_ns"]
        ].to_dict("records")

    def hotspots(run):
        return queries.run(tracesql.connect(run), queries.find("hotspots"),
                           {"top": 10, "levels": "kernel,kernel_family"}).df()[
            ["level", "rank_in_level", "name", "count", "device_ns"]].to_dict("records")

    assert breakdown(perfetto) == breakdown(kineto)
    assert breakdown(kineto)[0]["compute_ns"] > 0
    assert hotspots(perfetto) == hotspots(kineto)
    assert {h["level"] for h in hotspots(kineto)} == {"kernel", "kernel_family"}
    # (the op level is not compared: host events that overlap without nesting sit on sibling tracks in the
    # conversion, which moves some kernels to another enclosing op)


@pytest.mark.parametrize("make, problem", [
    (lambda good: b"", "empty file"),
    (lambda good: good[: len(good) // 2 + 3], "truncated or damaged protobuf"),
    (lambda good: b"\x0a\x7f\x08\x01", "truncated or damaged protobuf"),  # a packet cut after its first field
    (lambda good: random.Random(0).randbytes(4096), "not a trace"),
    (lambda good: gzip.compress(good)[:100], "truncated gzip"),
])
def test_bad_files_are_one_line_errors(tmp_path, make, problem):
    good = _small_trace(tmp_path / "good.pftrace").read_bytes()
    path = tmp_path / "bad.pftrace"
    path.write_bytes(make(good))
    with pytest.raises(tracesql.TraceError) as e:
        tracesql.ingest([path], tmp_path / "run")
    assert problem in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def _packets(data: bytes) -> list[bytes]:
    """A Trace's packets as they are written (tag, length, body), cut at their boundaries."""
    from tracesql.readers.perfetto import _varint_at

    out, pos = [], 0
    while pos < len(data):
        length, body = _varint_at(data, pos + 1)
        out.append(data[pos:body + length])
        pos = body + length
    return out


def test_runs_of_empty_packets_change_nothing(tmp_path):
    """Empty packets (0x0A 0x00: a packet with no field) carry nothing: runs of them, skipped in bulk, and single
    ones, parsed as usual, leave the tables as they were."""
    packets = _packets(gzip.decompress((DATASETS / "chromium_perfetto" / "chromium.perfetto-trace.gz").read_bytes()))
    empty = b"\x0a\x00"
    padded = empty * 100_000 + packets[0] + empty + b"".join(packets[1:50]) + empty * 5_000 + \
        b"".join(packets[50:]) + empty * 64
    (tmp_path / "plain.pftrace").write_bytes(b"".join(packets))
    (tmp_path / "padded.pftrace").write_bytes(padded)
    sql = "SELECT count(*), sum(dur), count(DISTINCT name), sum(hash(args)) FROM slices"
    tracesql.ingest([tmp_path / "plain.pftrace"], tmp_path / "plain")
    tracesql.ingest([tmp_path / "padded.pftrace"], tmp_path / "padded")
    assert run_sql(tmp_path / "padded", sql) == run_sql(tmp_path / "plain", sql)
    assert run_sql(tmp_path / "plain", sql)[0][0] > 1000


@pytest.mark.slow
def test_a_megabyte_gzip_of_empty_packets_is_refused_fast_within_the_memory_bound(tmp_path):
    """1 MB of gzip unpacking to 1,000 MB of empty packets (500 M): a one-line refusal naming the file within 60 s
    and the memory bound (--memory-limit 256MB + 320 MB), not minutes and gigabytes."""
    import subprocess
    import sys
    import time
    import zlib

    from conftest import REPO

    member = gzip.compress(b"\x0a\x00" * (16 << 20), compresslevel=9)  # a gzip member of 16 M of them: 32 MB
    path = tmp_path / "empty.perfetto-trace.gz"
    path.write_bytes(member * 31)  # members one after another: one gzip stream of 992 MB
    assert path.stat().st_size < 1.1e6 and len(zlib.decompressobj(31).decompress(member)) == 32 << 20
    # the peak of the ingest's own process tree, from a parent of its own (this test process has waited for other
    # tests' children, whose peaks RUSAGE_CHILDREN would report too)
    measure = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
               "sys.stderr.write(f'\\n{resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}'); "
               "sys.exit(done.returncode)")
    t0 = time.monotonic()
    result = subprocess.run([sys.executable, "-c", measure, sys.executable, "-m", "tracesql", "ingest", str(path),
                             "-o", str(tmp_path / "run"), "--memory-limit", "256MB", "-q"],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    stderr, peak_kb = result.stderr.rsplit("\n", 1)
    peak_mb = int(peak_kb) / 1024
    result.stderr = stderr
    assert result.returncode == 1 and result.stderr.strip() == (
        f"Error: {path}: empty trace: no packets with content ({31 << 24:,} empty packets)")
    assert wall < 60 and peak_mb < 256 + 320, (wall, peak_mb)
