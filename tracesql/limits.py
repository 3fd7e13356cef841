"""How much one file's ingest may use: DuckDB's working memory (beyond it DuckDB spills to a scratch folder on
disk) and, for a quick look at a huge trace, how many of its events to read.

Set per ingest (`tracesql ingest --memory-limit 2GB --max-events 1000000`, `tracesql.ingest(...,
memory_limit=..., max_events=...)`) or for every ingest with TRACESQL_MEMORY_LIMIT / TRACESQL_MAX_EVENTS. The
ingest of a file runs under `using(limits)`; readers and normalize ask `current()`.

The whole read of a file is held to the documented bound, --memory-limit plus FIXED_OVERHEAD (`watched`): a
reader whose memory grows past it on some shape of input (long distinct strings, huge args, millions of interned
names) is stopped and the file refused in one line, instead of taking the machine's memory.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import os
import re
import sys
import threading
import weakref
from dataclasses import dataclass

from .errors import TraceError

#: DuckDB's working memory per file when nothing is set: derived tables and the event table spill beyond it.
DEFAULT_MEMORY = "1GB"
#: DuckDB's working memory in a SQL sandbox (`engine.lock_down`) when none is given: nothing spills beyond it.
SANDBOX_MEMORY = "2GB"
#: What an ingest of one file may use besides DuckDB's working memory: the interpreter and libraries (~60-110 MB),
#: a block of packets or a few batches of slices in flight, names looked up by id. The documented bound of an
#: ingest's memory is the limit plus this (docs/robustness.md, "Memory").
FIXED_OVERHEAD = 320 << 20
#: The watch stops a read this far below the bound: what the read still allocates before it stops.
STOP_MARGIN = 48 << 20
WATCH_INTERVAL_S = 0.01
#: A fresh tracesql process's heap when a read starts (~35 MB measured), with room to spare: a process holding
#: more (a notebook's data) gets that much on top of the bound.
OWN_HEAP = 128 << 20
_SIZE = re.compile(r"^\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Limits:
    memory: str = DEFAULT_MEMORY  # a DuckDB size: '512MB', '2GB'
    max_events: int | None = None  # read only the first N events of each file

    @classmethod
    def make(cls, memory: str | None = None, max_events: int | None = None) -> Limits:
        """From the arguments, else the environment, else the defaults; checked."""
        memory = memory or os.environ.get("TRACESQL_MEMORY_LIMIT") or DEFAULT_MEMORY
        if not _SIZE.match(memory):
            raise TraceError("--memory-limit", f"{memory!r} is not a size like 512MB or 2GB")
        if max_events is None and os.environ.get("TRACESQL_MAX_EVENTS"):
            try:
                max_events = int(os.environ["TRACESQL_MAX_EVENTS"])
            except ValueError:
                raise TraceError("TRACESQL_MAX_EVENTS", "not an integer") from None
        if max_events is not None and max_events < 1:
            raise TraceError("--max-events", f"must be at least 1 (got {max_events})")
        return cls(memory.strip().replace(" ", ""), max_events)

    @property
    def memory_bytes(self) -> int:
        return size_bytes(self.memory)


def size_bytes(size: str) -> int:
    """A DuckDB size ('512MB': powers of 1000; '512MiB': of 1024) in bytes."""
    m = re.match(r"^([\d.]+)\s*([KMGT]?i?B)$", size.strip(), re.IGNORECASE)
    if not m:
        return 1 << 30
    unit = m.group(2).upper()
    power = "BKMGT".index(unit[0]) if unit != "B" else 0
    return int(float(m.group(1)) * (1024 if "I" in unit else 1000) ** power)


_current: contextvars.ContextVar[Limits] = contextvars.ContextVar("tracesql_limits", default=Limits())


def current() -> Limits:
    return _current.get()


@contextlib.contextmanager
def using(limits: Limits):
    token = _current.set(limits)
    try:
        yield
    finally:
        _current.reset(token)


class MemoryBoundExceeded(BaseException):
    """Raised in the thread reading a file when the process's memory passed the bound (a BaseException, as
    KeyboardInterrupt is: no reader's `except Exception` takes it for damage of its own)."""


#: DuckDB connections opened while a read is watched: interrupted when it is stopped
_connections: weakref.WeakSet = weakref.WeakSet()


def watch_connection(con) -> None:
    with contextlib.suppress(TypeError):  # (a connection type without weak references: not interrupted)
        _connections.add(con)


def _anon_bytes() -> int:
    """This process's anonymous resident memory (its heap): resident pages less the file-backed and shared ones."""
    with open("/proc/self/statm", "rb") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE")


class MemoryWatch:
    """Samples the process's heap every WATCH_INTERVAL_S while `call` runs a read; past `stop_at` it raises
    MemoryBoundExceeded in the reading thread (at its next Python instruction) and interrupts the DuckDB queries
    running meanwhile (`watch_connection`). It stops only a thread that is still inside `call`: an exception
    raised in a thread asynchronously can land anywhere, and must not land after the read."""

    def __init__(self, stop_at: int):
        self.stop_at, self.peak, self.stopped = stop_at, 0, False
        self._delivered = False  # the stop taken by end(): nothing is pending after it
        self._thread_id = threading.get_ident()
        self._frame = None  # the frame of `call`, while it runs
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="tracesql-memory-watch", daemon=True)

    def _reading(self) -> bool:
        frame = sys._current_frames().get(self._thread_id)
        while frame is not None and frame is not self._frame:
            frame = frame.f_back
        return frame is not None

    def _sample(self) -> None:
        while not self._done.wait(WATCH_INTERVAL_S):
            self._sample_once()
            if self.stopped:  # again at every sample until the read ends: a reader may take an interrupted query
                # for a damaged file and try another way
                if not self._reading():
                    return
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread_id),
                                                           ctypes.py_object(MemoryBoundExceeded))
                for con in list(_connections):
                    with contextlib.suppress(Exception):
                        con.interrupt()

    def _sample_once(self) -> None:
        used = _anon_bytes()
        self.peak = max(self.peak, used)
        if used > self.stop_at:
            self.stopped = True

    def call(self, fn, *args):
        self._frame = sys._getframe()
        return fn(*args)

    def start(self) -> None:
        self._sampler.start()

    def end(self) -> None:
        """Stop sampling; a stop still pending lands here. It is delivered, never withdrawn: withdrawing
        (PyThreadState_SetAsyncExc with NULL) leaves CPython 3.11's eval breaker set for good, and the next call
        made under a trace function (a debugger, coverage) then loops forever."""
        self._done.set()
        while True:
            try:
                self._sampler.join()
                self._sample_once()  # a read shorter than a sampling interval (or a starved sampler) is seen too
                if self.stopped and not self._delivered:  # replaces any stop still pending, then takes it
                    self._delivered = True
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._thread_id),
                                                               ctypes.py_object(MemoryBoundExceeded))
                    _take_pending_stop()
                return
            except MemoryBoundExceeded:
                self.stopped = True


def _take_pending_stop() -> None:
    """A Python call: the interpreter raises a pending asynchronous exception on entering it."""


def watched(limits: Limits, path, fn, *args):
    """`fn(*args)`, the read of the file `path` under `limits`, its memory watched: a TraceError naming `path`
    when the process's heap passes --memory-limit + FIXED_OVERHEAD (less STOP_MARGIN, what stopping still takes).
    Where /proc is not there (not Linux), unwatched."""
    if not os.path.exists("/proc/self/statm"):
        return fn(*args)
    # a process that holds much before the read (a notebook's data) keeps it on top: the bound is the read's
    held = max(0, _anon_bytes() - OWN_HEAP)
    watch = MemoryWatch(limits.memory_bytes + FIXED_OVERHEAD - STOP_MARGIN + held)
    watch.start()
    try:
        try:
            result = watch.call(fn, *args)
        finally:
            watch.end()
        if not watch.stopped:
            return result
        # past the bound, though the read ended before the stop could land in it: refused all the same
        raise MemoryBoundExceeded
    except (Exception, MemoryBoundExceeded) as e:
        watch.end()  # (again: a stop may have landed in the first)
        if not watch.stopped:
            raise
        raise TraceError(path, f"needs more memory than --memory-limit {limits.memory} allows (the ingest of a file "
                               f"may use the limit + {FIXED_OVERHEAD >> 20} MB; it had {watch.peak / 2**20:,.0f} "
                               "MB): ingest it with a larger --memory-limit") from None
