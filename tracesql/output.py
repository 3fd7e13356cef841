"""Query results as text and files: a table that fits the terminal, Markdown, CSV, JSON, Parquet.

Only `table` is for people: it shows durations (`*_ns`, `dur` columns), sizes (`*_bytes`) and rates (`*_per_s`)
in one unit per column, named in the header (`comm_ns` shown in ms is headed `comm_ms`), right-aligns numbers, and
fits the terminal's width ($COLUMNS, else the terminal's, else 120): a result too wide for it
is shown as one block per row (a record view: a line per column), unless `--columns` picks fewer columns. CSV, JSON
and Parquet keep the raw values (integer nanoseconds and bytes); lists and structs become JSON text in CSV.
Markdown keeps the raw values too, escaped for a table cell; numbers that are not integers have four significant
digits, never an exponent.

Nothing here needs pandas: rows come from DuckDB as Python values (`fetchall`), Parquet is written by DuckDB.
"""

from __future__ import annotations

import csv
import datetime
import decimal
import fnmatch
import io
import json
import math
import os
import shutil
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from .errors import TraceError

FORMATS = ("table", "csv", "json", "markdown", "parquet")
#: Width when neither $COLUMNS nor a terminal says (output piped into a file or another program).
DEFAULT_WIDTH = 120
#: A text cell is cut to this many characters in the table (the record view shows up to the line's width).
MAX_CELL = 120
#: To fit the terminal, long text is first cut to SHORT_CELL characters, then headers break after underscores, then
#: text is cut down to MIN_TEXT_CELL; a table that still does not fit folds into records.
SHORT_CELL = 40
MIN_TEXT_CELL = 16
SEPARATOR = "  "
#: Absolute times among the `*_ns` columns: shown as they are, not as durations.
ABSOLUTE_NS = ("start_ns", "end_ns", "ts_ns")


@dataclass
class Result:
    """A query result held as Python values: column names, DuckDB type names, rows."""

    columns: list[str]
    types: list[str]
    rows: list[tuple]

    @classmethod
    def of(cls, rel) -> Result:
        """From a DuckDB relation (its rows fetched once)."""
        return cls(list(rel.columns), [str(t) for t in rel.types], rel.fetchall())

    def pick(self, patterns: list[str] | None) -> Result:
        """The columns named by `patterns` (names or shell patterns such as `*_ns`), in that order."""
        if not patterns:
            return self
        chosen: list[int] = []
        for pattern in patterns:
            found = [i for i, c in enumerate(self.columns) if fnmatch.fnmatchcase(c, pattern)]
            if not found:
                raise TraceError("--columns", f"no column {pattern!r} in the result (columns: "
                                              f"{', '.join(self.columns)})")
            chosen += [i for i in found if i not in chosen]
        return Result([self.columns[i] for i in chosen], [self.types[i] for i in chosen],
                      [tuple(row[i] for i in chosen) for row in self.rows])


def parse_columns(text: str | None) -> list[str] | None:
    """`-c rank,step,*_ns` -> ['rank', 'step', '*_ns']; None or '' -> None (all columns)."""
    if not text:
        return None
    names = [c.strip() for c in text.split(",") if c.strip()]
    return names or None


def pick_relation(rel, patterns: list[str] | None):
    """The relation with only the columns `patterns` name (see `Result.pick`), still lazy (for Parquet)."""
    if not patterns:
        return rel
    names = Result(list(rel.columns), [str(t) for t in rel.types], []).pick(patterns).columns
    return rel.select(*[_quote_ident(c) for c in names])


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


# ---- units (table only) ----

#: A column's unit: (the scale in the stored unit, its label in the header), largest first. Durations are integer
#: ns, sizes bytes (IEC prefixes, as memory is counted), rates per second (decimal prefixes, as peaks are quoted).
TIME_UNITS = ((1e9, "s"), (1e6, "ms"), (1e3, "us"), (1, "ns"))
BYTE_UNITS = ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"), (1, "B"))
FLOP_RATE_UNITS = ((1e15, "pflops"), (1e12, "tflops"), (1e9, "gflops"), (1e6, "mflops"), (1e3, "kflops"),
                   (1, "flops"))
BYTE_RATE_UNITS = ((1e12, "tb"), (1e9, "gb"), (1e6, "mb"), (1e3, "kb"), (1, "bytes"))


def is_duration(column: str) -> bool:
    return column == "dur" or (column.endswith("_ns") and not column.endswith(ABSOLUTE_NS))


def unit(column: str) -> str | None:
    """The unit of a column's values, as its name says it (docs/concepts/units.md), for programs: None when the
    name says none (counts, ids, names)."""
    if column in ("ts", "dur") or column.endswith(("_ns", "_ts")):
        return "ns (a time on the trace's clock)" if column == "ts" or column.endswith(ABSOLUTE_NS + ("_ts",)) \
            else "ns"
    for suffix, name in (("_flops_per_s", "FLOP/s"), ("_bytes_per_s", "bytes/s"), ("_bytes", "bytes"),
                         ("_pct", "percent (0-100)"), ("_ratio", "fraction (0-1)"), ("share", "fraction (0-1)"),
                         ("_gbps", "GB/s (1e9 bytes/s)")):
        if column.endswith(suffix):
            return name
    return "FLOP" if column == "flops" else None


def _units_and_stem(column: str) -> tuple[tuple, str, str] | None:
    """(the units a column can be shown in, the header before the unit, the header after it), None for a
    plain number: 'comm_ns' -> (TIME_UNITS, 'comm_', ''), 'link_bytes_per_s' -> (BYTE_RATE_UNITS, 'link_',
    '_per_s')."""
    if is_duration(column):
        return TIME_UNITS, ("dur_" if column == "dur" else column[:-2]), ""
    for suffix, units in (("_flops_per_s", FLOP_RATE_UNITS), ("_bytes_per_s", BYTE_RATE_UNITS)):
        if column.endswith(suffix):
            return units, column[: -len(suffix) + 1], "_per_s"
    if column.endswith("_bytes"):
        return BYTE_UNITS, column[:-5], ""
    return None


@dataclass
class ColumnUnit:
    """One unit for a whole column, so that its values compare at a glance and align on the decimal point: the
    largest unit its largest value reaches, with the decimals that give that value four significant digits; the
    header names the unit (`comm_ns` shown in ms is headed `comm_ms`)."""

    header: str
    label: str  # the unit: 'ms', 'MiB', 'tflops'
    scale: float
    decimals: int

    def text(self, v) -> str:
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(self.text(x) for x in v) + "]"
        if not _is_number(v):
            return plain(v)
        v = float(v)
        if math.isnan(v) or math.isinf(v):
            return str(v)
        text = f"{v / self.scale:.{self.decimals}f}"
        return text[1:] if text.startswith("-") and not text.strip("-0.") else text  # no "-0.000"


def _is_number(v) -> bool:
    return isinstance(v, (int, float, decimal.Decimal)) and not isinstance(v, bool)


def column_unit(column: str, values: list) -> ColumnUnit | None:
    """The unit the table shows `column` in, from its values (None: a plain number, shown as it is)."""
    found = _units_and_stem(column)
    if found is None:
        return None
    units, stem, tail = found
    numbers = [abs(float(x)) for v in values for x in (v if isinstance(v, (list, tuple)) else [v])
               if _is_number(x) and math.isfinite(float(x))]
    largest = max(numbers, default=0.0)
    scale, label = next(((s, u) for s, u in units if largest >= s), units[-1])
    in_unit = largest / scale
    if scale == 1 and all(float(x).is_integer() for x in numbers):
        decimals = 0  # whole ns or bytes as they are
    else:
        decimals = 0 if in_unit >= 1000 else 1 if in_unit >= 100 else 2 if in_unit >= 10 else 3
    return ColumnUnit(stem + label + tail, label, scale, decimals)


def duration(ns: float) -> str:
    """One duration in the unit it reaches, for a sentence: 5265000 -> '5.265 ms'."""
    unit = column_unit("dur", [ns])
    return f"{unit.text(ns)} {unit.label}"


# ---- cells ----

def plain(v) -> str:
    """A value as text, without units: NULL, integers as they are, other numbers to 4 significant digits, lists
    and structs as JSON."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, (float, decimal.Decimal)):
        v = float(v)
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v.is_integer() and abs(v) < 1e15:
            return str(int(v))
        return _significant(v)
    if isinstance(v, (list, tuple, dict)):
        return json_text(v)
    return str(v)


def _significant(v: float) -> str:
    """Four significant digits in plain notation, never an exponent, so that a row reads one way: 0.14953 ->
    '0.1495', 86410000.7 -> '86410001', 1.5e-05 -> '0.000015'."""
    a = abs(v)
    if a >= 1000:
        return str(round(v))
    decimals = 3 - math.floor(math.log10(a)) if a > 0 else 0
    text = f"{v:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split()) if ("\n" in text or "\t" in text) else text  # a cell is one line
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _numeric(type_name: str) -> bool:
    t = type_name.upper()
    return any(k in t for k in ("INT", "DOUBLE", "FLOAT", "DECIMAL", "REAL", "NUMERIC")) and not t.endswith("[]")


def terminal_width() -> int:
    """$COLUMNS, else the terminal's width, else DEFAULT_WIDTH."""
    value = os.environ.get("COLUMNS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


# ---- formats ----

def table(result: Result, width: int | None = None) -> str:
    """The result for a terminal of `width` characters: a table, or one block per row when it cannot fit."""
    width = width or terminal_width()
    right = [_numeric(t) for t in result.types]
    units = [column_unit(c, [row[i] for row in result.rows]) if right[i] or t.upper().endswith("[]") else None
             for i, (c, t) in enumerate(zip(result.columns, result.types))]
    headers = [u.header if u else c for c, u in zip(result.columns, units)]
    cells = [[u.text(v) if u else plain(v) for v, u in zip(row, units)] for row in result.rows]
    n = len(result.rows)
    footer = f"({n} row{'s' if n != 1 else ''})"
    if not result.columns:
        return footer + "\n"
    widths = _fit(headers, cells, right, width)
    if widths is not None:
        return _horizontal(headers, cells, right, widths) + footer + "\n"
    footer = (f"({n} row{'s' if n != 1 else ''}; {len(result.columns)} columns are wider than {width} characters: "
              "a block per row; -c/--columns picks columns)")
    return _records(headers, cells, width) + "\n".join(textwrap.wrap(footer, max(width, 20))) + "\n"


def _header_pieces(name: str) -> list[str]:
    pieces = name.split("_")
    return [p + "_" for p in pieces[:-1]] + [pieces[-1]] if len(pieces) > 1 else [name]


def _header_floor(name: str) -> int:
    """The narrowest a header gets when it breaks after its underscores: its longest piece."""
    return max(len(piece) for piece in _header_pieces(name))


def wrap_header(name: str, width: int) -> list[str]:
    """A header in lines of at most `width` characters, broken after underscores ('exposed_comm_ns', 8 ->
    ['exposed_', 'comm_ns']); a piece longer than `width` is cut."""
    lines: list[str] = []
    for piece in _header_pieces(name):
        while len(piece) > width:
            lines.append(piece[:width])
            piece = piece[width:]
        if lines and len(lines[-1]) + len(piece) <= width:
            lines[-1] += piece
        elif piece:
            lines.append(piece)
    return lines or [""]


def _fit(columns: list[str], cells: list[list[str]], right: list[bool], width: int) -> list[int] | None:
    """Column widths that fit `width`: each as wide as its header and values (text up to MAX_CELL); if that is too
    wide, long text is cut to SHORT_CELL, then headers break after underscores (not below the widest value), then
    text is cut down to MIN_TEXT_CELL; None when even that is too wide."""
    values = [max([0] + [len(row[i]) for row in cells]) for i in range(len(columns))]
    widths = [max(len(c), min(v, MAX_CELL)) for c, v in zip(columns, values)]
    budget = width - len(SEPARATOR) * (len(columns) - 1)
    text_floor = [MAX_CELL if right[i] else max(min(v, SHORT_CELL), len(c))
                  for i, (c, v) in enumerate(zip(columns, values))]
    header_floor = [max(min(v, MAX_CELL), _header_floor(c)) for c, v in zip(columns, values)]
    for floors in ([max(w, f) if right[i] else min(w, f) for i, (w, f) in enumerate(zip(widths, text_floor))],
                   [min(w, f) for w, f in zip(widths, header_floor)],
                   [w if right[i] else max(min(w, MIN_TEXT_CELL), _header_floor(columns[i]))
                    for i, w in enumerate(widths)]):
        widths = _shrink(widths, floors, sum(widths) - budget)
        if sum(widths) <= budget:
            return widths
    return None


def _shrink(widths: list[int], floors: list[int], excess: int) -> list[int]:
    """`widths` narrowed by `excess` characters in all, the widest first, none below its floor."""
    widths = list(widths)
    while excess > 0:
        candidates = [i for i in range(len(widths)) if widths[i] > floors[i]]
        if not candidates:
            break
        i = max(candidates, key=lambda j: (widths[j], -j))
        widths[i] -= 1
        excess -= 1
    return widths


def _horizontal(columns: list[str], cells: list[list[str]], right: list[bool], widths: list[int]) -> str:
    def line(values):
        parts = [(_clip(v, w).rjust(w) if r else _clip(v, w).ljust(w)) for v, w, r in zip(values, widths, right)]
        return SEPARATOR.join(parts).rstrip() + "\n"

    headers = [wrap_header(c, w) for c, w in zip(columns, widths)]
    depth = max(len(h) for h in headers)
    headers = [[""] * (depth - len(h)) + h for h in headers]  # bottom-aligned, next to the rule
    out = [line([h[k] for h in headers]) for k in range(depth)]
    out.append(SEPARATOR.join("─" * w for w in widths) + "\n")
    out += [line(row) for row in cells]
    return "".join(out)


def _records(columns: list[str], cells: list[list[str]], width: int) -> str:
    label = min(max(len(c) for c in columns), max(width // 2, 8))
    value_width = max(width - label - len(SEPARATOR), 8)
    out = []
    for n, row in enumerate(cells, 1):
        title = f"─[ row {n} ]"
        out.append(title + "─" * max(width - len(title), 0) + "\n")
        for c, v in zip(columns, row):
            out.append(f"{_clip(c, label).ljust(label)}{SEPARATOR}{_clip(v, value_width)}".rstrip() + "\n")
    return "".join(out)


def markdown(result: Result) -> str:
    """A Markdown table (raw values; `|`, `\\`, backticks and line breaks escaped so that each cell stays one)."""
    def cell(text: str) -> str:
        text = text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "\\`")
        return "<br>".join(text.splitlines()) if ("\n" in text or "\r" in text) else text

    lines = ["| " + " | ".join(cell(c) for c in result.columns) + " |",
             "|" + "".join("---:|" if _numeric(t) else "---|" for t in result.types)]
    lines += ["| " + " | ".join(cell(plain(v)) for v in row) + " |" for row in result.rows]
    return "\n".join(lines) + "\n"


def jsonable(v):
    """`v` as JSON values: NaN and infinities None, decimals numbers, times ISO text, bytes hex, the rest as text."""
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, decimal.Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, datetime.timedelta):
        return v.total_seconds()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)


def json_text(v) -> str:
    """A list or struct as compact JSON (for a CSV or table cell)."""
    return json.dumps(jsonable(v), ensure_ascii=False, separators=(", ", ": "))


def to_json(result: Result) -> str:
    """A JSON array of one object per row; raw values (NaN and infinities as null)."""
    records = [{c: jsonable(v) for c, v in zip(result.columns, row)} for row in result.rows]
    return json.dumps(records, indent=1, ensure_ascii=False) + "\n"


def to_csv(result: Result) -> str:
    """CSV with a header; raw values, NULL as an empty field, lists and structs as JSON text."""
    def field(v):
        if v is None:
            return ""
        if isinstance(v, (list, tuple, dict)):
            return json_text(v)
        if isinstance(v, float):
            return repr(v)
        return v

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows([field(v) for v in row] for row in result.rows)
    return buffer.getvalue()


def render(result: Result, fmt: str, width: int | None = None) -> str:
    """`result` as text in `fmt` (any of FORMATS but parquet)."""
    if fmt == "csv":
        return to_csv(result)
    if fmt == "json":
        return to_json(result)
    if fmt == "markdown":
        return markdown(result)
    if fmt == "table":
        return table(result, width)
    raise TraceError("--format", f"{fmt!r} is not one of {', '.join(FORMATS)}")


def write(rel, fmt: str, output: Path | None = None, columns: list[str] | None = None, echo=None) -> int:
    """Write the DuckDB relation `rel` (only `columns`, when given) in `fmt` to `output` or, through `echo`, to
    the terminal; returns the number of rows."""
    rows, deliver = prepare(rel, fmt, output, columns)
    deliver(echo)
    return rows


def prepare(rel, fmt: str, output: Path | None = None, columns: list[str] | None = None):
    """`write` in two steps: run `rel` and render it, returning (rows, deliver); `deliver(echo)` then writes the
    text (Parquet is already in `output`). A reader that runs the first step again on a swapped run (see
    engine.while_unchanged) prints nothing twice."""
    if fmt == "parquet":
        if output is None:
            raise TraceError("--format parquet", "needs --output FILE")
        rel = pick_relation(rel, columns)
        try:
            rel.to_parquet(str(output))
        except Exception as e:  # duckdb.IOException: a folder, a missing folder, no space
            if type(e).__name__ != "IOException":
                raise
            raise TraceError(output, f"cannot write ({str(e).strip().splitlines()[0]})") from None
        return rel.count("*").fetchall()[0][0], lambda echo=None: None
    result = Result.of(pick_relation(rel, columns))
    text = render(result, fmt)

    def deliver(echo=None):
        if output is not None:
            Path(output).write_text(text)
        else:
            (echo or sys.stdout.write)(text)

    return len(result.rows), deliver
