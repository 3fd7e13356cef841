"""tracesql: ML profiler traces as SQL tables.

    tracesql.ingest(["traces/run-1234/"], "runs/1234")   # traces -> Parquet tables
    con = tracesql.connect("runs/1234")                    # DuckDB with the tables as views and the functions
    tracesql.query("overlap", "runs/1234")                 # a curated query -> pandas DataFrame

The names below are imported on first use (PEP 562), so that `import tracesql` and the `tracesql` command start
without loading DuckDB, Arrow or pandas until they are needed; they live in `tracesql.api`.
"""

from .version import __version__

__all__ = ["connect", "ingest", "query", "TraceError", "__version__"]
_API = {"connect", "ingest", "query", "TraceError"}


def __getattr__(name: str):
    if name in _API:
        from . import api

        value = getattr(api, name)
        globals()[name] = value  # found directly from now on
        return value
    raise AttributeError(f"module 'tracesql' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _API)
