"""How much one file's ingest may use: DuckDB's working memory (beyond it DuckDB spills to a scratch folder on
disk) and, for a quick look at a huge trace, how many of its events to read.

Set per ingest (`tracesql ingest --memory-limit 2GB --max-events 1000000`, `tracesql.ingest(...,
memory_limit=..., max_events=...)`) or for every ingest with TRACESQL_MEMORY_LIMIT / TRACESQL_MAX_EVENTS. The
ingest of a file runs under `using(limits)`; readers and normalize ask `current()`.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import re
from dataclasses import dataclass

from .errors import TraceError

#: DuckDB's working memory per file when nothing is set: derived tables and the event table spill beyond it.
DEFAULT_MEMORY = "1GB"
#: DuckDB's working memory in a SQL sandbox (`engine.lock_down`) when none is given: nothing spills beyond it.
SANDBOX_MEMORY = "2GB"
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
