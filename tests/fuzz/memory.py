"""The memory fuzzer: for every reader, the worst shapes of input for memory (long distinct strings, large args,
interned tables, whitespace, many tiny records, one huge string, millions of records), ingested at a small
`--memory-limit` while the peak anonymous memory of the whole process tree is sampled.

A shape is a function `make(path_stem, scale) -> Path` writing a valid file of its format: `scale` 1.0 is the
size of issue 26's attack (what took the readers to 0.6-1.9 GB), `tests/test_memory_fuzz.py` ingests a share of
it. Files are written streaming, so making one takes little memory.

    python -m tests.fuzz.memory [--scale S] [--only REGEX] [--limit 256MB]   # one shape at a time, a line each
"""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
DATASETS = REPO / "datasets"
sys.path.insert(0, str(TESTS))  # crafted: the other crafted inputs, and protobuf's encoding by hand

from crafted import _field, _varint, nsys_export, xplane_trace  # noqa: E402

LIMIT = "256MB"
LIMIT_MB = 256
#: What an ingest needs besides DuckDB's working memory (docs/robustness.md, "Memory").
FIXED_OVERHEAD_MB = 320
BOUND_MB = LIMIT_MB + FIXED_OVERHEAD_MB
TIMEOUT_S = 300


def _n(base: int, scale: float) -> int:
    return max(1, int(base * scale))


def _open(path: Path):
    return gzip.open(path, "wb", compresslevel=1) if path.name.endswith(".gz") else open(path, "wb")


def _write_chunks(path: Path, head: bytes, items, tail: bytes, sep: bytes = b",") -> Path:
    """`head`, the byte strings of `items` joined by `sep`, `tail`: written a few MB at a time."""
    with _open(path) as f:
        f.write(head)
        buf, size, first = [], 0, True
        for item in items:
            buf.append(item if first else sep + item)
            first = False
            size += len(item)
            if size > 4 << 20:
                f.write(b"".join(buf))
                buf, size = [], 0
        f.write(b"".join(buf) + tail)
    return path


def _distinct(i: int, chars: int) -> bytes:
    """A string of `chars` characters that no other `i` gives (and that gzip packs well, as real names do)."""
    head = b"%010d" % i
    return head + b"x" * (chars - len(head))


# -- Chrome/Kineto JSON ---------------------------------------------------------------------------------------------

_KINETO_HEAD = b'{"schemaVersion":1,"traceEvents":['
_KINETO_TAIL = b"]}"


def _kineto_event(i: int, name: bytes = b"k", args: bytes = b"") -> bytes:
    return (b'{"ph":"X","cat":"kernel","name":"%s","pid":0,"tid":7,"ts":%d,"dur":1%s}'
            % (name, i, b',"args":{"note":"' + args + b'"}' if args else b""))


def kineto_distinct_names(stem: Path, scale: float, suffix=".json.gz") -> Path:
    """200 k events (4 KB names, each distinct): 800 MB of names."""
    return _write_chunks(Path(f"{stem}{suffix}"), _KINETO_HEAD,
                         (_kineto_event(i, _distinct(i, 4096)) for i in range(_n(200_000, scale))), _KINETO_TAIL)


def kineto_large_args(stem: Path, scale: float, suffix=".json.gz") -> Path:
    """100 k events with 10 KB of args each (distinct): 1 GB of args."""
    return _write_chunks(Path(f"{stem}{suffix}"), _KINETO_HEAD,
                         (_kineto_event(i, b"k", _distinct(i, 10_000)) for i in range(_n(100_000, scale))),
                         _KINETO_TAIL)


def kineto_tiny_events(stem: Path, scale: float, suffix=".json") -> Path:
    """3 M tiny events."""
    return _write_chunks(Path(f"{stem}{suffix}"), _KINETO_HEAD,
                         (_kineto_event(i) for i in range(_n(3_000_000, scale))), _KINETO_TAIL)


def kineto_whitespace(stem: Path, scale: float, suffix=".json.gz") -> Path:
    """1 GB of whitespace between the events of the array."""
    blank = b" " * (1 << 20)
    return _write_chunks(Path(f"{stem}{suffix}"), _KINETO_HEAD,
                         (_kineto_event(i) + blank for i in range(_n(1000, scale))), _KINETO_TAIL)


def kineto_huge_string(stem: Path, scale: float, suffix=".json") -> Path:
    """One name of 500 MB."""
    return _write_chunks(Path(f"{stem}{suffix}"), _KINETO_HEAD,
                         [_kineto_event(0), _kineto_event(1, b"x" * _n(500 << 20, scale))], _KINETO_TAIL)


# -- Perfetto protobuf (encoded by hand: a few bytes a packet) -------------------------------------------------------

def _num(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _packet(body: bytes) -> bytes:
    return _field(1, body)  # Trace.packet


_SEQ = _num(10, 1)  # TracePacket.trusted_packet_sequence_id
_THREAD_TRACK = _packet(_field(60, _num(1, 1) + _field(4, _num(1, 10) + _num(2, 11))))  # track_descriptor: uuid, thread


_BEGIN, _END = (_num(9, kind) + _num(11, 1) for kind in (1, 2))  # TrackEvent type (begin, end), track_uuid 1


def _slice(ts: int, begin: bool, name: bytes = b"", iid: int = 0) -> bytes:
    """A TrackEvent slice begin or end on track 1 (TracePacket: timestamp 8, track_event 11; TrackEvent: type 9,
    track_uuid 11, name_iid 10, name 23). Millions are written: the constant parts are encoded once."""
    event = (_BEGIN if begin else _END) + (_num(10, iid) if iid else b"") + (_field(23, name) if name else b"")
    return _packet(_num(8, ts) + _SEQ + _field(11, event))


def perfetto_distinct_names(stem: Path, scale: float) -> Path:
    """200 k slices, each named by a distinct 4 KB string (not interned)."""
    def slices():
        for i in range(_n(200_000, scale)):
            yield _slice(10 * i + 1, True, _distinct(i, 4096)) + _slice(10 * i + 5, False)
    return _write_chunks(Path(f"{stem}.perfetto-trace.gz"), _THREAD_TRACK, slices(), b"", sep=b"")


def perfetto_interned_names(stem: Path, scale: float) -> Path:
    """3 M interned event names (InternedData.event_names: iid 1, name 2), a slice naming each."""
    n = _n(3_000_000, scale)
    cleared = _num(13, 1)  # sequence_flags: SEQ_INCREMENTAL_STATE_CLEARED

    def packets():
        step = 10_000
        for start in range(0, n, step):
            names = b"".join(_field(2, _num(1, i + 1) + _field(2, b"name %d of the interned table" % i))
                             for i in range(start, min(n, start + step)))
            yield _packet(_SEQ + (cleared if start == 0 else b"") + _field(12, names))
        for i in range(n):
            yield _slice(10 * i + 1, True, iid=i + 1) + _slice(10 * i + 5, False)
    return _write_chunks(Path(f"{stem}.perfetto-trace.gz"), _THREAD_TRACK, packets(), b"", sep=b"")


def perfetto_tiny_packets(stem: Path, scale: float) -> Path:
    """3 M tiny packets (a timestamp and a sequence id each: no event), then one slice."""
    n = _n(3_000_000, scale)
    return _write_chunks(Path(f"{stem}.perfetto-trace.gz"), _THREAD_TRACK,
                         (_packet(_num(8, i + 1) + _SEQ) for i in range(n)),
                         _slice(n + 1, True, b"k") + _slice(n + 5, False), sep=b"")


# -- rocprofv3 JSON --------------------------------------------------------------------------------------------------

def _rocprof_head(symbols: bytes) -> bytes:
    ops = b'{"kind":"NONE","operations":[]},' * 11 + b'{"kind":"KERNEL_DISPATCH","operations":["NONE","ENQUEUE",' \
        b'"COMPLETE"]}'
    return (b'{"rocprofiler-sdk-tool":[{"metadata":{"pid":42,"node":{"hostname":"node7"}},"agents":[{"id":{"handle":'
            b'1},"type":1,"name":"cpu"},{"id":{"handle":2},"type":2,"name":"gfx942","product_name":"AMD Instinct '
            b'MI300X","gpu_index":0,"cu_count":304}],"strings":{"buffer_records":[' + ops + b']},"kernel_symbols":['
            + symbols + b'],"buffer_records":{"kernel_dispatch":[')


_ROCPROF_TAIL = b"]}}]}"


def _symbol(i: int, name: bytes) -> bytes:
    return b'{"kernel_id":%d,"kernel_name":"k%d.kd","formatted_kernel_name":"%s"}' % (i, i, name)


def _dispatch(i: int, kernel: int = 0) -> bytes:
    return (b'{"kind":11,"operation":2,"thread_id":43,"correlation_id":{"internal":%d,"external":0},'
            b'"start_timestamp":%d,"end_timestamp":%d,"dispatch_info":{"agent_id":{"handle":2},"queue_id":'
            b'{"handle":9},"kernel_id":%d,"dispatch_id":%d,"grid_size":{"x":512,"y":1,"z":1}}}'
            % (i + 1, 1000 * i, 1000 * i + 600, kernel, i + 1))


def rocprof_many_records(stem: Path, scale: float) -> Path:
    """3 M kernel dispatches."""
    return _write_chunks(Path(f"{stem}_results.json.gz"), _rocprof_head(_symbol(0, b"gemm")),
                         (_dispatch(i) for i in range(_n(3_000_000, scale))), _ROCPROF_TAIL)


def rocprof_whitespace(stem: Path, scale: float) -> Path:
    """1 GB of whitespace between the dispatches."""
    blank = b" " * (1 << 20)
    return _write_chunks(Path(f"{stem}_results.json.gz"), _rocprof_head(_symbol(0, b"gemm")),
                         (_dispatch(i) + blank for i in range(_n(1000, scale))), _ROCPROF_TAIL)


def rocprof_many_symbols(stem: Path, scale: float) -> Path:
    """1 M kernel symbols of 300-character names, each dispatched once."""
    n = _n(1_000_000, scale)
    symbols = b",".join(_symbol(i, _distinct(i, 300)) for i in range(n))
    return _write_chunks(Path(f"{stem}_results.json.gz"), _rocprof_head(symbols),
                         (_dispatch(i, i) for i in range(n)), _ROCPROF_TAIL)


def rocprof_huge_name(stem: Path, scale: float) -> Path:
    """One kernel symbol whose name has 500 MB."""
    return _write_chunks(Path(f"{stem}_results.json"), _rocprof_head(_symbol(0, b"k" * _n(500 << 20, scale))),
                         (_dispatch(i) for i in range(10)), _ROCPROF_TAIL)


# -- Nsight SQLite ---------------------------------------------------------------------------------------------------

def _nsys(stem: Path, kernels: int, names: int, name_chars: int) -> Path:
    path = nsys_export(Path(f"{stem}.sqlite"), kernels, huge=name_chars if names == 1 else 10)
    if names > 1:  # every kernel its own name
        with sqlite3.connect(path) as con:
            con.execute(f"""INSERT INTO StringIds WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n
                            WHERE i + 1 < {names}) SELECT 100 + i, printf('%010d', i) ||
                            replace(hex(zeroblob({name_chars // 2})), '0', 'x') FROM n""")
            con.execute(f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 100 + (correlationId % {names})")
    return path


def nsys_many_kernels(stem: Path, scale: float) -> Path:
    """3 M kernels (and their 3 M launches)."""
    return _nsys(stem, _n(3_000_000, scale), 1, 10)


def nsys_distinct_names(stem: Path, scale: float) -> Path:
    """200 k kernels, each named by a distinct 4 KB string."""
    n = _n(200_000, scale)
    return _nsys(stem, n, n, 4096)


def nsys_huge_string(stem: Path, scale: float) -> Path:
    """One name of 300 MB."""
    return _nsys(stem, 10, 1, _n(300 << 20, scale))


# -- torch_npu: trace_view.json and the .db export --------------------------------------------------------------------

def _ascend_path(stem: Path, gz: bool) -> Path:
    folder = Path(f"{stem}_ascend_pt") / "ASCEND_PROFILER_OUTPUT"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / ("trace_view.json.gz" if gz else "trace_view.json")


_NPU = 3096504 << 10 | 1 << 5
_ASCEND_HEAD = (b'[{"ph":"M","name":"process_name","pid":%d,"tid":0,"args":{"name":"Ascend Hardware"}},'
                % _NPU)


def _task(i: int, name: bytes = b"k") -> bytes:
    return (b'{"ph":"X","name":"%s","pid":%d,"tid":7,"ts":"%d.930","dur":0.5,"args":{"Task Type":"AI_CORE",'
            b'"Physic Stream Id":7,"Task Id":%d}}' % (name, _NPU, 1736408883688177 + i, i))


def ascend_whitespace(stem: Path, scale: float) -> Path:
    """1 GB of whitespace between the tasks of a gzipped trace_view.json."""
    blank = b" " * (1 << 20)
    return _write_chunks(_ascend_path(stem, True), _ASCEND_HEAD, (_task(i) + blank for i in range(_n(1000, scale))),
                         b"]")


def ascend_distinct_names(stem: Path, scale: float) -> Path:
    """200 k tasks, each named by a distinct 4 KB string."""
    return _write_chunks(_ascend_path(stem, True), _ASCEND_HEAD,
                         (_task(i, _distinct(i, 4096)) for i in range(_n(200_000, scale))), b"]")


def ascend_db_many_tasks(stem: Path, scale: float) -> Path:
    """The bundled torch_npu database with 2 M more device tasks, each a kernel of a distinct 300-character
    name."""
    n = _n(2_000_000, scale)
    src = DATASETS / "torch_npu_db_level1" / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db"
    folder = Path(f"{stem}_ascend_pt") / "ASCEND_PROFILER_OUTPUT"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / src.name
    shutil.copyfile(src, path)
    with sqlite3.connect(path) as con:
        base_id = con.execute("SELECT max(id) + 1 FROM STRING_IDS").fetchone()[0]
        task_id = con.execute("SELECT max(globalTaskId) + 1 FROM TASK").fetchone()[0]
        start = con.execute("SELECT max(endNs) FROM TASK").fetchone()[0]
        row = con.execute("SELECT deviceId, globalPid, t.taskType, contextId, streamId FROM TASK t JOIN "
                          "COMPUTE_TASK_INFO c USING (globalTaskId) LIMIT 1").fetchone()
        series = f"WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {n})"
        con.execute(f"INSERT INTO STRING_IDS {series} SELECT {base_id} + i, printf('%010d', i) || "
                    "replace(hex(zeroblob(145)), '0', 'x') FROM n")
        con.execute(f"INSERT INTO TASK {series} SELECT {start} + 1000 * i, {start} + 1000 * i + 500, {row[0]}, "
                    f"NULL, {task_id} + i, {row[1]}, {row[2]}, {row[3]}, {row[4]}, i, 0, 0 FROM n")
        con.execute(f"INSERT INTO COMPUTE_TASK_INFO (name, globalTaskId, blockDim, taskType, opType) {series} "
                    f"SELECT {base_id} + i, {task_id} + i, 8, {row[2]}, {base_id} + i FROM n")
    return path


def rocpd_many_dispatches(stem: Path, scale: float) -> Path:
    """The bundled rocpd database with 2 M more kernel dispatches, each of a kernel symbol with a distinct
    300-character name."""
    n = _n(2_000_000, scale)
    src = DATASETS / "rocprofv3_mi350x_rocpd" / "908_results.db"
    path = Path(f"{stem}_results.db")
    shutil.copyfile(src, path)
    with sqlite3.connect(path) as con:
        def table(prefix: str) -> str:
            return con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE ?",
                               (prefix + "_0%",)).fetchone()[0]
        dispatch, symbol = table("rocpd_kernel_dispatch"), table("rocpd_info_kernel_symbol")
        first_id, first_symbol = (con.execute(f'SELECT max(id) + 1 FROM "{t}"').fetchone()[0] for t in (dispatch, symbol))
        start = con.execute(f'SELECT max("end") FROM "{dispatch}"').fetchone()[0]
        series = f"WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < {n})"
        symbol_columns = [r[1] for r in con.execute(f'PRAGMA table_info("{symbol}")')]
        chosen = {"id": f"{first_symbol} + i",
                  "kernel_name": "printf('%010d', i) || replace(hex(zeroblob(145)), '0', 'k') || '.kd'",
                  "display_name": "printf('%010d', i) || replace(hex(zeroblob(145)), '0', 'k')"}
        con.execute(f'INSERT INTO "{symbol}" {series} SELECT '
                    + ", ".join(chosen.get(c, f'"{c}"') for c in symbol_columns)
                    + f' FROM n, (SELECT * FROM "{symbol}" LIMIT 1)')
        dispatch_columns = [r[1] for r in con.execute(f'PRAGMA table_info("{dispatch}")')]
        chosen = {"id": f"{first_id} + i", "dispatch_id": f"{first_id} + i", "kernel_id": f"{first_symbol} + i",
                  "start": f"{start} + 1000 * i", "end": f"{start} + 1000 * i + 500"}
        con.execute(f'INSERT INTO "{dispatch}" {series} SELECT '
                    + ", ".join(chosen.get(c, f'"{c}"') for c in dispatch_columns)
                    + f' FROM n, (SELECT * FROM "{dispatch}" LIMIT 1)')
    return path


def rocprof_csv_many_rows(stem: Path, scale: float) -> Path:
    """The bundled rocprofv3 CSV kernel trace with 3 M dispatches of distinct 300-character kernel names."""
    n = _n(3_000_000, scale)
    src = DATASETS / "rocprofv3_mi350x_csv"
    shutil.copyfile(src / "908_agent_info.csv", Path(f"{stem}_agent_info.csv"))
    path = Path(f"{stem}_kernel_trace.csv")
    with open(src / "908_kernel_trace.csv", newline="") as f:
        header = f.readline()
    with open(path, "w") as f:
        f.write(header)
        for i in range(n):
            name = f"{i:010d}" + "k" * 290
            f.write(f'"KERNEL_DISPATCH","Agent 2",18,567,1229,{i + 1},{i + 1},"{name}",{i + 1},'
                    f'{1_000_000 + 1000 * i},{1_000_500 + 1000 * i},0,0,8,0,16,256,1,1,1024,1,1\n')
    return path


# -- XPlane ----------------------------------------------------------------------------------------------------------

def xplane_many_events(stem: Path, scale: float) -> Path:
    """3 M kernels on one stream line."""
    return xplane_trace(Path(f"{stem}.xplane.pb"), _n(1_500_000, scale), huge=20)


def xplane_distinct_names(stem: Path, scale: float) -> Path:
    """200 k event metadata of distinct 4 KB names, an event of each."""
    n = _n(200_000, scale)
    # XSpace.planes 1; XPlane: id 1, name 2, lines 3, event_metadata 4 (map<int64, XEventMetadata>: key 1,
    # value 2; XEventMetadata: id 1, name 2); XLine: id 1, name 2, timestamp_ns 3, events 4; XEvent:
    # metadata_id 1, offset_ps 2, duration_ps 3
    path = Path(f"{stem}.xplane.pb")
    with open(path, "wb") as f:
        body = _num(1, 1) + _field(2, b"/device:GPU:0")
        metadata = b"".join(_field(4, _num(1, i + 1) + _field(2, _num(1, i + 1) + _field(2, _distinct(i, 4096))))
                            for i in range(n))
        events = b"".join(_field(4, _num(1, i + 1) + _num(2, 1_000_000 * i) + _num(3, 600_000)) for i in range(n))
        line = _field(3, _num(1, 7) + _field(2, b"Stream #7(Kernel)") + _num(3, 1_700_000_000_000_000_000) + events)
        f.write(_field(1, body + metadata + line))
    return path


@dataclass(frozen=True)
class Shape:
    reader: str
    name: str
    make: Callable[[Path, float], Path]

    @property
    def id(self) -> str:
        return f"{self.reader}-{self.name}"


SHAPES = [
    Shape("kineto", "distinct-names-gz", kineto_distinct_names),
    Shape("kineto", "large-args-gz", kineto_large_args),
    Shape("kineto", "tiny-events", kineto_tiny_events),
    Shape("kineto", "whitespace-gz", kineto_whitespace),
    Shape("kineto", "huge-string", kineto_huge_string),
    Shape("perfetto", "distinct-names-gz", perfetto_distinct_names),
    Shape("perfetto", "interned-names-gz", perfetto_interned_names),
    Shape("perfetto", "tiny-packets-gz", perfetto_tiny_packets),
    Shape("rocprof", "many-records-gz", rocprof_many_records),
    Shape("rocprof", "whitespace-gz", rocprof_whitespace),
    Shape("rocprof", "many-symbols-gz", rocprof_many_symbols),
    Shape("rocprof", "huge-name", rocprof_huge_name),
    Shape("nsys", "many-kernels", nsys_many_kernels),
    Shape("nsys", "distinct-names", nsys_distinct_names),
    Shape("nsys", "huge-string", nsys_huge_string),
    Shape("torch_npu", "whitespace-gz", ascend_whitespace),
    Shape("torch_npu", "distinct-names-gz", ascend_distinct_names),
    Shape("torch_npu_db", "many-tasks", ascend_db_many_tasks),
    Shape("rocpd", "many-dispatches", rocpd_many_dispatches),
    Shape("rocprof_csv", "many-rows", rocprof_csv_many_rows),
    Shape("xplane", "many-events", xplane_many_events),
    Shape("xplane", "distinct-names", xplane_distinct_names),
]


def _tree_anon_kb(root: int) -> int:
    """RssAnon (kB) of `root` and every process descending from it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"RssAnon:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total


def peak_tree_memory(cmd: list[str], cwd: Path, timeout: float = TIMEOUT_S, env: dict | None = None) -> dict:
    """Run `cmd`; its exit status, stderr, seconds and the peak RssAnon of its whole process tree (the heap,
    which the kernel cannot drop and read again, unlike the pages of memory-mapped files), sampled every 20 ms."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, start_new_session=True,
                            env={**os.environ, **(env or {})})
    peak, done = [0], threading.Event()

    def sample():
        while not done.wait(0.02):
            peak[0] = max(peak[0], _tree_anon_kb(proc.pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        err += f"\n(killed after {timeout:.0f} s)".encode()
    done.set()
    thread.join()
    return {"exit": proc.returncode, "stderr": err.decode(errors="replace"), "seconds": time.perf_counter() - start,
            "peak_mb": peak[0] / 1024}


def ingest_shape(shape: Shape, folder: Path, scale: float = 1.0, limit: str = LIMIT) -> dict:
    """Make `shape` in `folder`, ingest it at `limit` in a fresh process; the measurement, with the input's
    size and path. The caller removes `folder`."""
    t = time.perf_counter()
    trace = shape.make(folder / "trace", scale)
    made = time.perf_counter() - t
    cmd = [sys.executable, "-m", "tracesql", "ingest", "-q", str(trace), "-o", str(folder / "run"), "-j", "1",
           "--memory-limit", limit]
    m = peak_tree_memory(cmd, folder, env={"PYTHONPATH": str(REPO)})
    return {**m, "trace": trace, "input_mb": trace.stat().st_size / 2**20, "make_s": made}


def outcome_problem(m: dict) -> str | None:
    """What is wrong with a measured ingest (None: within the bound, and a run or a one-line refusal naming the
    file)."""
    lines = m["stderr"].strip().splitlines()
    if m["peak_mb"] > BOUND_MB:
        return f"peak {m['peak_mb']:.0f} MB > {BOUND_MB} MB"
    if m["exit"] == 0:
        return None
    if m["exit"] == 1 and len(lines) == 1 and lines[0].startswith(f"Error: {m['trace']}: "):
        return None
    return f"exit {m['exit']}: {m['stderr'][-600:]}"


def main(argv: list[str]) -> int:
    import argparse
    import re
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.memory")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--only", default="")
    parser.add_argument("--limit", default=LIMIT)
    args = parser.parse_args(argv)
    bad = 0
    for shape in SHAPES:
        if not re.search(args.only, shape.id):
            continue
        folder = Path(tempfile.mkdtemp(prefix="tracesql-memfuzz-"))
        try:
            m = ingest_shape(shape, folder, args.scale, args.limit)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        problem = outcome_problem(m)
        bad += problem is not None
        what = "run" if m["exit"] == 0 else m["stderr"].strip().splitlines()[-1][:160] if m["stderr"].strip() else ""
        print(f"{shape.id:32s} {m['input_mb']:8.1f} MB in  peak {m['peak_mb']:6.0f} MB  {m['seconds']:6.1f} s  "
              f"{'OK ' if problem is None else 'BAD'} {what}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
