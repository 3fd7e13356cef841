"""The findings: what limits each step and what fixing it would save, one rule per SQL file.

Each rule is a plain `.sql` file of `findings/` (packaged as `tracesql/rules`) with the curated queries' header
(tracesql/queries.py: what it detects, its thresholds as parameters with defaults, its columns), returning one row
per (run, rank, step) where it fires, with the columns of FINDING_COLUMNS. Every rule prices its cause with the
what-if replay (the what_if table macro): saving_ns is the step time the replay says the fix saves. `findings`
runs them all and ranks their rows by saving_ns, largest first.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from . import queries
from .errors import TraceError

#: The columns every rule returns, in this order (a test checks each rule's header and result against them).
FINDING_COLUMNS = (
    ("run_id", "VARCHAR", "run"),
    ("rank", "INTEGER", "rank"),
    ("step", "INTEGER", "step"),
    ("finding", "VARCHAR", "the rule that fired (its file's name)"),
    ("evidence", "VARCHAR", "what it saw, with the numbers"),
    ("saving_ns", "BIGINT", "step time the what-if replay says the fix saves (0 when it saves none)"),
    ("saving_pct", "DOUBLE", "saving_ns in % of the step's replayed time"),
    ("query", "VARCHAR", "the tracesql command that shows the evidence"),
)


def rules_dir() -> Path:
    """Where the rules are: inside the installed package, or the repository's `findings/`."""
    packaged = Path(__file__).parent / "rules"
    return packaged if packaged.is_dir() else Path(__file__).parent.parent / "findings"


def catalogue() -> list[queries.Query]:
    return [queries.parse(p) for p in sorted(rules_dir().glob("*.sql"))]


def names_used() -> set[str]:
    """The identifiers the rules use: what `engine.connect(names=...)` must create for them."""
    return set().union(*(queries.names_used(rule) for rule in catalogue()))


def check(params: dict) -> dict:
    """`params` if some rule takes each of them, with a value it allows; else a TraceError naming what is."""
    rules = catalogue()
    for name, value in params.items():
        takers = [rule for rule in rules if name in rule.params]
        if not takers or name == "run":
            known = sorted({p for rule in rules for p in rule.params} - {"run"})
            raise TraceError("findings", f"no rule takes a parameter {name} (they take: {', '.join(known)})")
        for rule in takers:
            queries.check(rule, {name: value})
    return params


@contextlib.contextmanager
def _computed_once(con, table: str, query: str, macro: str, macro_sql: str):
    """While the rules run, `query` computed once into the temporary `table`, and the table macro `macro` (which
    the rules' SQL calls) replaced by `macro_sql`, which reads it; both dropped after."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS {query}")
    con.execute(f"CREATE OR REPLACE TEMP MACRO {macro_sql}")
    try:
        yield
    finally:
        con.execute(f"DROP MACRO TABLE temp.{macro}")
        con.execute(f"DROP TABLE temp.{table}")


def _event_lists_once(con):
    """The events of every rank's steps (critical_path_event_lists with its defaults, what each rule's what-if and
    critical path read) once, for critical_path_event_source to read in their place: on the 24× tile they took 12
    CPU-s a rule. Other windows are computed as before."""
    defaults = "annotation IS NULL AND occurrence IS NULL AND rank_filter IS NULL"
    return _computed_once(
        con, "findings_event_lists", "FROM critical_path_event_lists()", "critical_path_event_source",
        "critical_path_event_source(annotation := NULL, occurrence := NULL, rank_filter := NULL) AS TABLE "
        f"FROM findings_event_lists WHERE {defaults} UNION ALL "
        "FROM critical_path_event_lists(annotation := annotation, occurrence := occurrence, "
        f"rank_filter := rank_filter) WHERE NOT ({defaults})")


def _unchanged_once(con):
    """Each default window's measured and unchanged replayed time and critical path (the what_if macro's rows
    without a change) once, for what_if_unchanged to read: each rule's what-if then walks its changed replay only
    (and the unchanged replay and paths of the steps whose change makes a range an op: their graphs change)."""
    return _computed_once(
        con, "findings_unchanged", "SELECT * EXCLUDE (predicted_ns, saving_ns, saving_pct) FROM what_if()",
        "what_if_unchanged", "what_if_unchanged(annotation := NULL, occurrence := NULL) AS TABLE "
        "FROM findings_unchanged WHERE annotation IS NULL AND occurrence IS NULL")


def _paths_once(con):
    """HTA's critical path of each default window (step_critical_paths) once, for the rules that look for the host
    work on it (host_op, idle_bubbles): each walked them again."""
    return _computed_once(con, "findings_paths", "FROM step_critical_paths()", "step_critical_paths",
                          "step_critical_paths(rank_filter := NULL) AS TABLE "
                          "FROM findings_paths WHERE rank_filter IS NULL OR rank = rank_filter")


def run(con, target: str, params: dict | None = None):
    """Every rule's rows on `con`, largest saving first, as a DuckDB relation on `con`. `target`: the run as the
    user named it, written into each row's `query` command; `params` (name -> value) go to the rules that take
    them (e.g. min_saving_pct, every rule's threshold)."""
    import pyarrow as pa

    params = check(dict(params or {}))
    with _event_lists_once(con), _unchanged_once(con):
        found = pa.concat_tables([
            queries.run(con, rule, {"run": target} | {k: v for k, v in params.items() if k in rule.params})
            .to_arrow_table() for rule in catalogue()])
    order = [("saving_ns", "descending")] + [(c, "ascending") for c in ("run_id", "rank", "step", "finding")]
    return con.from_arrow(found.sort_by(order))

