"""DuckDB SQL (the curated queries, the user's SQL, the macros of functions/) -> Spark SQL.

sqlglot parses the DuckDB text and writes Spark SQL; this module does what it cannot know:
- the tracesql macros are expanded into the query (scalar macros as expressions, table macros as subqueries),
  after the query's parameters (`getvariable('x')`) are replaced by their values;
- stars (`s.* REPLACE (...)`, `*` over a table macro) are expanded from the schema, so that `UNION ALL BY NAME`
  can be written as a plain UNION ALL with the columns in the same order;
- DuckDB semantics Spark spells differently are rewritten on the syntax tree: 1-based list indexing and slicing
  (negative indices, NULL out of range), `len`, `list_product`/`list_sum` (DOUBLE, NULL elements skipped),
  `range` (end-exclusive, empty when end <= start), ordered `list(x ORDER BY k)`, `histogram`, `quantile_cont`,
  `count(DISTINCT x) OVER`, named windows that are extended, lambdas with an index (1-based in DuckDB), a set
  returning function inside an expression, `range()` as a lateral table, `regexp_replace` back-references,
  TRY_CAST of a string to a list, `UNPIVOT ... INTO NAME ... VALUE`, decimal literals (DOUBLE here, so that
  arithmetic never turns into Spark's bounded decimals), `AS [NOT] MATERIALIZED` (a DuckDB planning hint:
  dropped).
What cannot be rewritten raises `Untranspilable` with the reason.
"""

from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import sqlglot
from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB
from sqlglot.optimizer.qualify import qualify

from . import functions, schema


class Untranspilable(Exception):
    """The DuckDB SQL uses something this transpiler cannot express in Spark SQL."""


#: Functions of Python that tracesql creates in its DuckDB sessions only (tracesql/critical_path.py).
DUCKDB_ONLY = ("critical_path_walk", "critical_path_replay_lengths", "critical_path_walked_ahead",
               "critical_path_event_scales")


class _DuckDBSource(DuckDB):
    # Keep list indexes as written (1-based): they are rewritten to try_element_at, never shifted by sqlglot.
    INDEX_OFFSET = 0


READ = _DuckDBSource
WRITE = "spark"


# Macros that Spark evaluates by calling DuckDB itself, in a vectorized Arrow UDF on its workers
# (tracesql.spark registers them): their formulas call nested macros that repeat their arguments, so inlined
# they grow to ~150 KB of SQL per call, more than Spark's analyzer holds in memory. name -> Spark return type.
DUCKDB_UDFS = {"op_flops": "DOUBLE", "op_bytes": "DOUBLE"}


def udf_name(macro: str) -> str:
    return f"tracesql_duckdb_{macro}"


@dataclass
class Macro:
    name: str
    params: list[str]
    defaults: dict[str, exp.Expr]
    body: exp.Expr  # an expression (scalar macro) or a query (table macro)
    table: bool


# extract_statements keeps the comments before a statement (duckdb 2.0.1), so they are skipped here
_MACRO = re.compile(r"^(?:\s*--[^\n]*\n)*\s*CREATE\s+OR\s+REPLACE\s+MACRO\s+(\w+)\s*\((.*?)\)\s+AS\s+(TABLE\s+)?(.*)$",
                    re.S | re.I)


def _split_params(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    return [p.strip() for p in parts + [current] if p.strip()]


@lru_cache(maxsize=1)
def macros() -> dict[str, Macro]:
    """Every macro of tracesql/functions/*.sql, parsed once."""
    import duckdb

    con = duckdb.connect()
    found = {}
    for _, text in functions.sql_files():
        for statement in con.extract_statements(text):
            m = _MACRO.match(statement.query)
            if not m:
                continue
            name, params_text, table, body = m[1].lower(), m[2], bool(m[3]), m[4].strip().rstrip(";")
            params, defaults = [], {}
            for p in _split_params(params_text):
                pname, sep, default = p.partition(":=")
                params.append(pname.strip().lower())
                if sep:
                    defaults[pname.strip().lower()] = sqlglot.parse_one(default.strip(), read=READ)
            parsed = next(e for e in sqlglot.parse(body, read=READ) if e is not None)  # without trailing comments
            found[name] = Macro(name, params, defaults, parsed.unnest() if not table else parsed, table)
    return found


def data_tables() -> dict[str, dict[str, str]]:
    """The CSV tables of functions/ (kernel_classes, device_peaks): name -> {column: DuckDB type}."""
    out = {}
    for path in sorted(functions.HERE.glob("*.csv")):
        create = functions.csv_table_sql(path).split("CREATE OR REPLACE TABLE", 1)[1].split(";", 1)[0]
        columns = create[create.index("(") + 1: create.rindex(")")]
        out[path.stem] = dict(c.strip().split(" ", 1) for c in columns.split(","))
    return out


@lru_cache(maxsize=1)
def table_schema() -> dict[str, dict[str, str]]:
    tables = {name: {c.name: c.type for c in t.columns} for name, t in schema.TABLES.items()}
    return {**tables, **data_tables()}


# ----------------------------------------------------------------------------------------------------------------
# Parameters and macros


def substitute_variables(tree: exp.Expr, values: dict[str, str]) -> exp.Expr:
    """`getvariable('x')` -> the SQL literal given for x (NULL when none, as in DuckDB)."""

    def replace(node):
        if isinstance(node, exp.Anonymous) and node.name.lower() == "getvariable":
            arg = node.expressions[0] if node.expressions else None
            if not (isinstance(arg, exp.Literal) and arg.is_string):
                raise Untranspilable("getvariable() needs a constant name")
            value = values.get(arg.this)
            return sqlglot.parse_one(value, read=READ) if value is not None else exp.null()
        return node

    return tree.transform(replace)


def _lambda_bound(node: exp.Expr) -> set[str]:
    bound = set()
    parent = node.parent
    while parent is not None:
        if isinstance(parent, exp.Lambda):
            bound |= {e.name.lower() for e in parent.expressions}
        parent = parent.parent
    return bound


def _simple(e: exp.Expr) -> bool:
    return isinstance(e, (exp.Column, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Func, exp.Cast, exp.Lambda))


def _bind(macro: Macro, call_args: list[exp.Expr]) -> dict[str, exp.Expr]:
    bound, positional = {}, []
    for a in call_args:
        if isinstance(a, (exp.PropertyEQ, exp.Kwarg)):
            bound[a.this.name.lower()] = a.expression
        else:
            positional.append(a)
    if len(positional) > len(macro.params):
        raise Untranspilable(f"{macro.name}() takes {len(macro.params)} arguments, got {len(positional)}")
    for name, value in zip(macro.params, positional):
        bound[name] = value
    for name in macro.params:
        if name not in bound:
            if name not in macro.defaults:
                raise Untranspilable(f"{macro.name}() is missing its argument {name}")
            bound[name] = macro.defaults[name]
    return bound


def _instantiate(macro: Macro, call_args: list[exp.Expr]) -> exp.Expr:
    args = _bind(macro, call_args)

    def replace(node):
        if (isinstance(node, exp.Column) and not node.table and node.name.lower() in args
                and node.name.lower() not in _lambda_bound(node)):
            value = args[node.name.lower()].copy()
            return value if _simple(value) else exp.Paren(this=value)
        return node

    body = macro.body.copy().transform(replace)
    if macro.table:
        _rename_ctes(body, f"{macro.name}{_fresh()}")
    return body


def _rename_ctes(query: exp.Expr, prefix: str) -> None:
    """Give the CTEs of an inlined table macro names of their own: Spark hoists every CTE to the top, where two
    instances of one macro (or two macros with a `classes` CTE) would clash."""
    with_ = query.args.get("with_") or query.args.get("with")
    if not with_:
        return
    names = {cte.alias: f"{prefix}_{cte.alias}" for cte in with_.expressions}
    for cte in with_.expressions:
        cte.set("alias", exp.TableAlias(this=exp.to_identifier(names[cte.alias])))
    for table in query.find_all(exp.Table):
        if not table.args.get("db") and table.name in names:
            if not table.alias:
                table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name)))
            table.set("this", exp.to_identifier(names[table.name]))


def expand_macros(tree: exp.Expr) -> exp.Expr:
    """Replace every call of a tracesql macro by its body (repeatedly: macros call macros)."""
    known = macros()
    for _ in range(100):
        changed = False
        for node in list(tree.find_all(exp.Table, exp.Anonymous)):
            if isinstance(node, exp.Table) and isinstance(node.this, exp.Anonymous):
                name = node.this.name.lower()
                if name in known and known[name].table:
                    body = _instantiate(known[name], node.this.expressions)
                    alias = node.args.get("alias") or exp.TableAlias(this=exp.to_identifier(name))
                    node.replace(exp.Subquery(this=body, alias=alias.copy()))
                    changed = True
            elif isinstance(node, exp.Anonymous) and node.name.lower() in DUCKDB_UDFS:
                macro = known[node.name.lower()]
                args = _bind(macro, node.expressions)
                node.replace(_fn(udf_name(macro.name), *(args[p].copy() for p in macro.params)))
                changed = True
            elif (isinstance(node, exp.Anonymous) and node.name.lower() in known
                  and node.find_ancestor(exp.Table) is None):
                macro = known[node.name.lower()]
                if macro.table:
                    raise Untranspilable(f"table function {macro.name}() used as a value")
                node.replace(exp.Paren(this=_instantiate(macro, node.expressions)))
                changed = True
        if not changed:
            return tree
    raise Untranspilable("macros nest more than 100 levels deep")


# ----------------------------------------------------------------------------------------------------------------
# DuckDB semantics in Spark SQL

_fresh_counter = [0]


def _fresh() -> str:
    _fresh_counter[0] += 1
    return f"_v{_fresh_counter[0]}"


def _spark(template: str, **args: exp.Expr) -> exp.Expr:
    """A Spark SQL expression from `template`, with the columns named `__name` replaced by `args[name]`
    (copied: an argument may be used several times) and the lambda variables `_a`, `_b` renamed to fresh names."""
    fresh = {v: _fresh() for v in ("_a", "_b")}
    tree = sqlglot.parse_one(template, read=WRITE)

    def replace(node):
        if isinstance(node, (exp.Column, exp.Identifier)) and node.name.startswith("__"):
            value = args[node.name[2:]].copy()
            return value if _simple(value) else exp.Paren(this=value)
        if isinstance(node, exp.Identifier) and node.name in fresh:
            return exp.to_identifier(fresh[node.name])
        if isinstance(node, exp.Column) and not node.table and node.name in fresh:
            return exp.column(fresh[node.name])
        return node

    return tree.transform(replace)


def _fn(name: str, *args: exp.Expr) -> exp.Expr:
    return exp.Anonymous(this=name, expressions=list(args))


def _int(e: exp.Expr) -> int | None:
    """The value of an integer literal (also a negated one), else None."""
    if isinstance(e, exp.Neg) and isinstance(e.this, exp.Literal) and e.this.is_int:
        return -int(e.this.this)
    if isinstance(e, exp.Literal) and e.is_int:
        return int(e.this)
    return None


def _slice(array: exp.Expr, s: exp.Slice) -> exp.Expr:
    """DuckDB's list[a:b]: 1-based, both ends included, negative = from the end, a missing end = the last."""
    start = s.this if s.this is not None else exp.Literal.number(1)
    end = s.expression
    if end is None:
        return _spark("slice(__x, __s, greatest(array_size(__x) - __s + 1, 0))", x=array, s=start)
    if (_int(end) or 0) >= 0 and _int(start) is not None and _int(start) > 0 and _int(end) is not None:
        return _fn("slice", array.copy(), start.copy(), exp.Literal.number(max(_int(end) - _int(start) + 1, 0)))
    return _spark("slice(__x, __s, "
                  "greatest(CASE WHEN __e < 0 THEN array_size(__x) + __e + 1 ELSE __e END - __s + 1, 0))",
                  x=array, s=start, e=end)


def _element(value: exp.Expr, index: exp.Expr) -> exp.Expr:
    """DuckDB's value[i]: a list's i-th element (1-based, negative from the end, NULL out of range, NULL for 0)
    or a map's value at key i. Spark's try_element_at is all that, except that it fails on a list index 0."""
    if _int(index) == 0:
        return exp.null()
    if _int(index) is not None:
        return _fn("try_element_at", value, index)
    return _spark("CASE WHEN __i = 0 AND typeof(__x) NOT LIKE 'map<%' THEN NULL ELSE try_element_at(__x, __i) END",
                  x=value, i=index)


def _list_text(value: exp.Expr, list_type: exp.DataType) -> exp.Expr:
    """CAST(list AS VARCHAR) as DuckDB writes it: [1, NULL, [2]], strings bare unless empty, 'NULL' or holding
    brackets, commas, quotes or edge blanks (then quoted, ' escaped as \\')."""
    element = list_type.expressions[0] if list_type.expressions else exp.DataType.build("VARCHAR")
    var = exp.column(_fresh())
    if element.is_type(exp.DataType.Type.ARRAY):
        inner = _spark("coalesce(__l, 'NULL')", l=_list_text(var, element))
    elif element.is_type(*exp.DataType.TEXT_TYPES):
        inner = _spark("CASE WHEN __e IS NULL THEN 'NULL' "
                       "WHEN __e = '' OR lower(__e) = 'null' OR __e RLIKE '[,\\\\[\\\\]{}():\\'\"]|^\\\\s|\\\\s$' "
                       "THEN concat('\\'', replace(__e, '\\'', '\\\\\\''), '\\'') ELSE __e END", e=var)
    else:
        inner = _spark("coalesce(CAST(__e AS STRING), 'NULL')", e=var)
    return _spark("CASE WHEN __x IS NOT NULL THEN concat('[', array_join(transform(__x, __f), ', '), ']') END",
                  x=value, f=exp.Lambda(this=inner, expressions=[var.this]))


def _replacement(text: str) -> str:
    """An RE2 replacement string (\\1 back-references) as Java writes it ($1)."""
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append("$" + nxt if nxt.isdigit() else "\\" + nxt)
            i += 2
            continue
        out.append("\\$" if ch == "$" else ch)
        i += 1
    return "".join(out)


def _regexp_replace(node: exp.RegexpReplace) -> exp.Expr:
    modifiers = node.args.get("modifiers")
    flags = modifiers.this if isinstance(modifiers, exp.Literal) else ""
    pattern = node.expression
    if not isinstance(pattern, exp.Literal):
        raise Untranspilable("regexp_replace() with a pattern that is not a constant")
    text = pattern.this
    anchored = text.startswith("^") or (text.endswith("$") and not text.endswith("\\$"))
    if "g" not in flags and not anchored:
        # Spark replaces every match; without 'g' DuckDB replaces the first one (the same when anchored: one match)
        raise Untranspilable(f"regexp_replace() of the first match only of an unanchored pattern {text!r}")
    if "i" in flags:
        text = "(?i)" + text
    replacement = node.args.get("replacement")
    if not isinstance(replacement, exp.Literal):
        raise Untranspilable("regexp_replace() with a replacement that is not a constant")
    return _fn("regexp_replace", node.this.copy(), exp.Literal.string(text),
               exp.Literal.string(_replacement(replacement.this)))


def _list_from_string(node: exp.TryCast) -> exp.Expr:
    """TRY_CAST('[2, 2]' AS BIGINT[]): DuckDB parses the text of a list; each element that does not cast is NULL."""
    element = node.to.expressions[0]
    if element.is_type(*exp.DataType.NESTED_TYPES):
        raise Untranspilable(f"TRY_CAST of text to a nested list ({node.to.sql(READ)})")
    t = element.sql(WRITE)
    return _spark(
        "CASE WHEN __s RLIKE '^\\\\s*\\\\[.*\\\\]\\\\s*$' THEN "
        f"CASE WHEN trim(regexp_extract(__s, '^\\\\s*\\\\[(.*)\\\\]\\\\s*$', 1)) = '' THEN CAST(array() AS ARRAY<{t}>) "
        "ELSE transform(split(regexp_extract(__s, '^\\\\s*\\\\[(.*)\\\\]\\\\s*$', 1), ','), "
        f"_a -> TRY_CAST(trim(_a) AS {t})) "
        "END END", s=node.this)


def _ordered_list(node: exp.ArrayAgg) -> exp.Expr:
    """list(x) keeps NULLs and list(x ORDER BY k) orders; collect_list does neither: collect structs, sort them."""
    value = node.this
    keys = []
    if isinstance(value, exp.Order):
        for o in value.expressions:
            if o.args.get("desc"):
                raise Untranspilable("list(... ORDER BY ... DESC)")
            keys.append(o.this)
        value = value.this
    fields = [exp.alias_(k.copy(), f"k{i}") for i, k in enumerate(keys)] + [exp.alias_(value.copy(), "v")]
    collected = _fn("collect_list", exp.Struct(expressions=fields))
    if keys:
        collected = _fn("array_sort", collected)
    return _spark("transform(__l, _a -> _a.v)", l=collected)


def _inline_named_windows(select: exp.Select) -> None:
    windows = {w.name: w for w in select.args.get("windows") or []}
    if not windows:
        return
    for window in select.find_all(exp.Window):
        if window.find_ancestor(exp.Select) is not select:
            continue
        name = window.args.get("alias")
        if not (isinstance(name, exp.Identifier) and name.name in windows):
            continue
        base = windows[name.name]
        for arg in ("partition_by", "order", "spec"):
            if not window.args.get(arg) and base.args.get(arg):
                window.set(arg, base.args[arg].copy() if isinstance(base.args[arg], exp.Expr)
                           else [e.copy() for e in base.args[arg]])
        window.set("alias", None)
    select.set("windows", None)


def _union_by_name(union: exp.Union) -> None:
    """UNION ALL BY NAME: the right side's columns put in the left side's order (NULL for missing ones)."""
    left, right = union.left, union.right
    while isinstance(left, exp.SetOperation):
        left = left.left
    if not isinstance(right, exp.Select) or "*" in right.named_selects or "*" in left.named_selects:
        raise Untranspilable("UNION BY NAME over columns that cannot be listed")
    names = left.named_selects
    by_name = {e.alias_or_name: e for e in right.expressions}
    extra = sorted(set(by_name) - set(names))
    if extra:
        raise Untranspilable(f"UNION BY NAME: columns {', '.join(extra)} only on the right side")
    right.set("expressions", [by_name[n] if n in by_name else exp.alias_(exp.null(), n) for n in names])
    union.set("by_name", None)


def _positional_names(union: exp.Union) -> None:
    """A UNION's columns take the left side's names: name the right side's columns alike. (qualify() names them
    after their source columns, which may repeat — `x AS dur, y AS dur` — and trips Spark's optimizer.)"""
    left, right = union.left, union.right
    while isinstance(left, exp.SetOperation):
        left = left.left
    if not isinstance(right, exp.Select) or "*" in left.named_selects or "*" in right.named_selects:
        return
    if len(left.named_selects) == len(right.expressions):
        right.set("expressions",
                  [exp.alias_(e.unalias(), name) for e, name in zip(right.expressions, left.named_selects)])


def _drop_redundant_aliases(tree: exp.Expr) -> exp.Expr:
    """`t.x AS x` becomes `t.x` (the same column name). qualify() writes the alias on every column; Spark 4.1's
    optimizer (RemoveRedundantAliases) then makes an invalid plan of a window over a UNION ALL whose sides and
    select lists all carry such aliases — PLAN_VALIDATION_FAILED_RULE_IN_BATCH for range_launches, as small as
    `WITH p AS (SELECT l.a AS a, l.t AS t, 1 AS o, CAST(NULL AS BIGINT) AS r FROM x l UNION ALL SELECT h.a AS a,
    h.t AS t, 0 AS o, h.id AS r FROM x h), w AS (SELECT p.a AS a, p.t AS t, p.o AS o, p.r AS r, max_by(p.r, p.t)
    OVER (PARTITION BY p.a ORDER BY p.t ROWS UNBOUNDED PRECEDING) AS m FROM p) SELECT w.a AS a, w.m AS m FROM w
    WHERE w.o = 1`."""
    for alias in list(tree.find_all(exp.Alias)):
        if isinstance(alias.this, exp.Column) and alias.this.name == alias.alias and isinstance(alias.parent, exp.Select):
            alias.replace(alias.this)
    return tree


def _nested_explode(node: exp.Explode) -> exp.Expr | None:
    """f(unnest(xs)) in a select list: Spark only takes a generator at the top, so f goes inside:
    unnest(transform(xs, x -> f(x)))."""
    top = node
    while not isinstance(top.parent, (exp.Select, exp.Alias)):
        top = top.parent
        if top is None:
            return None
    if top is node:
        return None
    var = _fresh()
    inner = node.this.copy()
    node.replace(exp.column(var))
    body = top.copy()
    top.replace(exp.Explode(this=_fn("transform", inner, exp.Lambda(this=body, expressions=[exp.to_identifier(var)]))))
    return node


def _unpivot_statement(node: exp.Pivot) -> exp.Expr:
    """DuckDB's `UNPIVOT t ON a, b INTO NAME n VALUE v` as `SELECT * FROM t UNPIVOT (v FOR n IN (a, b))`."""
    into = node.args.get("into")
    if not into or len(into.expressions) != 1 or node.args.get("using"):
        raise Untranspilable("UNPIVOT without INTO NAME ... VALUE ...")
    table = node.this.copy()
    pivot = exp.Pivot(expressions=[exp.to_identifier(into.expressions[0].name)],
                      fields=[exp.In(this=exp.to_identifier(into.this.name),
                                     expressions=[e.copy() for e in node.expressions])],
                      unpivot=True)
    table.set("pivots", [pivot])
    return exp.select("*").from_(table)


ARRAY = exp.DataType.Type.ARRAY


def _is_text(e: exp.Expr) -> bool:
    return e.type is not None and e.type.is_type(*exp.DataType.TEXT_TYPES)


def _is_list(e: exp.Expr) -> bool:
    return e.type is not None and e.type.is_type(ARRAY)


def _one_based_index(node: exp.Lambda) -> None:
    """lambda x, i: ... — DuckDB's index i counts from 1, Spark's from 0: i becomes (i + 1) in the body."""
    index = node.expressions[1].name

    def shift(n):
        is_variable = isinstance(n, exp.Column) or (isinstance(n, exp.Identifier)
                                                     and not isinstance(n.parent, exp.Column))
        if is_variable and n.name == index:
            return exp.Paren(this=exp.Add(this=exp.to_identifier(index), expression=exp.Literal.number(1)))
        return n

    node.set("this", node.this.transform(shift))


def spark_semantics(tree: exp.Expr) -> exp.Expr:
    """Rewrite the (qualified) DuckDB tree so that Spark computes the same thing."""
    from sqlglot.optimizer.annotate_types import annotate_types

    for union in list(tree.find_all(exp.Union)):
        if union.args.get("by_name"):
            _union_by_name(union)
        _positional_names(union)
    for select in list(tree.find_all(exp.Select)):
        _inline_named_windows(select)
    for cte in tree.find_all(exp.CTE):  # DuckDB's planning hint `AS [NOT] MATERIALIZED`: Spark has no such syntax
        cte.set("materialized", None)
    for node in list(tree.find_all(exp.Explode)):
        _nested_explode(node)
    annotate_types(tree, schema=table_schema(), dialect=READ)

    def rewrite(node):
        if (isinstance(node, exp.Lambda) and len(node.expressions) == 2
                and isinstance(node.parent, (exp.ArrayFilter, exp.Transform))):
            _one_based_index(node)
            return node
        if isinstance(node, exp.Bracket):
            if len(node.expressions) != 1:
                raise Untranspilable("a list index with several values")
            index = node.expressions[0]
            if isinstance(index, exp.Slice):
                return _slice(node.this, index)
            return _element(node.this, index)
        if isinstance(node, exp.Length) and not _is_text(node.this):
            return _fn("array_size", node.this)
        if isinstance(node, exp.TryCast) and node.to.is_type(ARRAY) and not _is_list(node.this):
            return _list_from_string(node)
        if (isinstance(node, (exp.Cast, exp.TryCast)) and node.to.is_type(*exp.DataType.TEXT_TYPES)
                and _is_list(node.this)):
            return _list_text(node.this, node.this.type)
        if isinstance(node, exp.RegexpReplace):
            return _regexp_replace(node)
        if isinstance(node, exp.Log) and node.expression is not None and _int(node.this) == 10:
            # Spark's log(10, x) is ln(x)/ln(10): 2.9999999999999996 for 1000, where log10 is exact
            return _fn("log10", node.expression)
        if isinstance(node, exp.PercentileCont):
            return _fn("percentile", node.this, node.expression)
        if isinstance(node, exp.ArrayAgg):
            return _ordered_list(node)
        if isinstance(node, exp.IgnoreNulls) and isinstance(node.this, exp.AnyValue):
            return _fn("any_value", node.this.this, exp.true())
        if isinstance(node, exp.Window) and isinstance(node.this, exp.Count) and isinstance(node.this.this,
                                                                                         exp.Distinct):
            values = node.this.this.expressions
            if len(values) != 1:
                raise Untranspilable("count(DISTINCT a, b) OVER (...)")
            window = node.copy()
            window.set("this", _fn("collect_set", values[0].copy()))
            return _fn("array_size", window)
        if isinstance(node, (exp.ArgMax, exp.ArgMin)) and isinstance(node.expression, exp.Tuple):
            keys = node.expression.expressions
            node.set("expression", exp.Struct(expressions=[exp.alias_(e, f"k{i}") for i, e in enumerate(keys)]))
            return node
        if isinstance(node, exp.GenerateSeries) and not isinstance(node.parent, exp.Table):
            return _numbers(node)
        if isinstance(node, exp.Div):
            # DuckDB divides by zero as IEEE does (inf, -inf, NaN); Spark gives NULL
            return _spark("CASE WHEN __y = 0 THEN __x * CAST('Infinity' AS DOUBLE) ELSE __x / __y END",
                          x=node.this, y=node.expression)
        if isinstance(node, exp.Anonymous):
            name = node.name.lower()
            args = node.expressions
            if name == "list_product":
                return _spark("CASE WHEN array_size(filter(__x, _a -> _a IS NOT NULL)) > 0 THEN aggregate("
                              "filter(__x, _a -> _a IS NOT NULL), CAST(1 AS DOUBLE), (_a, _b) -> _a * _b) END",
                              x=args[0])
            if name == "list_sum":
                return _spark("CASE WHEN array_size(filter(__x, _a -> _a IS NOT NULL)) > 0 THEN aggregate("
                              "filter(__x, _a -> _a IS NOT NULL), CAST(0 AS DOUBLE), (_a, _b) -> _a + _b) END",
                              x=args[0])
            if name == "list_reverse":
                return _fn("reverse", *args)
            if name == "hash":  # DuckDB's is 64 bits, Spark's hash() 32: names known by hash would collide
                return _fn("xxhash64", *args)
            if name == "error":
                return _fn("raise_error", *args)
            if name == "histogram":
                return _spark("map_from_arrays(array_distinct(collect_list(__x)), "
                              "transform(array_distinct(collect_list(__x)), "
                              "_a -> CAST(array_size(filter(collect_list(__x), _b -> _b = _a)) AS BIGINT)))", x=args[0])
        if isinstance(node, exp.Literal) and not node.is_string and not node.is_int and "e" not in node.this.lower():
            # DuckDB computes with DECIMAL literals and turns quotients into DOUBLE; Spark keeps bounded decimals
            return exp.Cast(this=node.copy(), to=exp.DataType.build("DOUBLE"))
        return node

    # children first, so that a rewrite copies arguments that are already rewritten
    for node in reversed(list(tree.walk(bfs=False))):
        new = rewrite(node)
        if new is not node:
            if node is tree:
                tree = new
            else:
                node.replace(new)
    for table in list(tree.find_all(exp.Table)):
        if isinstance(table.this, exp.GenerateSeries):
            _range_table(table)
    return tree


def _numbers(series: exp.GenerateSeries) -> exp.Expr:
    """DuckDB's range(a, b) (b excluded) or generate_series(a, b) as a Spark array: empty when b is before a,
    where Spark's sequence() would count down."""
    template = "filter(sequence(__a, greatest(__a, __b - 1)), _a -> _a < __b)" if series.args.get("is_end_exclusive") \
        else "filter(sequence(__a, greatest(__a, __b)), _a -> _a <= __b)"
    return _spark(template, a=series.args.get("start") or exp.Literal.number(0), b=series.args["end"])


def _range_table(table: exp.Table) -> None:
    """range() as a table: `FROM range(3) t(i)` becomes a subquery that explodes the numbers; `FROM t, range(t.n)
    p(i)` (lateral: it reads t) becomes Spark's LATERAL VIEW explode(...) p AS i."""
    alias = table.args.get("alias")
    if alias is None or len(alias.columns) != 1:
        raise Untranspilable("range() as a table needs an alias with one column: range(n) r(i)")
    numbers = _numbers(table.this)
    join = table.parent
    if isinstance(join, exp.From):
        subquery = exp.select(exp.alias_(exp.Explode(this=numbers), alias.columns[0].name)).subquery(alias.name)
        table.replace(subquery)
        return
    if not isinstance(join, exp.Join) or join.args.get("on") or join.args.get("kind"):
        raise Untranspilable("range() as a lateral table needs a plain comma join: FROM t, range(t.n) r(i)")
    lateral = exp.Lateral(this=exp.Explode(this=numbers), view=True,
                          alias=exp.TableAlias(this=alias.this.copy(), columns=[c.copy() for c in alias.columns]))
    select = join.parent
    join.pop()
    select.append("laterals", lateral)


@contextmanager
def _quiet_sqlglot():
    logger = logging.getLogger("sqlglot")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def to_spark(sql: str, variables: dict[str, str] | None = None) -> list[str]:
    """The statements of DuckDB `sql` as Spark SQL, with `variables` (name -> SQL literal) for getvariable()."""
    used = functions.words(sql)  # and the macros it calls (what_if's calls critical_path_walk)
    used |= functions.words("\n".join(functions.needed(used)[0]))
    python = [f for f in DUCKDB_ONLY if f in used]
    if python:
        raise Untranspilable(f"{python[0]}() is a Python function of tracesql's DuckDB engine (use --engine duckdb)")
    statements = [s for s in sqlglot.parse(sql, read=READ) if s is not None]
    if not statements:
        raise Untranspilable("no SQL statement")
    out = []
    for tree in statements:
        tree = substitute_variables(tree, variables or {})
        # and the variables the macros read (device_activity's tracesql_classes_stored: unset on Spark)
        tree = substitute_variables(expand_macros(tree), variables or {})
        # DuckDB's statement UNPIVOT stands where a query does; an UNPIVOT clause hangs under its table
        tree = tree.transform(lambda n: _unpivot_statement(n) if isinstance(n, exp.Pivot) and n.args.get("unpivot")
                              and not isinstance(n.parent, exp.Table) else n)
        with _quiet_sqlglot():  # it logs a warning for each UNPIVOT it cannot look into; the star stays for Spark
            tree = qualify(tree, schema=table_schema(), dialect=READ, validate_qualify_columns=False,
                           quote_identifiers=False, identify=False)
        tree = _drop_redundant_aliases(spark_semantics(tree))
        out.append(tree.sql(WRITE, comments=False))
    return out
