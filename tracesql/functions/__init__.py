"""SQL macros (and the data tables they use) available in every tracesql DuckDB session.

Everything here is plain files so that a run opened in any DuckDB client gets the same definitions:
- `*.csv`: small data tables (kernel class rules, device peaks), created as tables of the file's name;
- `NN_topic.sql`: macros, run in file-name order (a table macro binds the tables it reads when it is created);
- `15_kernel_classes.sql`, no file: the shipped schemes of kernel_classes.csv as one CASE (`kernel_class_sql`);
- `31_op_families.sql`, no file: `typed_op_flops` / `typed_op_bytes`, which dispatch on an op's family to the
  family's formula macros of 30_flops.sql (`family_dispatch`).
`install(con)` runs them on a connection; `sql()` is the same text, written into every run's `init.sql`.
`install(con, cache=folder)` (tracesql.connect) attaches the macros from a database file made once in the cache
(`compiled`) instead of creating them in each session.
`install(con, names=...)` creates only what SQL using those names needs (where no such file is: a query's macros,
not all 45);
`family_dispatch(families, temp=True)` dispatches to only some families' formulas (the ingest's op_costs).
"""

from __future__ import annotations

import csv
import functools
import re
import weakref
from pathlib import Path

HERE = Path(__file__).parent
_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _literal(value: str, sql_type: str) -> str:
    if value == "":
        return "NULL"
    return value if sql_type != "VARCHAR" else quote(value)


def csv_table_sql(path: Path) -> str:
    """A CSV file as CREATE TABLE + INSERT: the data travels inside the SQL, never as a path. A column whose
    values are all integers is INTEGER, all numbers DOUBLE, otherwise VARCHAR."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    columns = list(rows[0]) if rows else []
    types = {}
    for c in columns:
        values = [r[c] for r in rows if r[c] != ""]
        if values and all(re.fullmatch(r"-?\d+", v) for v in values):
            types[c] = "BIGINT"
        elif values and all(_NUMBER.fullmatch(v) for v in values):
            types[c] = "DOUBLE"
        else:
            types[c] = "VARCHAR"
    name = path.stem
    values = ",\n    ".join("(" + ", ".join(_literal(r[c], types[c]) for c in columns) + ")" for r in rows)
    return (f"-- {name}: from tracesql/functions/{path.name}; edit or insert rows to change it for this session.\n"
            f"CREATE OR REPLACE TABLE {name} ({', '.join(f'{c} {types[c]}' for c in columns)});\n"
            f"INSERT INTO {name} VALUES\n    {values};\n")


#: The schemes of kernel_classes.csv that `kernel_class_sql` compiles (rows of other schemes, e.g. a user's
#: INSERT, are matched from the table by device_classes)
SHIPPED_CLASS_SCHEMES = ("default", "hta")

#: A shipped scheme whose rules test at most this many patterns is matched on every device event
#: (`shipped_class_per_event`): HTA's three cost less per event than finding each distinct name's first event
#: (device_classes: 0.10 against 0.22 CPU-s on 535 k kernels); the default scheme's dozen took 2.4 s
PER_EVENT_PATTERNS = 4


def kernel_class_sql() -> str:
    """Macros of the shipped rules of kernel_classes.csv: `shipped_class_scheme(s)`,
    `shipped_class_per_event(s)` (the schemes of at most PER_EVENT_PATTERNS patterns), and
    `shipped_kernel_class(class_scheme, kind, name, category)`, the class of the rule of lowest priority that
    matches, as one CASE whose patterns are constants. DuckDB compiles a constant pattern once, but a pattern read
    from a column once per row: matching 60,000 distinct kernel names against the table's rules took 45 s, this
    0.5 s."""
    with open(HERE / "kernel_classes.csv", newline="") as f:
        rules = sorted((r for r in csv.DictReader(f) if r["scheme"] in SHIPPED_CLASS_SCHEMES),
                       key=lambda r: (r["scheme"], int(r["priority"])))
    whens, patterns = [], dict.fromkeys(SHIPPED_CLASS_SCHEMES, 0)
    for r in rules:
        tests = [f"class_scheme = {_literal(r['scheme'], 'VARCHAR')}"]
        tests += [f"kind = {_literal(r['kind'], 'VARCHAR')}"] if r["kind"] else []
        tests += [f"regexp_matches({column}, {_literal(r[column + '_regex'], 'VARCHAR')})"
                  for column in ("name", "category") if r[column + "_regex"]]
        patterns[r["scheme"]] += sum(1 for column in ("name", "category") if r[column + "_regex"])
        whens.append(f"    WHEN {' AND '.join(tests)} THEN {_literal(r['class'], 'VARCHAR')}")
    schemes = ", ".join(_literal(s, "VARCHAR") for s in SHIPPED_CLASS_SCHEMES)
    per_event = ", ".join(_literal(s, "VARCHAR") for s, n in patterns.items() if n <= PER_EVENT_PATTERNS) or "NULL"
    return ("-- Kernel classes: the shipped schemes of kernel_classes.csv, compiled from it when a session starts.\n\n"
            "-- Whether class_scheme is one of the shipped schemes (those of shipped_kernel_class).\n"
            f"CREATE OR REPLACE MACRO shipped_class_scheme(class_scheme) AS class_scheme IN ({schemes});\n\n"
            "-- Whether device_activity matches each device event against class_scheme's rules (the shipped schemes of\n"
            f"-- at most {PER_EVENT_PATTERNS} patterns), rather than each distinct name once (device_classes).\n"
            "CREATE OR REPLACE MACRO shipped_class_per_event(class_scheme) AS\n"
            f"    COALESCE(class_scheme IN ({per_event}), false);\n\n"
            "-- The class of a device event (kind, name, category) by the rules of kernel_classes.csv of a shipped\n"
            "-- scheme: the rule of lowest priority that matches (NULL: none does). Generated from the CSV, in\n"
            "-- priority order; device_activity and device_classes use it for the shipped schemes.\n"
            "CREATE OR REPLACE MACRO shipped_kernel_class(class_scheme, kind, name, category) AS CASE\n"
            + "\n".join(whens) + "\nEND;\n")


def _written_files() -> list[tuple[str, str]]:
    """(file name, SQL) of each macro file and of the kernel classes (generated from their CSV)."""
    return [(p.name, p.read_text()) for p in HERE.glob("*.sql")] + [("15_kernel_classes.sql", kernel_class_sql())]


def sql_files() -> list[tuple[str, str]]:
    """(file name, SQL) of each macro file in creation order, the generated ones (15_kernel_classes.sql,
    31_op_families.sql) among them."""
    dispatch = ("-- The formula of an op's family: a branch to each pair of typed_op_flops_FAMILY and "
                "typed_op_bytes_FAMILY\n-- macros of 30_flops.sql (tracesql/functions/__init__.py, "
                "family_dispatch).\n\n" + family_dispatch(formula_families()))
    return sorted(_written_files() + [("31_op_families.sql", dispatch)])


def sql(files: tuple[str, ...] | None = None) -> str:
    """The SQL of `files` (names in this folder), or of all of them."""
    chosen = sorted(p for p in HERE.glob("*.csv") if files is None or p.name in files)
    tables = [csv_table_sql(p) for p in chosen]
    macros = [text for name, text in sql_files() if files is None or name in files]
    return "\n".join(tables + macros)


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CREATE = re.compile(r"^CREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?(?:MACRO|FUNCTION|TABLE|VIEW)\s+(\w+)",
                     re.MULTILINE | re.IGNORECASE)


_STRING_OR_COMMENT = re.compile(r"'(?:[^']|'')*'|--[^\n]*")


def words(text: str) -> set[str]:
    """The identifiers in SQL text outside its comments, lower case: a superset of the tables and functions it
    uses (a comment naming a function, e.g. the one before the next macro, does not make the text use it)."""
    code = _STRING_OR_COMMENT.sub(lambda m: m[0] if m[0].startswith("'") else "", text)
    return {w.lower() for w in _WORD.findall(code)}


@functools.cache
def definitions() -> list[tuple[str | None, str]]:
    """(name, SQL) of each definition in creation order: the CSV tables, then each statement of the macro files
    (a chunk with no CREATE in it has no name: it always runs)."""
    found: list[tuple[str | None, str]] = [(p.stem.lower(), csv_table_sql(p)) for p in sorted(HERE.glob("*.csv"))]
    for _, text in sql_files():
        found += _statements(text)
    return found


@functools.cache
def _statements(text: str) -> list[tuple[str | None, str]]:
    """(name, SQL) of each statement of one file's text, split once a process: `definitions` and
    `formula_families` (which families have formula macros) read the same split."""
    starts = [m.start() for m in _CREATE.finditer(text)]
    head = text[: starts[0]] if starts else text
    found = []
    if head.strip() and any(not line.strip().startswith("--") for line in head.splitlines() if line.strip()):
        found.append((None, head))
    for a, b in zip(starts, starts[1:] + [len(text)]):
        found.append((_CREATE.match(text, a)[1].lower(), text[a:b]))
    return found


def needed(names: set[str], tables: set[str] = frozenset()) -> tuple[list[str], set[str]]:
    """The definitions (SQL, in creation order) that SQL using `names` needs, with the definitions those use in
    turn, and which of `tables` (the run's views) they all use."""
    defs, uses = definitions(), _uses()
    todo, seen = [n for n in names if n in uses], set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [w for w in uses[name] if w in uses and w not in seen]
    used_tables = {t for t in tables if t in names or any(t in uses[n] for n in seen)}
    return [text for name, text in defs if name is None or name in seen], used_tables


#: The Python function (tracesql/critical_path.py) by which SQL walks a critical path
WALK = "critical_path_walk"


def walks(names: set[str]) -> bool:
    """Whether SQL using `names` walks a critical path: calls WALK, or a macro that does (what_if,
    step_critical_paths, ...)."""
    return WALK in needed(names, {WALK})[1]


@functools.cache
def _uses() -> dict[str, set[str]]:
    """The words of each named definition (`words`), worked out once a process: `needed` looks them up for each
    connection (a query's start)."""
    return {name: words(text) for name, text in definitions() if name}


#: The macros that dispatch on an op's family (k.family, op_kind's) to its formula, NAME_FAMILY in 30_flops.sql:
#: what they give, and the arguments they and those macros take
FAMILY_DISPATCH = {"typed_op_flops": ("FLOPs", "k, d, t, c, a, attention_convention"),
                   "typed_op_bytes": ("Bytes", "k, d, t, c, a")}


@functools.cache
def formula_families() -> frozenset[str]:
    """The op families that have a formula: FAMILY of each typed_op_flops_FAMILY macro (30_flops.sql, which has
    typed_op_bytes_FAMILY too)."""
    prefix = "typed_op_flops_"
    return frozenset(name.removeprefix(prefix) for _, text in _written_files() for name, _ in _statements(text)
                     if name and name.startswith(prefix))


def family_dispatch(families: set[str] | frozenset[str], temp: bool = False) -> str:
    """The macros of FAMILY_DISPATCH over the formulas of `families` (of formula_families; an op of another
    family gets NULL, as one of no family does from the macros over all of them, which `sql_files` makes of this).
    temp: as TEMP macros, on the connection alone, where they come before (shadow) the shared ones in every
    statement and macro that calls them until dropped. DuckDB binds every branch of a CASE, and the formulas of all
    families were most of the planning of the ingest's op_costs statement (0.2 of 0.36 CPU-s on any run): it binds
    those of the families its run's ops take."""
    kept, out = sorted(families), []
    for name, (what, args) in FAMILY_DISPATCH.items():
        branches = "".join(f"        WHEN '{f}' THEN {name}_{f}({args})\n" for f in kept)
        out.append(
            f"-- {what} of an op by the formula of its family (k.family: {name}_FAMILY; NULL when it has none), "
            "over its\n-- arguments as the `ops` columns type them (d = input_dims, t = input_types, c = "
            "concrete_inputs), a =\n-- op_args(d, t, c) and k = op_kind() (op_calls() gives both). Spark never expands "
            "it: its queries read the\n-- `op_costs` table, and op_flops / op_bytes run there as DuckDB UDFs "
            "(tracesql/transpile.py).\n"
            f"CREATE OR REPLACE {'TEMP ' if temp else ''}MACRO {name}({args}) AS (\n"
            + (f"    CAST(CASE k.family\n{branches}    END AS DOUBLE)\n" if kept else "    CAST(NULL AS DOUBLE)\n")
            + ");\n")
    return "\n".join(out)


@functools.cache
def table_names() -> frozenset[str]:
    """The data tables (lower case) the definitions create: kept on a connection `db.for_trace` keeps."""
    return frozenset(p.stem.lower() for p in HERE.iterdir() if p.suffix == ".csv")


#: The definitions `once` made on each connection.
_made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def once(con, statements: str | list[str]) -> None:
    """Run the `statements` (definitions: macros, variables, the macros' data tables, which `db.clear` keeps)
    that did not run on `con` already, as one execute: a connection `db.for_trace` keeps gets each once, not once
    per trace."""
    made = _made.setdefault(con, set())
    todo = [s for s in ([statements] if isinstance(statements, str) else statements) if s not in made]
    if todo:
        con.execute("\n".join(todo)).fetchall()
        made.update(todo)


def install(con, files: tuple[str, ...] | None = None, names: set[str] | None = None,
            cache: Path | None = None) -> None:
    """Create the functions on `con`: all of them, those of `files`, or only those SQL using `names` needs
    (those not made on `con` already: `once`; a connection `db.for_trace` keeps gets each once). With a `cache`
    folder (not with `files`): all of them, the data tables in the session (a user may edit them), the macros from
    the database file `compiled` keeps there, attached read-only and put on the session's search path after its
    own schema (its views, its data tables and its temporary macros come first); where the file cannot be made or
    attached, the session creates them (those `names` needs, or all). Creating the 186 macros took 0.36 CPU-s a
    session, as DuckDB binds each one it creates (the cost model's op_flops and op_bytes 80 ms); attaching them,
    0.05; 467 sessions of the default test suite made them, a third of its time. Even a query's own macros take
    longer to create than all of them to attach: a connection took 0.35 s creating findings' 56, 0.12 s
    critical_path's 27, 0.22 s overlap's 11; 0.07 s with all of them attached."""
    database = compiled(cache) if cache is not None and files is None else None
    if database is not None and _attached(con, database):
        return
    if names is not None:
        once(con, needed(names)[0])
    else:
        con.execute(sql(files)).fetchall()


def _attached(con, database: Path) -> bool:
    """Attach the compiled macros' `database` to `con` (with the data tables, made in the session) and put it on
    the search path; False where it cannot be attached (a damaged or unreadable file)."""
    import duckdb

    con.execute(_compilable()[1]).fetchall()
    try:
        con.execute(f"ATTACH {quote(str(database))} AS {COMPILED} (READ_ONLY)").fetchall()
    except duckdb.Error:
        return False
    own = con.execute("SELECT current_database()").fetchall()[0][0]
    con.execute(f"SET search_path = {quote(f'{own}.main,{COMPILED}.main')}").fetchall()
    return True


#: The name a session attaches the compiled macros' database by
COMPILED = "tracesql_functions"


@functools.cache
def _compilable() -> tuple[str, str, str, str]:
    """(key, data tables' SQL, empty tables of the schema's columns, macros' SQL) of `compiled`, read and
    generated once a process: every session asks for them. The key: XXH3-128 of them and of DuckDB's version."""
    import duckdb
    import xxhash

    from .. import schema

    tables = "\n".join(csv_table_sql(p) for p in sorted(HERE.glob("*.csv")))
    placeholders = "".join(f"CREATE TABLE {t.name} ({', '.join(f'{c.name} {c.type}' for c in t.columns)});\n"
                           for t in schema.TABLES.values())
    macros = "\n".join(text for _, text in sql_files())
    key = xxhash.xxh3_128_hexdigest("\0".join((duckdb.__version__, placeholders, tables, macros)).encode())
    return key, tables, placeholders, macros


def compiled(cache: Path) -> Path | None:
    """A DuckDB database file in `cache` holding every macro, made once per version of their SQL (and of DuckDB),
    or None where it cannot be made (then each session creates them). The macros are bound as they are
    created, against empty tables of the run's columns and the data tables, dropped after: a session binds
    them again, on its own views, when it calls them. Written under a temporary name and renamed into place."""
    import contextlib
    import os
    import uuid

    import duckdb

    from .. import schema

    key, tables, placeholders, macros = _compilable()
    path = Path(cache) / "functions" / f"{key}.duckdb"
    if path.is_file():
        return path
    scratch = path.with_name(f".{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}.duckdb")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        con = duckdb.connect(str(scratch))
        try:
            con.execute(placeholders + tables).fetchall()
            con.execute("SET VARIABLE tracesql_classes_stored = true").fetchall()
            con.execute(macros).fetchall()
            con.execute("".join(f"DROP TABLE {t};" for t in [*schema.TABLES, *table_names()])).fetchall()
        finally:
            con.close()
        os.replace(scratch, path)
    except (OSError, duckdb.Error):  # (a folder not writable, a disk full, a macro this DuckDB cannot bind)
        for leftover in (scratch, scratch.with_name(scratch.name + ".wal")):
            with contextlib.suppress(OSError):
                leftover.unlink(missing_ok=True)
        return None
    return path


def quote(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
