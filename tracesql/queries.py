"""The curated query library: plain `.sql` files whose header says what they answer.

Header format (a test checks every curated file against it and against what the query really returns):

    -- overlap: one line saying what the query answers
    --
    -- Free text: the definition, conventions, caveats.
    --
    -- Needs: what the run must contain for rows to come back (said to the user when none do)
    -- Parameters:
    --   name = default   what it means
    -- Columns:
    --   name  TYPE  what it means

Parameters reach the SQL as DuckDB variables: the file reads them with COALESCE(getvariable('name'), default),
so it also runs unchanged in a plain DuckDB session (`SET VARIABLE name = ...` to change one).

A parameter's description starts with the values it takes, up to a colon, in one of these forms (every curated
parameter has one; a value given outside them is refused before the query runs, naming what is allowed):

    one of rank, step, process_group:        one of these words (or numbers)
    list of kernel, kernel_family, op:       comma-separated, each one of these
    integer >= 1:   integer:   number > 0:   a number in that range (>=, >, <=, <)
    device key:                              a key of the device_peaks table
    peak dtype:                              a FLOP/s column of the device_peaks table (bf16, fp8_sparse, ...)
    text:                                    anything
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TraceError
from .functions import HERE as FUNCTIONS_DIR
from .functions import words
from .schema import DEVICE_TIME_KINDS

_PARAM = re.compile(r"^--\s+(\w+)\s*=\s*('(?:[^']|'')*'|\S+)\s+(.*)$")
_COLUMN = re.compile(r"^--\s+(\w+)\s+([A-Z][A-Z0-9_]*(?:\[\])*)\s+(.*)$")
_RESULTS = itertools.count()  # names of the result tables of `run`
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RULE = re.compile(r"^(one of [^:]+|list of [^:]+|(?:integer|number)(?: (?:>=|>|<=|<) -?[\d.e]+)?|device key|peak dtype|text):")
_COMPARE = {">=": float.__ge__, ">": float.__gt__, "<=": float.__le__, "<": float.__lt__}


#: the device_peaks columns that are not a FLOP/s peak of one dtype
_PEAK_INFO = ("device", "name_regex", "bytes_per_s", "link_bytes_per_s", "source", "notes")


def _device_peaks() -> list[dict]:
    import csv

    with open(FUNCTIONS_DIR / "device_peaks.csv", newline="") as f:
        return list(csv.DictReader(f))


def device_keys() -> list[str]:
    """The keys of the device_peaks table (what `-p device=` accepts)."""
    return [row["device"] for row in _device_peaks()]


def peak_dtypes() -> list[str]:
    """The device_peaks columns that hold a FLOP/s peak (what `-p dtype=` accepts): bf16, fp8, fp4_sparse, ..."""
    return [c for c in _device_peaks()[0] if c not in _PEAK_INFO]


def queries_dir() -> Path:
    """Where the curated queries are: inside the installed package, or the repository's `queries/`."""
    packaged = Path(__file__).parent / "queries"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "queries"


@dataclass
class Param:
    name: str
    default: str  # a SQL literal
    doc: str

    @property
    def rule(self) -> str | None:
        """The values the parameter takes, as its description states them (the text before its first colon)."""
        m = _RULE.match(self.doc)
        return m[0].rstrip(":").strip() if m else None

    def check(self, value) -> str | None:
        """Why `value` is not allowed (None when it is, or when the description states no rule)."""
        rule, text = self.rule, literal(value) if isinstance(value, bool) else str(value).strip()
        if rule is None or rule == "text":
            return None
        if rule == "device key":
            keys = device_keys()
            return None if text in keys else f"is not a device_peaks key (known: {', '.join(keys)})"
        if rule == "peak dtype":
            dtypes = peak_dtypes()
            return None if text in dtypes else f"is not a device_peaks dtype (known: {', '.join(dtypes)})"
        if rule.startswith(("one of ", "list of ")):
            allowed = [v.strip() for v in rule.split(" of ", 1)[1].split(",")]
            given = [v.strip() for v in text.split(",")] if rule.startswith("list of ") else [text]
            wrong = [v for v in given if v not in allowed]
            if not wrong:
                return None
            if rule.startswith("one of "):
                return f"is not {rule}"
            return f"names {', '.join(repr(w) for w in wrong)}: each must be one of {', '.join(allowed)}"
        kind, _, bound = rule.partition(" ")
        try:
            number = float(text)
        except ValueError:
            return f"is not a number ({rule})"
        if kind == "integer" and not number.is_integer():
            return f"is not an integer ({rule})"
        if bound:
            op, limit = bound.split()
            if not _COMPARE[op](number, float(limit)):
                return f"is not {rule}"
        return None


@dataclass
class Query:
    name: str
    path: Path
    title: str
    doc: str
    needs: str = ""
    params: dict[str, Param] = field(default_factory=dict)
    columns: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def sql(self) -> str:
        return self.path.read_text()

    @property
    def label(self) -> str:
        """How messages name the query: a curated one by its name (not the installed file's path), the user's file
        by its path."""
        return self.name if self.path.parent == queries_dir() else str(self.path)


def parse(path: Path) -> Query:
    text = path.read_text()
    header = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        header.append(line.rstrip())
    first = header[0][2:].strip() if header else ""
    title = first.partition(":")[2] or first  # "-- name: title"; a first line without a name is all title
    query = Query(name=path.stem, path=path, title=title.strip(), doc="")
    section, doc = None, []
    for line in header[1:]:
        body = line[2:].strip()
        if body in ("Parameters:", "Columns:"):
            section = body
            continue
        if body.startswith("Needs:"):
            query.needs = body.removeprefix("Needs:").strip()
            continue
        if section == "Parameters:" and (m := _PARAM.match(line)):
            query.params[m[1]] = Param(m[1], m[2], m[3].strip())
        elif section == "Columns:" and (m := _COLUMN.match(line)):
            query.columns.append((m[1], m[2], m[3].strip()))
        elif section is None:
            doc.append(body)
    query.doc = "\n".join(doc).strip()
    return query


def catalogue() -> list[Query]:
    return [parse(p) for p in sorted(queries_dir().glob("*.sql"))]


def find(name_or_path) -> Query:
    """A curated query by name ('overlap' or 'overlap.sql'), or the user's SQL file by path."""
    text = str(name_or_path)
    curated = queries_dir() / (text if text.endswith(".sql") else text + ".sql")
    if "/" not in text and curated.is_file():
        return parse(curated)
    path = Path(text)
    if path.is_file():
        return parse(path)
    import difflib  # only for this message: the command's start-up stays light

    names = [q.name for q in catalogue()]
    close = difflib.get_close_matches(Path(text).stem, names, n=3)
    hint = f"did you mean {' or '.join(close)}?" if close else f"`tracesql queries` lists the {len(names)} curated ones"
    raise TraceError(text, f"no such query file or curated query ({hint})")


def literal(value) -> str:
    """A Python value (or a CLI string) as a SQL literal: numbers stay numbers, the rest become strings."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if re.fullmatch(r"-?\d+", text) or re.fullmatch(r"-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", text):
        return text
    return "'" + text.replace("'", "''") + "'"


def check(query: Query, params: dict | None = None) -> dict:
    """`params` if the query takes each of them with that value; else a TraceError naming what is allowed."""
    params = dict(params or {})
    unknown = sorted(set(params) - set(query.params))
    if unknown:
        known = ", ".join(query.params) or "none"
        raise TraceError(query.label, f"unknown parameter {', '.join(unknown)} (this query takes: {known})")
    for name, value in params.items():
        problem = query.params[name].check(value)
        if problem:
            raise TraceError(query.label, f"parameter {name} = {value!r} {problem}")
    return params


def variables(query: Query, params: dict | None = None) -> dict[str, str]:
    """The value of each of the query's parameters as a SQL literal: the one in `params`, else the default."""
    params = check(query, params)
    return {name: literal(params[name]) if name in params else p.default for name, p in query.params.items()}


def run(con, query: Query, params: dict | None = None, prepared: bool = False):
    """Run `query` on `con` with `params` (name -> value). Returns a DuckDB relation of the last statement, readable
    until the next `run` on `con` (or `drop_results`). prepared: its statements before the last have run on `con`
    already (prepare)."""
    last = _statements(con, query, params)[-1].query if prepared else prepare(con, query, params)
    # computed once into a temporary table: a relation over the query itself binds it twice (to make the relation,
    # then to run it), and binding the cost model's formulas (mfu, roofline) takes longer than running them.
    # The previous result's table on this connection goes first: a report runs dozens of queries on one connection,
    # and each result would otherwise stay in memory until it closes (so a result is read before the next `run`).
    drop_results(con)
    table = f"tracesql_result_{next(_RESULTS)}"
    con.execute(f"CREATE TEMP TABLE {table} AS {last}")
    return con.table(table)


def prepare(con, query: Query, params: dict | None = None) -> str:
    """Set `query`'s parameters on `con` and run its statements before the last (e.g. a findings rule's SET VARIABLE
    of what it prices); returns the last one, which `run(..., prepared=True)` runs."""
    statements = _statements(con, query, params)
    for st in statements[:-1]:
        con.execute(st.query).fetchall()
    return statements[-1].query


def _statements(con, query: Query, params: dict | None) -> list:
    """`query`'s statements, its parameters set on `con` first."""
    for name, value in variables(query, params).items():
        con.execute(f"SET VARIABLE {name} = {value}").fetchall()
    statements = con.extract_statements(query.sql)
    if not statements:
        raise TraceError(query.label, "the file has no SQL statement")
    return statements


def drop_results(con) -> None:
    """Free the result tables `run` made on `con` (their relations can no longer be read)."""
    for (table,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE temporary AND "
                                "starts_with(table_name, 'tracesql_result_')").fetchall():
        con.execute(f"DROP TABLE temp.{table}")


def _explains_device_time(query: Query) -> bool:
    return any(word in query.needs.lower() for word in ("device", "kernel"))


def names_used(query: Query) -> set[str]:
    """The identifiers `run` and `explain` of `query` may use: what `engine.connect(names=...)` must create."""
    return words(query.sql) | ({"slices", "device_activity"} if _explains_device_time(query) else set())


def explain(con, query: Query, params: dict | None = None, rows: int = 0) -> str | None:
    """What the user should know about a result of `rows` rows on `con`'s run, as precisely as the run tells:
    why there are no rows (no device events at all, or the window or time unit the parameters chose removed every
    one of them, else what the query needs); or, with rows, that the time unit rounded all device time away."""
    needs = f"{query.name} needs {query.needs or 'data this run does not have'}"
    if not _explains_device_time(query):
        return None if rows else needs
    params = {name: p.default.strip("'") for name, p in query.params.items()} | dict(params or {})
    window, unit = str(params.get("analysis_window", "all")), int(float(params.get("time_unit_ns", 1)))
    if rows and unit <= 1:  # the one thing said about rows is that the time unit rounded device time away
        return None
    kinds = ", ".join(f"'{k}'" for k in DEVICE_TIME_KINDS)
    device = con.execute(f"SELECT count(*) FROM slices WHERE kind IN ({kinds})").fetchall()[0][0]
    if device == 0:
        return None if rows else f"{needs}: this run has no device events (kernels, copies, memsets)"
    kept, timed = con.execute("SELECT count(*), count(*) FILTER (WHERE dur > 0) FROM device_activity("
                              "analysis_window := $w, time_unit_ns := $u)", {"w": window, "u": unit}).fetchall()[0]
    if window != "all" and kept == 0 and not rows:
        return (f"analysis_window = '{window}' keeps none of the run's {device:,} device events (HTA's window: "
                "device work launched by a host call before the rank's last step began, and work with no correlation id "
                "that starts before it; with fewer than two steps in the run, everything)")
    if unit > 1 and kept and timed == 0:
        return (f"time_unit_ns = {unit} rounds every one of the run's {kept:,} device events to zero length "
                "(each lies within one time unit, as in HTA): no device time is counted; time_unit_ns = 1 keeps "
                "nanoseconds")
    return None if rows else needs
