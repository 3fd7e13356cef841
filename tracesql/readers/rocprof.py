"""rocprofv3 (rocprofiler-sdk) JSON output: `<pid>_results.json[.gz]`, written with `--output-format json`.

The file holds one object per profiled process under "rocprofiler-sdk-tool". Timed records sit in
`buffer_records` by domain; their names are indices into lookup tables of the same file (`strings.buffer_records`
for API operations, `kernel_symbols` for kernels), and their agents are handles into `agents`.

Speed and memory: the records and kernel symbols are nearly all of a file, and are never Python objects. The
(unpacked) file is memory-mapped; each record array is cut into chunks of whole records, each checked by msgspec
(a chunk that is not whole records is cut elsewhere; msgspec also says where an array ends), and copied to a
scratch file of its own, which DuckDB's JSON reader parses into typed columns; one DuckDB query joins them with
the small lookup tables and writes the slices, batch by batch, to a memory-mapped scratch file. What remains of
the file (metadata, agents, operation names: a "skeleton" with each carved array replaced by its number, at most
SKELETON_MAX_BYTES) is decoded by msgspec. Memory: a chunk, the skeleton and DuckDB's working memory (the limit).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import msgspec

from .. import db, limits
from ..errors import TraceError
from .common import MAX_NAME_CHARS, OUT_BATCH_ROWS, decode_json

FORMAT = "rocprof"
SUFFIXES = ("_results.json", "_results.json.gz")
SUFFIXES_OF_STEM = (".json", ".json.gz")  # `<pid>_results` + these: the JSON export of a process

_TOOL_KEY = b'"rocprofiler-sdk-tool"'

# API domains of `buffer_records` -> slices.kind; each record is one call on a host thread.
API_KINDS = {"hip_api": "runtime", "hsa_api": "driver", "marker_api": "user_annotation", "rccl_api": "cpu_op"}
DEVICE_DOMAINS = ("kernel_dispatch", "memory_copy")
GPU_AGENT_TYPE = 2  # rocprofiler_agent_type_t: 1 CPU, 2 GPU

CHUNK_BYTES = 4 << 20  # records are cut and checked this many bytes at a time
MAX_RECORD_BYTES = 16 << 20  # a record (or kernel symbol) longer than this is refused: no real one is
SKELETON_MAX_BYTES = 32 << 20  # the file less its record arrays and kernel symbols (~1 MB in real files)
_MAX_CUT_TRIES = 64


def detect(path: Path, head: bytes) -> bool:
    text = head.lstrip()
    return text[:1] == b"{" and _TOOL_KEY in text[:4096]


class _Metadata(msgspec.Struct):
    pid: int = 0
    node: dict = {}
    init_time: int | None = None
    fini_time: int | None = None
    command: list[str] = []


class _Strings(msgspec.Struct):
    buffer_records: list[dict] = []
    marker_api: object = ()  # a list of {"key": correlation id, "value": the roctx message}


class _Process(msgspec.Struct):
    metadata: _Metadata = msgspec.field(default_factory=_Metadata)
    agents: list[dict] = []
    strings: _Strings = msgspec.field(default_factory=_Strings)
    kernel_symbols: int | None = None  # the number of its carved array
    buffer_records: int | None = None  # the number of its carved object of record arrays


class _Skeleton(msgspec.Struct, rename={"processes": "rocprofiler-sdk-tool"}):
    processes: list[_Process]


# Where the carved parts are: keys that open them (a key is `"name"` after `{` or `,`: that cannot be inside a
# string, whose quotes are escaped), and, inside record arrays, the candidates for a cut between two records.
_CARVED = {b'"kernel_symbols"': b"[", b'"buffer_records"': b"{", b'"callback_records"': b"{"}
_COLON = re.compile(rb"\s*:\s*")
_DOMAIN = re.compile(rb'\s*"((?:[^"\\]|\\.)*)"\s*:\s*')
_JSON_TYPES = {ord("["): "array", ord("{"): "object", ord('"'): "str", ord("t"): "bool", ord("f"): "bool",
               ord("n"): "null"}
_CUT = re.compile(rb"}\s*,\s*{")
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_WHITESPACE = b" \t\r\n"


class _Carver:
    """Walks the memory-mapped document once: record arrays and kernel symbols go to files of their own (in
    `scratch`), the rest to the skeleton file."""

    def __init__(self, path: Path, doc, scratch: Path):
        self.path, self.doc, self.scratch = path, doc, scratch
        self.record_files: list[tuple[str, int, str]] = []  # (file, carved object's number, domain)
        self.symbol_files: list[tuple[str, int]] = []  # (file, carved array's number)
        self.unread: dict[str, int] = {}  # records of domains with no slices equivalent
        self.read_records = 0  # records of the domains read
        self.carved = 0

    def run(self) -> Path:
        doc, n = self.doc, len(self.doc)
        skeleton = self.scratch / "skeleton.json"
        written = pos = 0
        found = {key: doc.find(key) for key in _CARVED}
        with open(skeleton, "wb") as out:
            while True:
                for key in found:
                    if 0 <= found[key] < pos:
                        found[key] = doc.find(key, pos)
                hits = [(at, key) for key, at in found.items() if at >= 0]
                if not hits:
                    break
                at, key = min(hits)
                value = self._value_start(at, key)
                if value is None:  # the name appears, but not as such a key
                    found[key] = doc.find(key, at + 1)
                    continue
                written += value - pos
                if written > SKELETON_MAX_BYTES:
                    break
                out.write(doc[pos:value])
                number, self.carved = self.carved, self.carved + 1
                pos = self._symbols(value, number) if key == b'"kernel_symbols"' else \
                    self._record_arrays(value, number, read=key == b'"buffer_records"')
                out.write(str(number).encode())
            written += n - pos
            if written <= SKELETON_MAX_BYTES:
                out.write(doc[pos:n])
        if written > SKELETON_MAX_BYTES:
            raise TraceError(self.path, f"more than {SKELETON_MAX_BYTES >> 20} MB outside the records and kernel "
                                        "symbols (metadata, agents, names): refused as damaged or hostile")
        return skeleton

    def _value_start(self, at: int, key: bytes) -> int | None:
        """Where the value of the key found at `at` starts, if it is a key (after `{` or `,`) whose value opens
        as the carved part does."""
        before = at - 1
        while before >= 0 and self.doc[before] in _WHITESPACE:
            before -= 1
        if before < 0 or self.doc[before] not in b"{,":
            return None
        m = _COLON.match(self.doc, at + len(key))
        if m is None or self.doc[m.end():m.end() + 1] != _CARVED[key]:
            return None
        return m.end()

    def _symbols(self, pos: int, number: int) -> int:
        name = f"symbols-{number:05d}.json"
        with open(self.scratch / name, "wb") as out:
            end, _ = self._array(pos, out)
        self.symbol_files.append((name, number))
        return end

    def _record_arrays(self, pos: int, number: int, read: bool) -> int:
        """An object of record arrays by domain (`buffer_records`, `callback_records`), from its `{` at `pos`:
        each array read (a file of its own) or counted. Returns where the object ends."""
        doc = self.doc
        pos += 1
        while True:
            while pos < len(doc) and doc[pos] in _WHITESPACE:
                pos += 1
            if doc[pos:pos + 1] == b"}":
                return pos + 1
            m = _DOMAIN.match(doc, pos)
            if m is None:
                raise TraceError(self.path, "unreadable buffer_records: expected a domain's array of records")
            domain = m.group(1).decode("utf-8", "replace")
            if doc[m.end():m.end() + 1] != b"[":
                got = _JSON_TYPES.get(doc[m.end()] if m.end() < len(doc) else -1, "int")
                raise TraceError(self.path, f"unreadable {domain} records (Expected `array`, got `{got}`)")
            kept = read and (domain in DEVICE_DOMAINS or domain in API_KINDS)
            if kept:
                name = f"records-{len(self.record_files):05d}.json"
                with open(self.scratch / name, "wb") as out:
                    pos, count = self._array(m.end(), out)
                self.read_records += count
                if count:
                    self.record_files.append((name, number, domain))
            else:
                pos, count = self._array(m.end(), None)
                if read:
                    self.unread[domain] = self.unread.get(domain, 0) + count
            while pos < len(doc) and doc[pos] in _WHITESPACE:
                pos += 1
            if doc[pos:pos + 1] == b",":
                pos += 1
            elif doc[pos:pos + 1] != b"}":
                raise TraceError(self.path, "unreadable buffer_records: expected ',' or '}' after a domain")

    def _array(self, pos: int, out) -> tuple[int, int]:
        """The JSON array opening at `pos` (`[`), cut into chunks of whole elements, each checked by msgspec and
        written to `out` (as one array). Returns (where the array ends, how many elements it has)."""
        doc, n = self.doc, len(self.doc)
        start, count, first = pos + 1, 0, True
        if out:
            out.write(b"[")
        while start < n and doc[start] in _WHITESPACE:
            start += 1
        if doc[start:start + 1] == b"]":
            if out:
                out.write(b"]")
            return start + 1, 0
        while True:
            done, cut, tries = None, None, 0
            search = start + CHUNK_BYTES
            while done is None:
                m = _CUT.search(doc, search, start + CHUNK_BYTES + MAX_RECORD_BYTES) if search < n else None
                cut = m.start() + 1 if m else min(n, start + CHUNK_BYTES + MAX_RECORD_BYTES)
                window = b"[" + doc[start:cut] + b"]"
                try:
                    elements = len(msgspec.json.decode(window, type=list[msgspec.Raw]))
                    done = False  # whole elements, and the array goes on after the cut
                except msgspec.DecodeError as e:
                    trailing = _TRAILING.search(str(e))
                    if trailing:  # the array closed inside the window: it ends there
                        close = window.rfind(b"]", 0, int(trailing.group(1)))
                        elements = len(msgspec.json.decode(window[:close + 1], type=list[msgspec.Raw]))
                        cut, done = start + close - 1, True
                    elif m is None or tries >= _MAX_CUT_TRIES:
                        problem = "truncated" if "truncated" in str(e) and cut >= n else \
                            f"malformed or has a record over {MAX_RECORD_BYTES >> 20} MB ({e})"
                        raise TraceError(self.path, f"unreadable records: the JSON is {problem}") from None
                    else:  # the cut fell inside a record: the next candidate
                        search, tries = m.end() - 1, tries + 1
            if out and cut > start:
                if not first:
                    out.write(b",")
                out.write(doc[start:cut])
                first = False
            count += elements
            if done:
                if out:
                    out.write(b"]")
                return cut + 1, count
            start = m.end() - 1


_RECORD_COLUMNS = {
    "start_timestamp": "BIGINT", "end_timestamp": "BIGINT", "kind": "BIGINT", "operation": "BIGINT",
    "thread_id": "BIGINT", "correlation_id": "STRUCT(internal BIGINT, external BIGINT)",
    "dispatch_info": "STRUCT(agent_id STRUCT(handle BIGINT), queue_id STRUCT(handle BIGINT), kernel_id BIGINT, "
                     "dispatch_id BIGINT, private_segment_size BIGINT, group_segment_size BIGINT, "
                     "workgroup_size STRUCT(x BIGINT, y BIGINT, z BIGINT), grid_size STRUCT(x BIGINT, y BIGINT, "
                     "z BIGINT))",
    "stream_id": "STRUCT(handle BIGINT)", "src_agent_id": "STRUCT(handle BIGINT)",
    "dst_agent_id": "STRUCT(handle BIGINT)", "bytes": "BIGINT",
}
_SYMBOL_COLUMNS = {"kernel_id": "BIGINT", "kernel_name": "VARCHAR", "formatted_kernel_name": "VARCHAR",
                   "demangled_kernel_name": "VARCHAR", "sgpr_count": "BIGINT", "arch_vgpr_count": "BIGINT",
                   "accum_vgpr_count": "BIGINT"}


def _columns(columns: dict[str, str]) -> str:
    return "{" + ", ".join(f"{k}: '{v}'" for k, v in columns.items()) + "}"


_api_kinds = " ".join(f"WHEN '{d}' THEN '{k}'" for d, k in API_KINDS.items())
# Every usable record in file order (slice_id: its position among the records of the domains read), what it is
# (a kernel dispatch, a copy or an API call; a roctx marker named by its message, as rocprofv3's CSV and its rocpd
# converters name it), on which device. The fields a
# record lacks take rocprofiler-sdk's defaults (0), as the SDK's own readers do.
_SLICES = f"""
WITH numbered AS (
    SELECT row_number() OVER () - 1 AS slice_id, *
    FROM read_json($records, format = 'array', filename = true, maximum_object_size = {MAX_RECORD_BYTES},
                   columns = {_columns(_RECORD_COLUMNS)})
), r AS (
    SELECT n.*, f.carved, f.domain, p.pid, p.symbols,
        CASE WHEN n.dispatch_info IS NOT NULL THEN 'kernel' WHEN n.dst_agent_id IS NOT NULL THEN 'memcpy'
             ELSE CASE f.domain {_api_kinds} END END AS what,
        COALESCE(n.kind, 0) AS kind_index, COALESCE(n.operation, 0) AS operation_index,
        COALESCE(n.thread_id, 0) AS thread, COALESCE(n.dispatch_info.queue_id.handle, 0) AS queue,
        CASE WHEN n.stream_id IS NOT NULL THEN COALESCE(n.stream_id.handle, 0) END AS hip_stream
    FROM numbered n JOIN record_files f ON f.file = parse_filename(n.filename)
    JOIN processes p ON p.carved = f.carved
), placed AS (
    SELECT r.*, k.category, o.name AS operation_name, m.message,
        CASE r.what WHEN 'kernel' THEN kernel_agent.device_id
                    WHEN 'memcpy' THEN COALESCE(dst_agent.device_id, src_agent.device_id) END AS device_id,
        s.name AS symbol, s.sgpr_count, s.arch_vgpr_count, s.accum_vgpr_count, k.kind IS NOT NULL AS known_kind
    FROM r
    LEFT JOIN kinds k ON k.carved = r.carved AND k.kind = r.kind_index
    LEFT JOIN operations o ON o.carved = r.carved AND o.kind = r.kind_index AND o.operation = r.operation_index
    LEFT JOIN gpu_agents kernel_agent
        ON kernel_agent.carved = r.carved AND kernel_agent.handle = COALESCE(r.dispatch_info.agent_id.handle, 0)
    LEFT JOIN gpu_agents dst_agent ON dst_agent.carved = r.carved AND dst_agent.handle = r.dst_agent_id.handle
    LEFT JOIN gpu_agents src_agent
        ON src_agent.carved = r.carved AND src_agent.handle = COALESCE(r.src_agent_id.handle, 0)
    LEFT JOIN symbols s ON s.carved = r.symbols AND s.kernel_id = COALESCE(r.dispatch_info.kernel_id, 0)
    LEFT JOIN markers m ON r.domain = 'marker_api' AND m.carved = r.carved
        AND m.correlation = COALESCE(r.correlation_id.internal, 0)
)
SELECT slice_id, what AS kind,
    CASE WHEN known_kind THEN category ELSE domain END AS category,
    CASE what WHEN 'kernel' THEN COALESCE(NULLIF(symbol, ''), 'kernel ' || COALESCE(dispatch_info.kernel_id, 0))
              WHEN 'memcpy' THEN COALESCE(operation_name, 'memory copy ' || operation_index)
              ELSE COALESCE(NULLIF(message, ''), operation_name, domain || ' ' || operation_index) END AS name,
    start_timestamp AS ts, end_timestamp - start_timestamp AS dur, pid, thread AS tid, device_id,
    CASE what WHEN 'kernel' THEN queue WHEN 'memcpy' THEN COALESCE(hip_stream, -1) END AS stream,
    CASE WHEN what IN ('kernel', 'memcpy')
         THEN 'device ' || device_id || ' / stream ' || CASE what WHEN 'kernel' THEN queue ELSE COALESCE(hip_stream, -1) END
         ELSE 'process ' || pid || ' / thread ' || thread END AS track,
    COALESCE(correlation_id.internal, 0) AS correlation, NULLIF(COALESCE(correlation_id.external, 0), 0) AS external_id,
    CASE what
        WHEN 'kernel' THEN json_object(
            'dispatch_id', COALESCE(dispatch_info.dispatch_id, 0), 'kernel_id', COALESCE(dispatch_info.kernel_id, 0),
            'queue', queue, 'hip_stream', hip_stream,
            'grid_size', json_array(COALESCE(dispatch_info.grid_size.x, 0), COALESCE(dispatch_info.grid_size.y, 0),
                                    COALESCE(dispatch_info.grid_size.z, 0)),
            'workgroup_size', json_array(COALESCE(dispatch_info.workgroup_size.x, 0),
                                         COALESCE(dispatch_info.workgroup_size.y, 0),
                                         COALESCE(dispatch_info.workgroup_size.z, 0)),
            'private_segment_size', COALESCE(dispatch_info.private_segment_size, 0),
            'group_segment_size', COALESCE(dispatch_info.group_segment_size, 0),
            'sgpr_count', sgpr_count, 'arch_vgpr_count', arch_vgpr_count, 'accum_vgpr_count', accum_vgpr_count)
        WHEN 'memcpy' THEN json_object('bytes', bytes, 'src_agent', src_agent_id.handle,
                                       'dst_agent', dst_agent_id.handle)
    END AS args,
FROM placed
WHERE what IS NOT NULL AND end_timestamp >= start_timestamp AND (what NOT IN ('kernel', 'memcpy') OR device_id IS NOT NULL)
"""
# Each kernel symbol's names and registers (the last given for a kernel id, as a lookup by id would give).
_SYMBOLS = f"""
CREATE TABLE symbols AS
SELECT f.carved, s.kernel_id,
    left(last(COALESCE(NULLIF(s.formatted_kernel_name, ''), NULLIF(s.demangled_kernel_name, ''), s.kernel_name)
              ORDER BY s.pos), {MAX_NAME_CHARS}) AS name,
    last(s.sgpr_count ORDER BY s.pos) AS sgpr_count, last(s.arch_vgpr_count ORDER BY s.pos) AS arch_vgpr_count,
    last(s.accum_vgpr_count ORDER BY s.pos) AS accum_vgpr_count
FROM (SELECT row_number() OVER () AS pos, * FROM read_json($files, format = 'array', filename = true,
          maximum_object_size = {MAX_RECORD_BYTES}, columns = {_columns(_SYMBOL_COLUMNS)})) s
JOIN symbol_files f ON f.file = parse_filename(s.filename)
WHERE s.kernel_id IS NOT NULL
GROUP BY ALL
"""
_UNUSABLE = "unusable record (negative duration or unknown agent)"


def read(path: Path, threads: int | None = None):
    import duckdb

    from .common import mapped_content

    with tempfile.TemporaryDirectory(prefix="tracesql-") as scratch:
        scratch = Path(scratch)
        with mapped_content(path, scratch) as doc:
            carver = _Carver(path, doc, scratch)
            skeleton = carver.run()
        processes, notes = _decode_skeleton(path, skeleton)
        if not processes:
            raise TraceError(path, "empty trace: 'rocprofiler-sdk-tool' has no process")
        try:
            return _read(path, scratch, carver, processes, notes, threads)
        except duckdb.OutOfMemoryException:  # not the records' fault: the ingest names the file and the limit
            raise
        except duckdb.Error as e:
            raise TraceError(path, f"unreadable records ({str(e).splitlines()[0][:300]})") from None


def _decode_skeleton(path: Path, skeleton: Path) -> tuple[list[_Process], list[str]]:
    notes = []
    data = skeleton.read_bytes()  # at most SKELETON_MAX_BYTES
    try:
        decoded, replaced = decode_json(data, _Skeleton)  # msgspec checks UTF-8 in the strings it decodes
        processes = decoded.processes
        if replaced:
            notes.append("invalid UTF-8 in strings replaced by U+FFFD")
    except msgspec.ValidationError as e:
        raise TraceError(path, f"not a rocprofv3 JSON trace ({e})") from None
    except msgspec.DecodeError as e:
        raise TraceError(path, f"not valid JSON ({e})") from None
    return processes, notes


def _read(path: Path, scratch: Path, carver: _Carver, processes: list[_Process], notes: list[str], threads):
    from .common import TraceData, mapped_slices

    lim = limits.current()
    con = db.connect(threads, lim.memory, database=scratch / "rocprof.duckdb")
    # the records stream through; joins build their hash tables on the lookup tables, never on the stream (whose
    # size DuckDB cannot tell)
    con.execute("SET disabled_optimizers = 'build_side_probe_side'")
    try:
        devices = _lookups(con, processes, carver, scratch)
        kept = [0]

        def usable_slices():
            if not carver.record_files:
                return
            reader = con.sql(_SLICES, params={"records": [str(scratch / f) for f, _, _ in carver.record_files]}
                             ).to_arrow_reader(OUT_BATCH_ROWS)
            for batch in reader:
                if lim.max_events:
                    batch = batch.slice(0, lim.max_events - kept[0])
                kept[0] += batch.num_rows
                yield batch
                if lim.max_events and kept[0] >= lim.max_events:
                    break

        mapping = mapped_slices(scratch / "slices.arrows", usable_slices())
    finally:
        con.close()
    slices = mapping.table()
    if not slices.num_rows:
        raise TraceError(path, "no timed records (no kernel dispatch, memory copy or API call)")
    if lim.max_events and kept[0] >= lim.max_events:
        notes.append(f"read only the first {lim.max_events:,} records (--max-events)")
    first = processes[0].metadata
    unread = carver.unread
    skipped = [0 if lim.max_events else carver.read_records - slices.num_rows]
    return TraceData(
        format=FORMAT,
        slices=slices,
        host_name=first.node.get("hostname"),
        event_count=slices.num_rows + skipped[0] + sum(unread.values()),
        skipped={_UNUSABLE: skipped[0]} if skipped[0] else {},
        notes=notes + [f"{n} {domain} records not kept (no table for them yet)" for domain, n in unread.items() if n],
        metadata={"processes": [{"pid": p.metadata.pid, "command": p.metadata.command,
                                 "init_time": p.metadata.init_time, "fini_time": p.metadata.fini_time}
                                for p in processes], "node": first.node},
        devices=sorted(devices.values(), key=lambda d: d["device_id"]),
        mappings=[mapping],
    )


def _lookups(con, processes: list[_Process], carver: _Carver, scratch: Path) -> dict[int, dict]:
    """The small tables the slices query joins (processes, agents, operation names, kernel symbols, which file
    holds what); returns the devices by id."""
    rows = {name: [] for name in _LOOKUPS}
    devices: dict[int, dict] = {}
    for proc in processes:
        agents = {a.get("id", {}).get("handle"): a for a in proc.agents if isinstance(a.get("id"), dict)}
        gpus = {h: agent_device_id(a) for h, a in agents.items()
                if a.get("type") == GPU_AGENT_TYPE and isinstance(h, int)}
        for handle, device_id in gpus.items():
            devices.setdefault(device_id, agent_device(device_id, agents[handle]))
        if proc.buffer_records is None:
            continue
        carved = proc.buffer_records
        rows["processes"].append((carved, proc.metadata.pid, proc.kernel_symbols))
        rows["gpu_agents"] += [(carved, handle, device_id) for handle, device_id in gpus.items()]
        listed = proc.strings.marker_api if isinstance(proc.strings.marker_api, list) else ()
        messages = {m["key"]: _text(m.get("value")) for m in listed
                    if isinstance(m, dict) and isinstance(m.get("key"), int) and -2**63 <= m["key"] < 2**63}
        rows["markers"] += [(carved, key, message) for key, message in messages.items()]
        for k, domain in enumerate(proc.strings.buffer_records):
            rows["kinds"].append((carved, k, _text(domain.get("kind"))))
            rows["operations"] += [(carved, k, o, _text(name)) for o, name in enumerate(domain.get("operations") or [])]
    rows["record_files"] = carver.record_files
    rows["symbol_files"] = carver.symbol_files
    for name, columns in _LOOKUPS.items():
        # one statement per table, its columns as lists (executemany takes 0.3 ms a row)
        values = [list(column) for column in zip(*rows[name])] or [[] for _ in columns]
        selects = ", ".join(f"unnest(${i}::{t.split()[1]}[]) AS {t.split()[0]}" for i, t in enumerate(columns, 1))
        con.execute(f"CREATE TABLE {name} AS SELECT {selects}", values)
    if carver.symbol_files:
        con.execute(_SYMBOLS, {"files": [str(scratch / f) for f, _ in carver.symbol_files]})
    else:
        con.execute("CREATE TABLE symbols (carved BIGINT, kernel_id BIGINT, name VARCHAR, sgpr_count BIGINT, "
                    "arch_vgpr_count BIGINT, accum_vgpr_count BIGINT)")
    return devices


_LOOKUPS = {"processes": ("carved BIGINT", "pid BIGINT", "symbols BIGINT"),
            "gpu_agents": ("carved BIGINT", "handle BIGINT", "device_id INTEGER"),
            "kinds": ("carved BIGINT", "kind BIGINT", "category VARCHAR"),
            "operations": ("carved BIGINT", "kind BIGINT", "operation BIGINT", "name VARCHAR"),
            "markers": ("carved BIGINT", "correlation BIGINT", "message VARCHAR"),
            "record_files": ("file VARCHAR", "carved BIGINT", "domain VARCHAR"),
            "symbol_files": ("file VARCHAR", "carved BIGINT")}


def _text(value) -> str | None:
    return (value if isinstance(value, str) or value is None else json.dumps(value))[:MAX_NAME_CHARS] \
        if value is not None else None


def agent_device_id(agent: dict) -> int:
    """The GPU's index as HIP numbers devices (gpu_index), else its index among GPU nodes."""
    for key in ("gpu_index", "logical_node_type_id"):
        if isinstance(agent.get(key), int) and agent[key] >= 0:
            return agent[key]
    return agent.get("node_id", 0)


def agent_device(device_id: int, agent: dict) -> dict:
    banks = agent.get("mem_banks") or []
    local = sum(b.get("size_in_bytes", 0) for b in banks if isinstance(b, dict) and b.get("heap_type") == 1)
    return {
        "device_id": device_id,
        "name": agent.get("product_name") or agent.get("name") or None,
        "total_memory_bytes": local or None,
        "compute_capability": agent.get("name") or None,  # the gfx target, e.g. 'gfx950'
        "sm_count": agent.get("cu_count"),
        "properties": agent,
    }

