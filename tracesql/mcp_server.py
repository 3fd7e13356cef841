"""`tracesql mcp RUNS...`: a Model Context Protocol server over runs, for assistants and agents
(docs/guides/agents.md).

`Tools` answers from the runs named on the command line (a run, a folder of runs, raw traces ingested into the
cache), each by its folder name or its path as given. Every SQL it runs for a caller (`run_query`, `run_sql`,
`diff`) runs in the sandbox (`engine.connect(sandbox=True)`) on a fresh connection, so one call's SQL cannot touch
the next, under a time limit (DuckDB interrupted from a timer thread) and a row limit, both stated in each result.
Results are JSON objects: columns once, with their type and unit, then the rows as lists; errors are one line.

`serve` puts the tools on the official SDK's `MCPServer` (package `mcp` >= 2, the `[mcp]` extra), imported only
there: `tracesql --help` and the base install never load it. DuckDB, Arrow and the modules that use them are
imported by the first tool call that needs them, so that the client's `initialize` is answered without waiting
for them (benchmarks/bench_mcp.py).
"""

from __future__ import annotations

import functools
import json
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from . import functions, output, queries, schema, store
from .errors import TraceError
from .limits import SANDBOX_MEMORY
from .version import __version__

INSTALL_HINT = 'tracesql mcp needs the [mcp] extra: pip install ".[mcp]" (in the checkout) or "tracesql-ml[mcp]"'
CONCEPTS_URI = "tracesql://concepts/{}"
QUERY_URI = "tracesql://queries/{name}"
INSTRUCTIONS = (
    "ML profiler traces (PyTorch/Kineto, XLA, Nsight, ...) ingested into runs of SQL tables (DuckDB). Start with "
    "list_runs and describe_run; list_queries and run_query answer the usual questions (overlap, bubbles, "
    "hotspots, MFU, stragglers); schema and run_sql for your own read-only SQL; diff compares two runs; "
    "export_step writes a Perfetto trace. Times are integer nanoseconds, sizes bytes; every result states its "
    "units, its row count and whether it was cut. The resources explain the concepts and metric definitions.")


@dataclass(frozen=True)
class CallLimits:
    """What one SQL call may use: stated in each result."""

    seconds: float = 30.0
    rows: int = 200
    memory: str = SANDBOX_MEMORY

    def stated(self) -> dict:
        return {"time_limit_s": self.seconds, "row_limit": self.rows, "memory_limit": self.memory}


def concepts_dir() -> Path:
    """docs/concepts: inside the installed package, or the repository's."""
    packaged = Path(__file__).parent / "concepts"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "docs" / "concepts"


class Runs:
    """The runs behind the command line's targets, found on first use (raw traces are ingested then, not while
    the client waits for the server to start), each under its run id (its path when two share one)."""

    def __init__(self, targets: list[str]):
        self.targets = [str(t) for t in targets]
        self._by_name: dict[str, Path] | None = None
        self._lock = threading.Lock()

    def by_name(self) -> dict[str, Path]:
        from . import engine

        with self._lock:
            if self._by_name is None:
                found: dict[str, Path] = {}
                for target in self.targets:
                    for run in engine.resolve(target):
                        if run.absolute() not in {p.absolute() for p in found.values()}:
                            run_id = store.load_manifest(run).get("run_id") or run.name
                            found[run_id if run_id not in found else str(run)] = run
                self._by_name = found
            return self._by_name

    def find(self, run: str) -> tuple[str, Path]:
        """(name, folder) of the run `run` names: a name `list_runs` gives, or a path as given on the command
        line (or the path of a run served); no other folder is opened."""
        from . import engine

        named = self.by_name()
        if run in named:
            return run, named[run]
        for name, path in named.items():
            if Path(run).absolute() == path.absolute():
                return name, path
        if run in self.targets:
            inside = [n for n, p in named.items() if p in engine.resolve(run)]
            if len(inside) == 1:
                return inside[0], named[inside[0]]
            raise TraceError(run, f"is a folder of {len(inside)} runs: name one ({', '.join(inside[:10])}"
                                  f"{', ...' if len(inside) > 10 else ''})")
        names = sorted(named)
        raise TraceError(run, f"no such run here (runs: {', '.join(names[:10])}{', ...' if len(names) > 10 else ''})")


class Tools:
    """The tools, as plain methods returning JSON-ready dicts (TraceError or duckdb.Error on failure); `serve`
    registers them with the SDK."""

    def __init__(self, targets: list[str], limits: CallLimits = CallLimits(), export_dir: Path | None = None):
        self.runs = Runs(targets)
        self.limits = limits
        self._export_dir = export_dir
        self._export_lock = threading.Lock()

    # ---- the runs ----

    def list_runs(self) -> dict:
        """The runs this server answers from: name (what the other tools take as `run`), folder, run id, ranks,
        trace formats, schema version."""
        runs = []
        for name, path in self.runs.by_name().items():
            manifest = store.load_manifest(path)
            sources = manifest.get("sources", {}).values()
            runs.append({"name": name, "path": str(path), "run_id": manifest.get("run_id"),
                         "ranks": len({r for s in sources for r in s.get("ranks", [])}),
                         "formats": sorted({s.get("format") for s in sources if s.get("format")}),
                         "schema_version": manifest.get("schema_version")})
        return {"runs": runs, "count": len(runs)}

    def describe_run(self, run: str) -> dict:
        """What a run holds: its sources (file, rank, format, size, events), rows per table, time span,
        schema version and the data-quality warnings found at ingest (`tracesql info -f json`)."""
        from . import info

        name, path = self.runs.find(run)
        described = info.as_json(info.info(path))
        for key in ("sources", "warnings"):
            described[f"{key}_total"] = len(described[key])
            described[key] = described[key][: self.limits.rows]
        units = {"start_ns": output.unit("start_ns"), "end_ns": output.unit("end_ns"), "bytes": "bytes"}
        return {"name": name, **described, "units": units, "row_limit": self.limits.rows}

    def schema(self, run: str) -> dict:
        """The tables of a run and what each column means ([name, type, meaning]), and the SQL functions (macros)
        and data tables every session has; run_sql queries them."""
        from . import engine

        name, path = self.runs.find(run)
        manifest = store.load_manifest(path)
        con = engine.connect(path, sandbox=True)
        try:
            macros = con.execute("SELECT function_name, function_type, parameters FROM duckdb_functions() "
                                 "WHERE NOT internal AND function_type IN ('macro', 'table_macro') "
                                 "ORDER BY function_name").fetchall()
        finally:
            con.close()
        data_tables = sorted(p.stem for p in functions.HERE.glob("*.csv"))
        return {
            "run": name, "schema_version": schema.SCHEMA_VERSION, "run_schema_version": manifest.get("schema_version"),
            "note": store.older_schema_note(manifest),
            "units": "times integer nanoseconds (ts on the trace's clock); sizes bytes; see the units resource",
            "tables": [{"name": t.name, "doc": t.doc, "columns": [[c.name, c.type, c.doc] for c in t.columns]}
                       for t in schema.TABLES.values()],
            "functions": list(dict.fromkeys(f"{n}({', '.join(params)})" + (" -> table" if kind == "table_macro" else "")
                                            for n, kind, params in macros)),
            "data_tables": data_tables,
        }

    # ---- queries ----

    def list_queries(self) -> dict:
        """The curated queries: name, what each answers, what a run needs for rows, parameters (default and
        allowed values), result columns. The definitions are resources (tracesql://queries/NAME)."""
        found = [{"name": q.name, "title": q.title, "needs": q.needs,
                  "parameters": [{"name": p.name, "default": p.default, "doc": p.doc} for p in q.params.values()],
                  "columns": [c[0] for c in q.columns]} for q in queries.catalogue()]
        return {"queries": found, "count": len(found)}

    def run_query(self, run: str, query: str, params: dict = {}) -> dict:  # noqa: B006  (only read)
        """Run a curated query (a name from list_queries) on a run, with parameters (name -> value)."""
        from . import engine

        name, path = self.runs.find(run)
        curated = {q.name: q for q in queries.catalogue()}
        if query not in curated:
            raise TraceError(query, "no curated query of that name (list_queries names them; your own SQL goes to "
                                    "run_sql)")
        q = curated[query]
        params = queries.check(q, params or {})
        docs = {c[0]: c[2] for c in q.columns}

        def answer(con):
            table = self._table(con, lambda: queries.run(con, q, params), docs)
            note = self._within_limit(con, lambda: queries.explain(con, q, params, table["row_count"]))
            return table | ({"note": note} if note else {})

        result = engine.on_fresh_connection(path, answer, names=queries.names_used(q), sandbox=True,
                                            memory_limit=self.limits.memory)
        return {"run": name, "query": q.name, "params": params, **result}

    def run_sql(self, run: str, sql: str) -> dict:
        """Run your own SQL (DuckDB dialect) on a run's tables, read-only: no file, network or settings access.
        Several statements may be given; the last one's rows are returned."""
        from . import engine

        name, path = self.runs.find(run)

        def answer(con):
            statements = con.extract_statements(sql)
            if not statements:
                raise TraceError("sql", "no SQL statement")

            def last():
                for st in statements[:-1]:
                    con.execute(st.query).fetchall()
                return con.sql(statements[-1].query)

            return self._table(con, last, {})

        return {"run": name, **engine.on_fresh_connection(path, answer, names=functions.words(sql), sandbox=True,
                                                         memory_limit=self.limits.memory)}

    def diff(self, before: str, after: str, top: int = 20) -> dict:
        """What changed from run `before` to run `after`, kernel by kernel and op by op, largest change first,
        per rank (the diff query; `top` rows per level)."""
        from . import api, engine

        (before_name, before_path), (after_name, after_path) = self.runs.find(before), self.runs.find(after)
        paths, params = api.diff_runs(before_path, after_path)
        q = queries.find("diff")
        params = queries.check(q, {**params, "top": top})
        docs = {c[0]: c[2] for c in q.columns}
        result = engine.on_fresh_connection(paths, lambda con: self._table(con, lambda: queries.run(con, q, params),
                                                                           docs),
                                            names=queries.names_used(q), sandbox=True, memory_limit=self.limits.memory)
        return {"before": before_name, "after": after_name, **result}

    def export_step(self, run: str, rank: int, step: int) -> dict:
        """Write one rank's step of a run as a Perfetto trace file (open it in ui.perfetto.dev): host threads and
        device streams, launch flows, tracesql's compute/communication/idle lanes and warnings. Returns its path."""
        from . import export

        name, path = self.runs.find(run)
        with self._export_lock:  # (tools run in worker threads: two first exports make one folder)
            if self._export_dir is None:
                self._export_dir = Path(tempfile.mkdtemp(prefix="tracesql-mcp-"))
        out = self._export_dir / f"{name.replace('/', '_')}-rank{rank}-step{step}.pftrace"
        written = export.export(path, out, rank=rank, step=step)
        return {"run": name, **json.loads(export.to_json(written)), "bytes": out.stat().st_size,
                "units": {"window": output.unit("start_ns")}, "summary": export.summary(written)}

    # ---- limits ----

    def _within_limit(self, con, work):
        """`work()`, interrupted (DuckDB's interrupt, from a timer thread) when it runs past the time limit."""
        import duckdb

        timer = threading.Timer(self.limits.seconds, con.interrupt)
        timer.daemon = True
        timer.start()
        try:
            return work()
        except duckdb.InterruptException:
            raise TraceError("time limit", f"stopped after {self.limits.seconds:g} s (the server's --time-limit): "
                                           "aggregate more, or filter by rank or step") from None
        finally:
            timer.cancel()

    def _table(self, con, relation, docs: dict[str, str]) -> dict:
        """The rows of `relation()` (a DuckDB relation, or None for a statement without rows), within the time
        limit: every row counted, the first `limits.rows` kept, columns with their type, unit and meaning."""
        started = time.perf_counter()

        def fetch():
            rel = relation()
            if rel is None:
                return [], [], 0
            rows, total = [], 0
            for batch in rel.to_arrow_reader(10_000):
                if len(rows) < self.limits.rows:
                    columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
                    rows += [list(r) for r in zip(*columns)][: self.limits.rows - len(rows)]
                total += batch.num_rows
            return list(zip(rel.columns, map(str, rel.types))), rows, total

        described, rows, total = self._within_limit(con, fetch)
        columns = [{"name": c, "type": t} | ({"unit": output.unit(c)} if output.unit(c) else {})
                   | ({"doc": docs[c]} if c in docs else {}) for c, t in described]
        return {"columns": columns, "rows": output.jsonable(rows), "row_count": total, "returned": len(rows),
                "truncated": total > len(rows), "elapsed_s": round(time.perf_counter() - started, 3),
                "limits": self.limits.stated()}


TOOLS = ("list_runs", "describe_run", "schema", "list_queries", "run_query", "run_sql", "diff", "export_step")


def server(tools: Tools):
    """An `MCPServer` with the tools (read-only), the concepts pages and the query definitions as resources."""
    try:
        from mcp.server.mcpserver import MCPServer
        from mcp.server.mcpserver.exceptions import ResourceError, ToolError
        from mcp.server.mcpserver.resources import FileResource
        from mcp.types import CallToolResult, TextContent, ToolAnnotations
    except ImportError:
        raise TraceError("tracesql mcp", INSTALL_HINT) from None

    app = MCPServer("tracesql", version=__version__, instructions=INSTRUCTIONS, log_level="WARNING")

    def add(method, writes: bool = False):
        @functools.wraps(method)
        def call(*args, **kwargs):
            try:
                result = method(*args, **kwargs)
            except TraceError as e:
                raise ToolError(str(e)) from None
            except OSError as e:  # a file the tool writes or reads (export_step's folder: full, not writable)
                raise ToolError(f"{e.filename or 'tracesql'}: {e.strerror or e}") from None
            except Exception as e:
                import duckdb  # (imported by then: only DuckDB's own errors can be DuckDB errors)

                if not isinstance(e, duckdb.Error):
                    raise
                raise ToolError("SQL error: " + (str(e).strip().splitlines() or [type(e).__name__])[0]) from None
            text = json.dumps(result, ensure_ascii=False, separators=(",", ":"))
            return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=result)

        app.add_tool(call, name=method.__name__, description=" ".join(method.__doc__.split()),
                     annotations=ToolAnnotations(read_only_hint=not writes, open_world_hint=False))

    for name in TOOLS:
        add(getattr(tools, name), writes=name == "export_step")

    for page in sorted(concepts_dir().glob("*.md")):
        title = page.read_text().partition("\n")[0].lstrip("# ").strip()
        app.add_resource(FileResource(uri=CONCEPTS_URI.format(page.stem), name=page.stem, title=title,
                                      description=f"tracesql concepts: {title}", mime_type="text/markdown",
                                      path=page.resolve()))

    @app.resource(QUERY_URI, name="query", mime_type="text/plain",
                  description="A curated query's definition: its header (what it answers, parameters, columns) "
                              "and its SQL")
    def query_definition(name: str) -> str:
        curated = {q.name: q for q in queries.catalogue()}
        if name not in curated:
            raise ResourceError(f"{name}: no curated query of that name")
        return curated[name].sql

    return app


def serve(targets: list[str], limits: CallLimits = CallLimits(), http_port: int | None = None,
          export_dir: Path | None = None) -> None:
    """Serve the runs behind `targets` over stdio, or streamable HTTP on 127.0.0.1:`http_port` (path /mcp)."""
    app = server(Tools(targets, limits, export_dir))
    if http_port is None:
        app.run("stdio")
    else:
        app.run("streamable-http", host="127.0.0.1", port=http_port)
