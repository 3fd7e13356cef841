"""The findings: what limits each step and what fixing it would save, one rule per SQL file.

Each rule is a plain `.sql` file of `findings/` (packaged as `tracesql/rules`) with the curated queries' header
(tracesql/queries.py: what it detects, its thresholds as parameters with defaults, its columns), returning one row
per (run, rank, step) where it fires, with the columns of FINDING_COLUMNS. Every rule prices its cause with the
what-if replay (the what_if table macro): saving_ns is the step time the replay says the fix saves. `findings`
runs them all and ranks their rows by saving_ns, largest first. It prices the rules' what-ifs together first:
each rule's statements before its last (what it prices) run, the change of each what_if call of its last
statement is read (what_if_change), and every step is replayed once with all the changes (_priced_once); the
rules' what_if calls then read their predicted times.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import duckdb

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
    """The identifiers the rules use, and `run` to price their what-ifs: what `engine.connect(names=...)` must
    create for them."""
    return set().union(*(queries.names_used(rule) for rule in catalogue())) | {"what_if_change"}


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
        con, "findings_unchanged",
        "SELECT * EXCLUDE (predicted_ns, saving_ns, saving_pct) FROM what_if(predict := 0)",
        "what_if_unchanged", "what_if_unchanged(annotation := NULL, occurrence := NULL) AS TABLE "
        "FROM findings_unchanged WHERE annotation IS NULL AND occurrence IS NULL")


def _paths_once(con):
    """HTA's critical path of each default window (step_critical_paths) once, for the rules that look for the host
    work on it (host_op, idle_bubbles): each walked them again."""
    return _computed_once(con, "findings_paths", "FROM step_critical_paths()", "step_critical_paths",
                          "step_critical_paths(rank_filter := NULL) AS TABLE "
                          "FROM findings_paths WHERE rank_filter IS NULL OR rank = rank_filter")


def _what_if_calls(sql: str) -> list[str]:
    """The arguments of each call of the what_if macro in `sql`, as DuckDB SQL (sqlglot's parse of it)."""
    import sqlglot
    from sqlglot import exp

    return [", ".join(argument.sql("duckdb") for argument in call.expressions)
            for statement in sqlglot.parse(sql, read="duckdb") if statement is not None
            for call in statement.find_all(exp.Anonymous) if call.name.lower() == "what_if"]


def _changes(con, sql: str) -> list[dict]:
    """The change of each call of what_if in `sql` that replays the default windows (what_if_change), evaluated on
    `con` as the rule's statement will (its variables set): those `findings` can price before its rules run."""
    changes = []
    for arguments in _what_if_calls(sql):
        try:
            row = con.execute(f"FROM what_if_change({arguments})").fetchone()
        except (duckdb.BinderException, duckdb.CatalogException):
            continue  # (an argument of the rule's own rows, or of a table of its own: priced as the rule runs)
        names = [d[0] for d in con.description]
        change = dict(zip(names, row))
        if change.pop("default_windows"):
            changes.append(change)
    return changes


@contextlib.contextmanager
def _priced_once(con, changes: list[dict]):
    """Each change's predicted time of every default window (each step), for what_if to read while the rules run
    (what_if_priced, what_if_predicted): the events of each step read and its graph planned once for all the
    changes, each change's scales (critical_path_events') a list beside them, each change walked on the one plan
    (critical_path_replay_lengths). A change that makes a range an op in some step (its graph is not the
    unchanged one) is left to what_if. A change that changes nothing (a rule that found nothing to price) predicts
    the unchanged replay's time (what_if_unchanged's): no scales, no walk."""
    try:  # (what an error leaves half made is dropped too)
        changes = list({c["key"]: c for c in changes}.values())
        idle = [c["key"] for c in changes if _changes_nothing(c)]
        changes = [c for c in changes if not _changes_nothing(c)]
        # the scales of each change of critical_path_scales' parameters (changes that differ in no_launch_overhead
        # only share them)
        scaled = {_scaling(c): None for c in changes}
        con.execute("CREATE OR REPLACE TEMP TABLE findings_scales (scaling INTEGER, run_id VARCHAR, rank INTEGER, "
                    "window_name VARCHAR, instance INTEGER, scales DOUBLE[], reroled BOOLEAN)")
        for number, values in enumerate(scaled):
            scaled[values] = number
            arguments = ", ".join(f"{name} := {_literal(value)}" for name, value in zip(SCALE_PARAMETERS, values))
            con.execute(f"INSERT INTO findings_scales SELECT {number}, run_id, rank, window_name, instance, scales, "
                        f"reroled FROM critical_path_scales({arguments})")
        reroled = {n for (n,) in con.execute("SELECT DISTINCT scaling FROM findings_scales WHERE reroled").fetchall()}
        priced = [c for c in changes if scaled[_scaling(c)] not in reroled]
        keys = [c["key"] for c in priced]
        gaps = [1.0 if c["no_launch_overhead"] != 1 else 0.0 for c in priced]
        scalings = [scaled[_scaling(c)] for c in priced]
        con.execute(f"""CREATE OR REPLACE TEMP TABLE findings_predicted AS
            WITH windows AS (
                SELECT e.*, COALESCE(e.step, e.instance) AS joint, s.scales
                FROM critical_path_event_source() e
                JOIN (SELECT run_id, rank, window_name, instance,
                          [by_scaling[n + 1] FOR n IN {_literal(scalings)}::INTEGER[]] AS scales
                      FROM (SELECT run_id, rank, window_name, instance, list(scales ORDER BY scaling) AS by_scaling
                            FROM findings_scales GROUP BY ALL)) s
                  ON s.run_id = e.run_id AND s.rank = e.rank AND s.window_name = e.window_name
                 AND s.instance = e.instance
                WHERE {len(priced)} > 0
            ), shared AS (
                SELECT run_id, window_name, joint FROM windows GROUP BY ALL HAVING count(*) > 1
            ), joint AS (
                -- (as what_if's: one rank's list as it is, several ranks' joined, here in rank order, as their scales)
                SELECT run_id, window_name, joint, window_ts AS joint_ts, events, scales,
                    [struct_pack(rank := CAST(rank AS BIGINT), ts := window_ts, te := window_te)] AS spans
                FROM windows
                WHERE (run_id, window_name, joint) NOT IN (SELECT (run_id, window_name, joint) FROM shared)
                UNION ALL
                SELECT run_id, window_name, joint, min(window_ts), flatten(list(events ORDER BY rank)),
                    [flatten([s[k] FOR s IN list(scales ORDER BY rank)]) FOR k IN range(1, {len(priced) + 1})],
                    list(struct_pack(rank := CAST(rank AS BIGINT), ts := window_ts, te := window_te))
                FROM windows
                WHERE (run_id, window_name, joint) IN (SELECT (run_id, window_name, joint) FROM shared)
                GROUP BY ALL
            ), lengths AS (
                SELECT run_id, window_name, joint, joint_ts,
                    unnest(critical_path_replay_lengths(events, spans, scales, {_literal(gaps)}::DOUBLE[])) AS l
                FROM joint
            )
            SELECT [{", ".join(map(_literal, keys)) or "NULL"}][l.l.change + 1] AS key, w.run_id, w.rank,
                w.window_name, w.instance, l.l.length_ns - (w.window_ts - l.joint_ts) AS predicted_ns
            FROM windows w
            JOIN lengths l ON l.run_id = w.run_id AND l.window_name = w.window_name AND l.joint = w.joint
             AND l.l.path_rank = w.rank
            UNION ALL
            SELECT k.key, u.run_id, u.rank, u.window_name, u.instance, u.replayed_ns
            FROM what_if_unchanged() u, unnest({_literal(idle)}::VARCHAR[]) k(key)
            WHERE u.replayed_ns IS NOT NULL""")
        con.execute("DROP TABLE temp.findings_scales")
        keys = ", ".join(map(_literal, keys + idle)) or "NULL"
        parameters = "faster, faster_pct, hide_communication, no_launch_overhead, remove_syncs, straggler_to_median"
        con.execute(f"CREATE OR REPLACE TEMP MACRO what_if_priced({parameters}) AS "
                    f"what_if_change_key({parameters}) IN ({keys})")
        con.execute(f"CREATE OR REPLACE TEMP MACRO what_if_predicted({parameters}) AS TABLE "
                    f"SELECT run_id, rank, window_name, instance, predicted_ns FROM findings_predicted "
                    f"WHERE key = what_if_change_key({parameters})")
        yield
    finally:
        con.execute("DROP MACRO IF EXISTS temp.what_if_priced")
        con.execute("DROP MACRO TABLE IF EXISTS temp.what_if_predicted")
        con.execute("DROP TABLE IF EXISTS temp.findings_predicted")
        con.execute("DROP TABLE IF EXISTS temp.findings_scales")


def _changes_nothing(change: dict) -> bool:
    """Whether the change changes no event and no gap: its predicted time is the unchanged replay's."""
    return change["faster"] is None and not any(change[name] for name in (
        "hide_communication", "no_launch_overhead", "remove_syncs", "straggler_to_median"))


def _scaling(change: dict) -> tuple:
    """The change's parameters of critical_path_scales (faster_pct 0 without a `faster`: it scales nothing)."""
    values = dict(change, faster_pct=change["faster_pct"] if change["faster"] is not None else 0.0)
    return tuple(values[name] for name in SCALE_PARAMETERS)


#: critical_path_scales' parameters of a change (what_if_change's columns)
SCALE_PARAMETERS = ("faster", "faster_pct", "hide_communication", "remove_syncs", "straggler_to_median")


def _literal(value) -> str:
    """A SQL literal of a change's value (a DOUBLE cast as one: a decimal literal would be a DECIMAL)."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, float):
        return f"CAST('{value!r}' AS DOUBLE)"
    if isinstance(value, list):
        return "[" + ", ".join(map(_literal, value)) + "]"
    return str(value)


def run(con, target: str, params: dict | None = None):
    """Every rule's rows on `con`, largest saving first, as a DuckDB relation on `con`. `target`: the run as the
    user named it, written into each row's `query` command; `params` (name -> value) go to the rules that take
    them (e.g. min_saving_pct, every rule's threshold). The rules' statements before their last (what each
    prices) run first, then their what-ifs are priced together (_priced_once), then their last statements."""
    import pyarrow as pa

    params = check(dict(params or {}))
    rules = catalogue()
    given = {rule.name: {"run": target} | {k: v for k, v in params.items() if k in rule.params} for rule in rules}
    with _event_lists_once(con), _unchanged_once(con), _paths_once(con):
        changes = [change for rule in rules for change in _changes(con, queries.prepare(con, rule, given[rule.name]))]
        with _priced_once(con, changes):
            found = pa.concat_tables([queries.run(con, rule, given[rule.name], prepared=True).to_arrow_table()
                                      for rule in rules])
    order = [("saving_ns", "descending")] + [(c, "ascending") for c in ("run_id", "rank", "step", "finding")]
    return con.from_arrow(found.sort_by(order))
