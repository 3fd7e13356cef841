"""tracesql: ML profiler traces as SQL tables.

    tracesql.ingest(["traces/run-1234/"], "runs/1234")   # traces -> Parquet tables
    con = tracesql.connect("runs/1234")                    # DuckDB with the tables as views and the functions
    tracesql.query("overlap", "runs/1234")                 # a curated query -> pandas DataFrame
"""

__version__ = "0.1.0"

from .engine import connect  # noqa: E402
from .errors import TraceError  # noqa: E402
from .ingestion import ingest  # noqa: E402
from .queries import query  # noqa: E402

__all__ = ["connect", "ingest", "query", "TraceError", "__version__"]
