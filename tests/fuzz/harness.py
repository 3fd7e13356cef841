"""Fuzzing every reader: hypothesis mutates small real traces and each mutant is ingested by a worker process.

Table-driven over `tracesql.readers.READERS`: a reader's seeds are the bundled datasets and small corpus files it
detects (plus a Perfetto file converted from a real Kineto trace, as no real one is bundled), shrunk so that one
input takes a fraction of a second. A reader added to READERS is fuzzed as soon as some seed is detected as its.

Mutations: JSON seeds are parsed and changed where they mean something (deleted keys, wrong types, huge numbers,
NaN/Infinity, deep nesting, duplicate and overlapping events, negative durations), then every seed's bytes are
changed (truncation, bit flips, invalid UTF-8, spliced or zeroed chunks, gzip).

Outcome of each input, checked in a separate worker process (RLIMIT_AS caps its memory, a timeout catches
hangs): the ingest succeeds and a query runs on the run, or it raises TraceError with one line naming the file.
Anything else (another exception, a crash, a hang, running out of memory) is a failure, keyed by the exception
type and the innermost tracesql frame so that one bug found many times counts once.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import select
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))  # conftest, test_perfetto (the Kineto -> Perfetto converter)

from conftest import CORPUS, DATASETS  # noqa: E402

from tracesql import readers  # noqa: E402

SEED_ITEMS = 120  # a JSON list longer than this keeps this many evenly spaced items
SQLITE_ROWS = 150  # rows kept per table of an SQLite seed
MAX_SEED_BYTES = 2_500_000  # corpus files above this are not used as seeds
SEEDS_PER_READER = 3
TIMEOUT_S = float(os.environ.get("TRACESQL_FUZZ_TIMEOUT", 60))
MEMORY_LIMIT = int(os.environ.get("TRACESQL_FUZZ_MEMORY", 4 << 30))


@dataclass(frozen=True)
class Seed:
    reader: str
    origin: str
    data: bytes  # decompressed
    suffix: str  # the file name suffix the reader is found under

    @property
    def is_json(self) -> bool:
        return self.data.lstrip()[:1] in (b"{", b"[")


# ---------------------------------------------------------------------------------------------------- seeds

def _content(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


def _shrink_json(value):
    if isinstance(value, list):
        if len(value) > SEED_ITEMS:
            step = len(value) / SEED_ITEMS
            value = [value[int(i * step)] for i in range(SEED_ITEMS)]
        return [_shrink_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _shrink_json(v) for k, v in value.items()}
    return value


def _shrink_sqlite(data: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "seed.sqlite"
        path.write_bytes(data)
        con = sqlite3.connect(path)
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for t in tables:
            con.execute(f'DELETE FROM "{t}" WHERE rowid NOT IN '
                        f'(SELECT rowid FROM "{t}" ORDER BY rowid LIMIT {SQLITE_ROWS})')
        con.commit()
        con.execute("VACUUM")
        con.close()
        return path.read_bytes()


def _suffix(path: Path, reader) -> str:
    name = path.name
    for s in sorted(reader.SUFFIXES, key=len, reverse=True):
        if name.endswith(s):
            return s[:-3] if s.endswith(".gz") else s
    return reader.SUFFIXES[0]


#: Seeds kept in the repository, so that every reader is fuzzed without the corpus (CI): small real files of the
#: formats no bundled dataset has (see seeds/SOURCE.md), and the inputs of past failures (`regression-*`), which
#: are always used, beyond SEEDS_PER_READER.
KEPT_SEEDS = Path(__file__).resolve().parent / "seeds"


def _candidates(scratch: Path) -> list[Path]:
    files = sorted(p for p in KEPT_SEEDS.iterdir() if p.is_file() and p.suffix in (".gz", ".json", ".sqlite"))
    files += sorted(p for p in DATASETS.rglob("*") if p.is_file()
                    and p.suffix in (".gz", ".pb", ".json", ".sqlite", ".db", ".csv"))
    if CORPUS.exists():
        files += sorted((p for p in CORPUS.rglob("*") if p.is_file() and p.stat().st_size <= MAX_SEED_BYTES
                         and "reference" not in p.parts), key=lambda p: p.stat().st_size)
    files.append(_perfetto_seed(scratch))
    return files


def _perfetto_seed(scratch: Path) -> Path:
    """A Perfetto trace made from the first events of a real Kineto trace (no real Perfetto file is bundled)."""
    from test_perfetto import kineto_to_perfetto

    events = json.loads(_content(DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz"))["traceEvents"]
    return kineto_to_perfetto([e for e in events if e.get("ph") == "M"] + events[:SEED_ITEMS * 2],
                              scratch / "converted.perfetto-trace")


def seeds(scratch: Path) -> dict[str, list[Seed]]:
    """Seeds for every reader in READERS, by its FORMAT."""
    out: dict[str, list[Seed]] = {r.FORMAT: [] for r in readers.READERS}
    for path in _candidates(scratch):
        try:
            reader = readers.reader_for(path)
        except Exception:
            continue
        if len(out[reader.FORMAT]) >= SEEDS_PER_READER and not path.name.startswith("regression-"):
            continue
        data = _content(path)
        if data.lstrip()[:1] in (b"{", b"["):
            shrunk = json.dumps(_shrink_json(json.loads(data))).encode()
        elif data.startswith(b"SQLite format 3\x00"):
            shrunk = _shrink_sqlite(data)
        elif path.suffix == ".csv":  # rocprofv3's CSV: the header and the first rows
            shrunk = b"".join(data.splitlines(keepends=True)[:SEED_ITEMS + 1])
        else:
            shrunk = data
        suffix = _suffix(path, reader)
        probe = scratch / f"probe-{len(list(scratch.iterdir()))}{suffix}"
        probe.write_bytes(shrunk)
        if readers.reader_for(probe) is not reader:  # shrinking changed what it looks like: keep it whole
            shrunk = data
        out[reader.FORMAT].append(Seed(reader.FORMAT, str(path.relative_to(REPO.parent)
                                                          if REPO.parent in path.parents else path.name),
                                       shrunk, suffix))
    return out


# ------------------------------------------------------------------------------------------------ mutations

NEST = "__tracesql_fuzz_nest__"
WRONG_TYPES = ["", "x", "123", None, True, False, [], {}, [1, 2], {"a": 1}, 0, -1, 1.5]
HUGE = [10**30, -10**30, 2**63, 2**63 - 1, -2**63, -2**63 - 1, 2**64, 1e308, -1e308, 5e-324]
NON_FINITE = [math.nan, math.inf, -math.inf]


def _nodes(value, limit=20000):
    """(container, key) of every value inside `value`, breadth first, at most `limit`."""
    out, queue = [], [value]
    while queue and len(out) < limit:
        c = queue.pop(0)
        items = c.items() if isinstance(c, dict) else enumerate(c) if isinstance(c, list) else ()
        for k, v in items:
            out.append((c, k))
            if isinstance(v, (dict, list)):
                queue.append(v)
    return out


def _json_mutation(draw, doc):
    nodes = _nodes(doc)
    if not nodes:
        return
    container, key = nodes[draw(st.integers(0, len(nodes) - 1))]
    value = container[key]
    op = draw(st.sampled_from(["delete", "retype", "huge", "non_finite", "nest", "duplicate", "overlap",
                               "negative", "stringify"]))
    if op == "delete":
        del container[key]
    elif op == "retype":
        container[key] = draw(st.sampled_from(WRONG_TYPES))
    elif op == "huge":
        container[key] = draw(st.sampled_from(HUGE))
    elif op == "non_finite":
        container[key] = draw(st.sampled_from(NON_FINITE))
    elif op == "nest":
        container[key] = NEST
    elif op == "stringify":
        container[key] = json.dumps(value)
    elif isinstance(value, dict) and op in ("duplicate", "overlap", "negative"):
        if op == "negative":
            for k in ("dur", "ts"):
                if isinstance(value.get(k), (int, float)):
                    value[k] = -abs(value[k]) - 1
        elif isinstance(container, list):
            copy = json.loads(json.dumps(value))
            if op == "overlap" and isinstance(copy.get("ts"), (int, float)):
                copy["ts"] += (copy.get("dur") if isinstance(copy.get("dur"), (int, float)) else 1) / 2
            container.insert(draw(st.integers(0, len(container))), copy)


def _byte_mutation(draw, data: bytes) -> bytes:
    op = draw(st.sampled_from(["truncate", "flip", "invalid_utf8", "splice", "zero", "gzip", "gzip_truncated"]))
    n = len(data)
    if op == "truncate":
        return data[:draw(st.integers(0, max(0, n - 1)))]
    if op == "flip":
        out = bytearray(data)
        for bit in draw(st.lists(st.integers(0, max(0, n * 8 - 1)), min_size=1, max_size=16)):
            if out:
                out[bit // 8] ^= 1 << (bit % 8)
        return bytes(out)
    if op == "invalid_utf8":
        at = draw(st.integers(0, n))
        return data[:at] + draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3", b"\xed\xa0\x80", b"\x00"])) + data[at:]
    if op in ("splice", "zero"):
        a = draw(st.integers(0, n))
        b = draw(st.integers(a, min(n, a + 4096)))
        return data[:b] + data[a:b] + data[b:] if op == "splice" else data[:a] + bytes(b - a) + data[b:]
    packed = gzip.compress(data, 1)
    return packed if op == "gzip" else packed[:draw(st.integers(0, len(packed) - 1))]


@st.composite
def mutants(draw, seed: Seed) -> bytes:
    data = seed.data
    if seed.is_json and draw(st.booleans()):
        doc = json.loads(data)
        for _ in range(draw(st.integers(1, 4))):
            _json_mutation(draw, doc)
        text = json.dumps(doc, allow_nan=True)  # NaN/Infinity tokens: not JSON, but what some writers produce
        if NEST in text:
            depth = draw(st.sampled_from([64, 1000, 100_000]))
            text = text.replace(json.dumps(NEST), "[" * depth + "1" + "]" * depth, 1).replace(json.dumps(NEST), "0")
        data = text.encode()
        if draw(st.booleans()):
            return data
    for _ in range(draw(st.integers(1, 3))):
        data = _byte_mutation(draw, data)
    return data


# ---------------------------------------------------------------------------------------------------- worker

WORKER = r"""
import json, resource, shutil, sys, traceback
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import tracesql
from tracesql.errors import TraceError
print("ready", flush=True)
for line in sys.stdin:
    req = json.loads(line)
    path, run = req["path"], req["run"]
    try:
        tracesql.ingest([path], run, jobs=1)
        con = tracesql.connect(run)
        con.execute("SELECT count(*) FROM slices").fetchall()
        tracesql.query("overlap", run)
        reply = {"outcome": "ok"}
    except TraceError as e:
        msg = str(e)
        good = msg.startswith(path + ": ") and "\n" not in msg and len(msg) < 2000
        reply = {"outcome": "error" if good else "bad_message", "message": msg[:2000]}
    except BaseException as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "/tracesql/" in f.filename]
        where = f"{frames[-1].filename.split('/tracesql/')[-1]}:{frames[-1].name}" if frames else "?"
        reply = {"outcome": "exception", "message": f"{type(e).__name__}: {str(e)[:500]}", "where": where,
                 "traceback": "".join(traceback.format_exception(e))[-4000:]}
    shutil.rmtree(run, ignore_errors=True)
    print(json.dumps(reply), flush=True)
"""


class Worker:
    """A process that ingests one input at a time, under a memory cap; restarted after a crash or a hang."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self.proc = None
        self.inputs = 0

    def _start(self):
        env = {**os.environ, "PYTHONPATH": str(REPO), "TRACESQL_CACHE": str(self.scratch / "cache")}
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(MEMORY_LIMIT)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                     cwd=self.scratch)
        assert self.proc.stdout.readline() == "ready\n"

    def stop(self):
        if self.proc:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def run(self, data: bytes, suffix: str) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.inputs += 1
        path = self.scratch / f"rank-0{suffix}"
        path.write_bytes(data)
        self.proc.stdin.write(json.dumps({"path": str(path), "run": str(self.scratch / "run")}) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT_S)
        if not ready:
            self.stop()
            shutil.rmtree(self.scratch / "run", ignore_errors=True)
            return {"outcome": "hang", "message": f"no answer in {TIMEOUT_S:.0f} s", "where": "timeout"}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            shutil.rmtree(self.scratch / "run", ignore_errors=True)
            return {"outcome": "crash", "message": f"worker died (exit status {code})", "where": f"exit {code}"}
        return json.loads(line)


def failure_key(reply: dict) -> str | None:
    """None for an acceptable outcome; else what identifies the bug."""
    if reply["outcome"] in ("ok", "error"):
        return None
    if reply["outcome"] == "bad_message":
        return "bad_message"
    return f"{reply['outcome']} {reply.get('where')} {reply['message'].split(':')[0]}"


def save(failures_dir: Path, seed: Seed, data: bytes, reply: dict) -> Path:
    failures_dir.mkdir(parents=True, exist_ok=True)
    name = f"{seed.reader}-{hashlib.sha1(data).hexdigest()[:12]}{seed.suffix}"
    (failures_dir / name).write_bytes(data)
    (failures_dir / (name + ".txt")).write_text(json.dumps({"seed": seed.origin, **reply}, indent=1))
    return failures_dir / name
