"""The SQL that shows a run's Parquet files as tables: a view per table, and `init.sql` for plain DuckDB clients.

Text only (no connection, no DuckDB import): ingestion writes `init_sql()` into every run, the engine runs
`views_sql()` on its connections.
"""

from __future__ import annotations

from . import functions, schema
from .functions import quote


def escape_path(path: str) -> str:
    """`path` as DuckDB reads exactly that file: DuckDB takes `*`, `?` and `[` in a path as a glob pattern, so
    each becomes a one-character class (`exp[1]` -> `exp[[]1]`) that matches only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


def files_sql(files: list[str]) -> str:
    """The inside of read_parquet's list for exactly `files` (escaped, quoted)."""
    return ", ".join(quote(escape_path(f)) for f in files)


def view_sql(name: str, files_: list[str], have: set[str] | None = None) -> str:
    """One table as a view over its Parquet files (named one by one, never globbed); with none (runs of an older
    schema) an empty table of its columns. `have`: the columns the files have, when they may lack some (runs of
    an older schema): the view reads the files by name and gives each missing column as NULL, or derived from the
    others (schema.DERIVED_FOR_OLDER_RUNS)."""
    table = schema.TABLES[name]
    files = files_sql(files_)
    empty = ", ".join(f'CAST(NULL AS {c.type}) AS "{c.name}"' for c in table.columns)
    join, derived = schema.DERIVED_FOR_OLDER_RUNS.get(name, ("", {}))
    if files and have is not None and (derived or not set(table.column_names) <= have):
        def column(c) -> str:
            if c.name in derived:  # a file of an older run lacks it (NULL in union_by_name), the others have it
                value = f't."{c.name}"' if c.name in have else "NULL"
                return f'CAST(COALESCE({value}, {derived[c.name]}) AS {c.type}) AS "{c.name}"'
            return f't."{c.name}"' if c.name in have else f'CAST(NULL AS {c.type}) AS "{c.name}"'

        columns = ", ".join(column(c) for c in table.columns)
        source = (f"SELECT {columns} FROM read_parquet([{files}], union_by_name = true) t "
                  + join.format(files=files))
    else:
        source = f"SELECT * FROM read_parquet([{files}])" if files else f"SELECT {empty} WHERE false"
    return f"-- {table.doc}\nCREATE OR REPLACE VIEW {name} AS {source};"


def views_sql(globs_per_table: dict[str, list[str]], present: dict[str, set[str]] | None = None) -> str:
    """A view per table of `globs_per_table` (all tables of the schema when it names each of them). `present`:
    for tables whose files may lack columns (runs of an older schema), the columns they have (see view_sql)."""
    return "\n".join(view_sql(name, globs_per_table[name], (present or {}).get(name))
                     for name in schema.TABLES if name in globs_per_table) + "\n"


def init_sql(files=None) -> str:
    """The SQL a plain DuckDB client runs (from inside the run folder) to see the tables and functions: views
    over the run's files (`files`: the manifest's, `table/file.parquet`), or over `table/*.parquet`."""
    header = (
        f"-- tracesql run (schema version {schema.SCHEMA_VERSION}). Open it in any DuckDB client, from this folder:\n"
        "--   cd <this run> && duckdb -init init.sql\n"
        "-- or in Python: os.chdir(run); con.execute(open('init.sql').read())\n"
    )
    if files is None:
        per_table = {t: [f"{t}/*.parquet"] for t in schema.TABLES}
        return header + views_sql(per_table).replace("[*]", "*") + functions.sql()
    per_table = {t: [f for f in sorted(files) if f.split("/")[0] == t] for t in schema.TABLES}
    return header + views_sql(per_table) + functions.sql()
