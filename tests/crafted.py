"""Crafted inputs for the Nsight, rocprofv3, Perfetto, XPlane and torch_npu readers (no corpus needed), and the measurement of an
ingest's peak memory in a child process: what the memory-bound tests and `benchmarks/bench_readers.py --smoke`
use.

Each maker writes a valid file of the format with `events` timed events, plus what a hostile file holds: one huge
name that every event refers to (it is copied into every row that names it unless cut), deep nesting or open
slices that never end (Perfetto), invalid UTF-8 and text in integer columns (Nsight).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

HUGE = 4 << 20  # characters of the one huge name


def nsys_export(path: Path, events: int, huge: int = HUGE, api_only_process: bool = False) -> Path:
    """An export of one process: `events` kernels, each launched by a runtime call (so 2 x events slices), every
    kernel named by one string of `huge` characters; a string with invalid UTF-8 (a thread name) and a text value
    in an INTEGER column (one runtime call's correlationId). With `api_only_process`, a second process makes
    CUDA calls and runs no kernel."""
    pid = 4242
    tid = (pid << 24) | 4243
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER);
        CREATE TABLE PROCESSES (globalPid INTEGER, pid INTEGER, name TEXT);
        CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL,
            gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER, blockZ INTEGER,
            registersPerThread INTEGER, staticSharedMemory INTEGER, dynamicSharedMemory INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
            eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
            returnValue INTEGER NOT NULL);
    """)
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "k" * huge), (2, "gemm"), (3, "cudaLaunchKernel_v7000")])
    con.execute("INSERT INTO StringIds VALUES (4, CAST(X'70797468f66e' AS TEXT))")  # 'pyth\xf6n': not UTF-8
    con.execute("INSERT INTO ThreadNames VALUES (4, 0, ?)", (tid,))
    con.execute("INSERT INTO PROCESSES VALUES (?, ?, 'trainer')", (pid << 24, pid))
    con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (1700000000000000000, '', '')")
    con.execute(f"""
        INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {events})
        SELECT 1000 * i + 500, 1000 * i + 900, 0, 1, 7, i, {pid << 24}, 1, 2, 1, 1, 1, 128, 1, 1, 32, 0, 0 FROM n""")
    con.execute(f"""
        INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME
        WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {events})
        SELECT 1000 * i, 1000 * i + 100, 0, {tid}, i, 3, 0 FROM n""")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 'not a number' WHERE rowid = 1")
    if api_only_process:  # a launcher that initialized CUDA: calls, no device work
        con.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (5, 50, 0, {(777 << 24) | 778}, NULL, 3, 0)")
        con.execute("INSERT INTO PROCESSES VALUES (?, 777, 'mpirun')", (777 << 24,))
    con.commit()
    con.close()
    return path


def rocprof_trace(path: Path, events: int, huge: int = HUGE) -> Path:
    """A rocprofv3 JSON trace of one process: `events` kernel dispatches on one GPU, every one of the same kernel,
    whose symbol's name has `huge` characters; written streaming (the records are never all in memory)."""
    ops = [{"kind": "NONE", "operations": []}] * 11 + [
        {"kind": "KERNEL_DISPATCH", "operations": ["NONE", "ENQUEUE", "COMPLETE"]}]
    head = {"metadata": {"pid": 42, "node": {"hostname": "node7"}},
            "agents": [{"id": {"handle": 1}, "type": 1, "name": "cpu"},
                       {"id": {"handle": 2}, "type": 2, "name": "gfx942", "product_name": "AMD Instinct MI300X",
                        "gpu_index": 0, "cu_count": 304}],
            "strings": {"buffer_records": ops},
            "kernel_symbols": [{"kernel_id": 3, "kernel_name": "k.kd", "formatted_kernel_name": "k" * huge}]}
    with open(path, "w") as f:
        f.write('{"rocprofiler-sdk-tool":[' + json.dumps(head)[:-1] + ',"buffer_records":{"kernel_dispatch":[')
        for i in range(events):
            f.write(("," if i else "") + json.dumps({
                "kind": 11, "operation": 2, "thread_id": 43, "correlation_id": {"internal": i + 1, "external": 0},
                "start_timestamp": 1000 * i, "end_timestamp": 1000 * i + 600,
                "dispatch_info": {"agent_id": {"handle": 2}, "queue_id": {"handle": 9}, "kernel_id": 3,
                                  "dispatch_id": i + 1, "grid_size": {"x": 512, "y": 1, "z": 1}}},
                separators=(",", ":")))
        f.write("]}}]}")
    return path


def perfetto_trace(path: Path, events: int, huge: int = HUGE, unended: int = 0) -> Path:
    """A Perfetto trace: one thread track, `events` slices (begin/end pairs, interned names: one of `huge`
    characters that every slice refers to), nested 100 deep, then `unended` begins that never end."""
    from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import TracePacket, TrackDescriptor, TrackEvent

    def framed(packet) -> bytes:
        body = packet.SerializeToString()
        n, out = len(body), bytearray(b"\x0a")
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out) + body

    with open(path, "wb") as f:
        p = TracePacket(track_descriptor=TrackDescriptor(uuid=1))
        p.track_descriptor.thread.pid, p.track_descriptor.thread.tid = 10, 11
        p.track_descriptor.thread.thread_name = "python"
        f.write(framed(p))
        p = TracePacket(trusted_packet_sequence_id=1, sequence_flags=TracePacket.SEQ_INCREMENTAL_STATE_CLEARED)
        p.interned_data.event_names.add(iid=1, name="n" * huge)
        f.write(framed(p))
        begin = TracePacket(trusted_packet_sequence_id=1,
                            track_event=TrackEvent(type=TrackEvent.TYPE_SLICE_BEGIN, track_uuid=1, name_iid=1))
        end = TracePacket(trusted_packet_sequence_id=1,
                          track_event=TrackEvent(type=TrackEvent.TYPE_SLICE_END, track_uuid=1))

        def at(packet, ts: int) -> bytes:
            packet.timestamp = ts
            return framed(packet)

        chunk, depth, t = [], 100, 1 << 40
        for i in range(0, events, depth):
            n = min(depth, events - i)
            chunk += [at(begin, t + k) for k in range(n)]
            chunk += [at(end, t + 2 * depth - k) for k in range(n)]
            t += 4 * depth
            if len(chunk) > 20000:
                f.write(b"".join(chunk))
                chunk = []
        chunk += [at(begin, t + k) for k in range(unended)]
        f.write(b"".join(chunk))
    return path


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, body: bytes) -> bytes:
    """A length-delimited protobuf field: repeated fields concatenate, so a message grows by appending these."""
    return _varint(number << 3 | 2) + _varint(len(body)) + body


def xplane_trace(path: Path, events: int, huge: int = HUGE) -> Path:
    """An XSpace of one GPU plane whose one stream line holds `events` kernels, every one of the same metadata,
    whose name has `huge` characters, and a host plane with as many annotations named 'train'; the events are
    encoded by hand (a few bytes each), the rest by the protobuf messages."""
    from tracesql.readers.proto import messages

    space = messages()["XSpace"](hostnames=["node7"])
    out = []
    for plane_name, line_name, name in (("/device:GPU:0", "Stream #7(Kernel)", "k" * huge),
                                        ("/host:CPU", "python", "train")):
        plane = space.planes.add(id=len(out) + 1, name=plane_name)
        plane.event_metadata[1].id = 1
        plane.event_metadata[1].name = name
        line = plane.lines.add(id=7, name=line_name, timestamp_ns=1_700_000_000_000_000_000)
        body = bytearray(line.SerializeToString())
        for i in range(events):  # XEvent: metadata_id = 1, offset_ps = 2, duration_ps = 3
            body += _field(4, b"\x08\x01\x10" + _varint(1_000_000 * i) + b"\x18" + _varint(600_000))
        plane.ClearField("lines")
        out.append(_field(1, plane.SerializeToString() + _field(3, bytes(body))))
    space.ClearField("planes")
    path.write_bytes(space.SerializeToString() + b"".join(out))
    return path


def ascend_trace(folder: Path, events: int, huge: int = 10, flows: bool = False, malformed: int = 0) -> Path:
    """A torch_npu export's ASCEND_PROFILER_OUTPUT/trace_view.json: `events` AI_CORE tasks on one NPU stream, each
    named by `huge` characters (JSON repeats a name in every event), written streaming; with `flows`, each task's
    torch_to_npu flow from a Python thread (its start, then its end); every `malformed`-th task (when not 0) is
    followed by an event whose pid is text."""
    path = folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    host, pid = 3096504, 3096504 << 10 | 1 << 5  # device: host pid << 10 | sort index << 5 | device 0
    with open(path, "w") as f:
        f.write(json.dumps([{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                             "args": {"name": "Ascend Hardware"}},
                            {"ph": "M", "name": "process_name", "pid": host, "tid": 0, "args": {"name": "Python"}}])[:-1])
        name = "k" * huge
        for i in range(events):
            ts = f"{1736408883688177 + i}.930"
            if flows:
                f.write(f',{{"ph":"s","cat":"async_npu","name":"torch_to_npu","id":{i},"pid":{host},"tid":{host},'
                        f'"ts":"{1736408883688177 + i}.100"}},{{"ph":"f","cat":"async_npu","name":"torch_to_npu",'
                        f'"id":{i},"pid":{pid},"tid":7,"ts":"{ts}","bp":"e"}}')
            f.write(f',{{"ph":"X","name":"{name}","pid":{pid},"tid":7,"ts":"{ts}",'
                    f'"dur":0.5,"args":{{"Task Type":"AI_CORE","Physic Stream Id":7,"Task Id":{i}}}}}')
            if malformed and i % malformed == 0:
                f.write(',{"ph":"X","pid":"abc","tid":7}')
        f.write("]")
    return path


def peak_ingest_memory(trace: Path, run: Path, memory_limit: str, env: dict | None = None) -> dict:
    """`tracesql ingest` of `trace` in a fresh process: exit status, stderr, seconds and the peak anonymous memory
    (RssAnon, sampled every 20 ms: the heap, which the kernel cannot drop and read again, unlike the pages of
    the memory-mapped scratch files)."""
    cmd = [sys.executable, "-m", "tracesql", "ingest", "-q", str(trace), "-o", str(run), "-j", "1",
           "--memory-limit", memory_limit]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})},
                            cwd=run.parent)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.wait(0.02):
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
            except OSError:
                return
            for line in status.splitlines():
                if line.startswith("RssAnon:"):
                    peak[0] = max(peak[0], int(line.split()[1]) * 1024)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    _, err = proc.communicate()
    done.set()
    thread.join()
    return {"exit": proc.returncode, "stderr": err.decode(errors="replace"), "seconds": time.perf_counter() - start,
            "peak_anon_mb": peak[0] / 2**20}
