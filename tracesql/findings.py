"""The findings: what limits each step and what fixing it would save, one rule per SQL file.

Each rule is a plain `.sql` file of `findings/` (packaged as `tracesql/rules`) with the curated queries' header
(tracesql/queries.py: what it detects, its thresholds as parameters with defaults, its columns), returning one row
per (run, rank, step) where it fires, with the columns of FINDING_COLUMNS. Every rule prices its cause with the
what-if replay (the what_if table macro): saving_ns is the step time the replay says the fix saves. `findings`
runs them all and ranks their rows by saving_ns, largest first. It prices the rules' what-ifs together first:
each rule's statements before its last (what it prices) run, the change of each what_if call of its last
statement is read (what_if_change), and every step's graph is planned once and walked with each change
(critical_path.replay_lengths, _priced_once); the rules' what_if calls then read their predicted times. The walks
(Python) run in a thread while DuckDB runs the SQL they do not wait for (run).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import duckdb
import numpy as np

from . import critical_path, functions, longest_path, queries
from .errors import TraceError
from .functions import quote

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
    """The identifiers the rules use, and `run` to price their what-ifs and read their rows (_known_what_if): what
    `engine.connect(names=...)` must create for them."""
    return set().union(*(queries.names_used(rule) for rule in catalogue())) | {"what_if_change", "what_if_known"}


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
def _computed_once(con, table: str, query, macros: dict[str, str]):
    """While the rules run, `query` (SQL: computed once into the temporary `table`; or an Arrow table: its rows,
    registered as `table`, not copied) and the table macros named in `macros` (which the rules' SQL calls)
    replaced by their definitions there, which read it; all dropped after."""
    computed = isinstance(query, str)
    if computed:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS {query}")
    else:
        con.register(table, query)
    try:
        for definition in macros.values():
            con.execute(f"CREATE OR REPLACE TEMP MACRO {definition}")
        yield
    finally:
        for macro in macros:
            con.execute(f"DROP MACRO TABLE IF EXISTS temp.{macro}")
        if computed:
            con.execute(f"DROP TABLE temp.{table}")
        else:
            con.unregister(table)


@contextlib.contextmanager
def _event_lists_once(con):
    """The events of every rank's steps (critical_path_event_lists with its defaults, what each rule's what-if and
    critical path read) once, as an Arrow table (what the walks read; made into a table of DuckDB first, then
    read, they took 1 s more at 24x), for critical_path_event_source to read in their place (on the 24× tile
    they took 12 CPU-s a rule); the block gets the table. Each with a key (walk_key), by which what_if finds the
    walks walk_ahead walked (critical_path_replay_lengths, critical_path_walked_ahead): a hash of its window and
    of a number drawn for this call, so that no other list's walk in the process has it (a hash of the events
    themselves took 0.6 CPU-s at 24x).
    Other windows are computed as before: the source is the query its arguments name (`query` of a string DuckDB
    folds as it binds), so that a call with the defaults binds the table alone (binding
    critical_path_event_lists too took 0.11 of the 0.15 s each what_if of the rules took to plan at 24x)."""
    literal = "CASE WHEN annotation IS NULL THEN 'NULL' ELSE '''' || replace(annotation, '''', '''''') || '''' END"
    drawn = int.from_bytes(os.urandom(8), "little") >> 1
    lists = con.sql(f"SELECT * REPLACE (hash(run_id, rank, window_name, instance, {drawn}) AS walk_key) "
                    "FROM critical_path_event_lists()").to_arrow_table()
    with _computed_once(con, "findings_event_lists", lists, {"critical_path_event_source":
        "critical_path_event_source(annotation := NULL, occurrence := NULL, rank_filter := NULL) AS TABLE "
        "FROM query(CASE WHEN annotation IS NULL AND occurrence IS NULL AND rank_filter IS NULL "
        "THEN 'FROM findings_event_lists' "
        "ELSE printf('FROM critical_path_event_lists(annotation := %s, occurrence := %s, rank_filter := %s)', "
        f"{literal}, COALESCE(CAST(occurrence AS VARCHAR), 'NULL'), COALESCE(CAST(rank_filter AS VARCHAR), 'NULL')) "
        "END)"}):
        yield lists


@contextlib.contextmanager
def _unchanged_once(con, lists):
    """Each default window's measured and unchanged replayed time and critical path (the what_if macro's rows
    without a change) once, for what_if_unchanged to read: each rule's what-if then walks its changed replay only
    (and the unchanged replay and paths of the steps whose change makes a range an op: their graphs change).
    Where every default window's walks are walked ahead (`findings` walks them first: critical_path.walk_ahead),
    what_if finds them by their keys (`lists`' walk_key) and reads the lists without their events here (their
    scan took 0.5 CPU-s at 24x)."""
    import pyarrow as pa

    if critical_path.is_walked_ahead(lists.column("walk_key").combine_chunks()).false_count == 0:
        events = lists.schema.get_field_index("events")
        con.register("findings_event_lists", lists.set_column(events, lists.field(events),
                                                              pa.nulls(lists.num_rows, lists.field(events).type)))
    with contextlib.ExitStack() as computed:
        try:
            computed.enter_context(_computed_once(
                con, "findings_unchanged",
                "SELECT * EXCLUDE (predicted_ns, saving_ns, saving_pct) FROM what_if(predict := 0)",
                {"what_if_unchanged": "what_if_unchanged(annotation := NULL, occurrence := NULL) AS TABLE "
                 "FROM findings_unchanged WHERE annotation IS NULL AND occurrence IS NULL"}))
        finally:
            con.register("findings_event_lists", lists)
        yield


def _paths_once(con, paths):
    """HTA's critical path of each default window (step_critical_paths' rows, `paths`: those walk_ahead walked)
    as a table, for the rules that look for the host work on it (host_op, idle_bubbles: each walked them again,
    and reading them back through critical_path_walk took 2 s at 24x), and for what_if (step_critical_paths_walked:
    made into lists of each window's path, they took 0.6-1 CPU-s of the unchanged replays at 24x)."""
    return _computed_once(con, "findings_paths", paths, {
        "step_critical_paths": "step_critical_paths(rank_filter := NULL) AS TABLE "
                               "FROM findings_paths WHERE rank_filter IS NULL OR rank = rank_filter",
        "step_critical_paths_walked": "step_critical_paths_walked() AS TABLE FROM findings_paths"})


def _what_if_calls(con, sql: str) -> list[str] | None:
    """The arguments of each call of the what_if macro in `sql` (a statement), as its text has them, in the
    text's order: DuckDB's parse of it (json_serialize_sql) says where each table function's call is in the
    text; None where DuckDB cannot serialize the statement (not a SELECT). (sqlglot's parse and import took
    0.18 s of findings.)"""
    import json

    (serialized,) = con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone()
    tree = json.loads(serialized)
    if tree.get("error"):
        return None
    calls, todo = [], [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            if (node.get("type") == "TABLE_FUNCTION"
                    and node["function"].get("function_name", "").lower() == "what_if"):
                calls.append((node["query_location"], node["query_location_length"]))
            todo.extend(node.values())
        elif isinstance(node, list):
            todo.extend(node)
    text = sql.encode()  # (the places are in bytes)
    if any(start + length > len(text) for start, length in calls):  # (a place DuckDB does not know)
        return None
    return [text[start:start + length].decode().split("(", 1)[1].rsplit(")", 1)[0].strip()
            for start, length in sorted(calls)]


def _changes(con, sql: str) -> tuple[list[dict], bool]:
    """The change of each call of what_if in `sql` that replays the default windows (what_if_change), evaluated on
    `con` as the rule's statement will (its variables set): those `findings` can price before its rules run; and
    whether every call's arguments could be evaluated so (constants: _known_what_if may stand in for what_if)."""
    calls = _what_if_calls(con, sql)
    changes, constant = [], calls is not None
    for arguments in calls or []:
        try:
            (row,) = con.execute(f"FROM what_if_change({arguments})").fetchall()
        except (duckdb.BinderException, duckdb.CatalogException, duckdb.InvalidInputException):
            # (an argument of the rule's own rows, or of a table of its own: priced as it runs. A table of its own
            # named as a Python variable here is a replacement scan's InvalidInputException)
            constant = False
            continue
        names = [d[0] for d in con.description]
        change = dict(zip(names, row))
        if change.pop("default_windows"):
            changes.append(change)
    return changes, constant


class _Scales:
    """The events' scales of each change (critical_path.change_scales of the default windows' event lists,
    `lists`), by the change's parameters of critical_path_scales (changes that differ in no_launch_overhead only
    share them), added as the rules' changes become known (add): per row of the lists, its events' scales, and
    whether the change makes a range an op there (reroled). (critical_path_scales' rows, a CASE per event in SQL
    read back as lists, took 5 of findings' 42 CPU-s at 24x.)"""

    def __init__(self, con, lists):
        self.con, self.lists = con, lists
        self.events = critical_path.ListedEvents(lists.column("events"))  # (each column read once for all)
        self.changes: dict[tuple, tuple[list, np.ndarray]] = {}

    def add(self, changes: list[dict]) -> None:
        for change in changes:
            values = _scaling(change)
            if _changes_nothing(change) or values in self.changes:
                continue
            *arguments, straggler_to_median = values
            self.changes[values] = critical_path.change_scales(
                self.events, *arguments, *(self._stragglers() if straggler_to_median == 1 else ()))

    def _stragglers(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row of the lists, the scale of the straggler's work (NaN: not the straggler's window) and whether
        it is on the host (critical_path_scales' straggler_scale and straggler_on_host: of those columns only,
        DuckDB computes no scales)."""
        found = {tuple(row[:4]): row[4:] for row in self.con.execute(
            "SELECT run_id, rank, window_name, instance, straggler_scale, straggler_on_host "
            "FROM critical_path_scales(straggler_to_median := 1)").fetchall()}
        its = [found[key] for key in zip(*(self.lists.column(c).to_pylist()
                                           for c in ("run_id", "rank", "window_name", "instance")))]
        return (np.array([np.nan if scale is None else scale for scale, _ in its], np.float64),
                np.array([bool(on_host) for _, on_host in its], bool))

    def of(self, change: dict) -> tuple[list, np.ndarray]:
        """The change's scales (per row of the lists) and reroled."""
        return self.changes[_scaling(change)]


@contextlib.contextmanager
def _in_thread(function, *args):
    """function(*args) in a thread while the block runs (its Python on one core, the block's DuckDB SQL on the
    other); the block gets a function that waits for its result (raising its error). Joined when the block
    ends, however it ends."""
    import threading

    outcome: dict = {}

    def target():
        try:
            outcome["value"] = function(*args)
        except BaseException as e:  # (raised in the caller's thread, by result)
            outcome["error"] = e

    thread = threading.Thread(target=target, name="tracesql-findings", daemon=True)
    thread.start()

    def result():
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    try:
        yield result
    finally:
        thread.join()


def _lengths_input(lists, changes: list[dict], scales: _Scales) -> tuple:
    """The changes of `changes` to walk, each key once (not one that changes nothing, nor one that makes a range an
    op in some step: its graph is not the unchanged one, what_if walks it), for critical_path.replay_lengths: their
    keys, the default windows' event lists (`lists`, findings_event_lists' rows), each window's scales of each one,
    and each one's gaps scale."""
    walked = list({c["key"]: c for c in changes
                   if not _changes_nothing(c) and not scales.of(c)[1].any()}.values())
    if not walked:
        return [], lists, [], []
    of_change = [scales.of(change)[0] for change in walked]
    return ([c["key"] for c in walked], lists, [list(its) for its in zip(*of_change)],
            [1.0 if c["no_launch_overhead"] != 1 else 0.0 for c in walked])


def _replays(keys: list[str], lists, scales: list, gaps: list[float], arrays: list | None = None):
    """critical_path.replay_lengths of _lengths_input's (walked by the threads that call _walk; arrays: the lists'
    events as walk_ahead read them, None: read again), with each change's key: (keys, its Shared) or None."""
    return (keys, critical_path.replay_lengths(lists, scales, gaps, arrays)) if keys else None


def _walk(replays) -> None:
    """Work on _replays' walks (critical_path.Shared.work) until none is left."""
    if replays is not None:
        replays[1].work()


def _lengths(replays):
    """_replays' (keys, lengths), once the threads that walk them are done; or None."""
    return None if replays is None else (replays[0], replays[1].result())


@contextlib.contextmanager
def _priced_once(con, changes: list[dict], lengths: list):
    """Each change's predicted time of every default window (each step), for what_if to read while the rules run
    (what_if_priced, what_if_predicted): those walked (`lengths`: _lengths' of each batch of changes), and
    those of the changes that change nothing (a rule that found nothing to price): the unchanged replay's time
    (what_if_unchanged's, which _unchanged_once keeps)."""
    import pyarrow as pa

    idle = list({c["key"] for c in changes if _changes_nothing(c)})
    batches = [batch for batch in lengths if batch is not None]
    keys = [key for batch_keys, _ in batches for key in batch_keys]
    try:  # (what an error leaves half made is dropped too)
        con.register("findings_lengths", pa.concat_tables(
            [table.append_column("key", pa.array(batch_keys, pa.string()).take(table.column("change")))
             for batch_keys, table in batches]
            or [critical_path.PREDICTED_SCHEMA.empty_table().append_column("key", pa.array([], pa.string()))]))
        con.execute(f"""CREATE OR REPLACE TEMP TABLE findings_predicted AS
            SELECT key, run_id, rank, window_name, instance, predicted_ns FROM findings_lengths
            UNION ALL
            SELECT k.key, u.run_id, u.rank, u.window_name, u.instance, u.replayed_ns
            FROM what_if_unchanged() u, unnest({_literal(idle)}::VARCHAR[]) k(key)
            WHERE u.replayed_ns IS NOT NULL""")
        con.unregister("findings_lengths")
        known = ", ".join(map(_literal, keys + idle)) or "NULL"
        parameters = "faster, faster_pct, hide_communication, no_launch_overhead, remove_syncs, straggler_to_median"
        con.execute(f"CREATE OR REPLACE TEMP MACRO what_if_priced({parameters}) AS "
                    f"what_if_change_key({parameters}) IN ({known})")
        con.execute(f"CREATE OR REPLACE TEMP MACRO what_if_predicted({parameters}) AS TABLE "
                    f"SELECT run_id, rank, window_name, instance, predicted_ns FROM findings_predicted "
                    f"WHERE key = what_if_change_key({parameters})")
        yield
    finally:
        con.execute("DROP MACRO IF EXISTS temp.what_if_priced")
        con.execute("DROP MACRO TABLE IF EXISTS temp.what_if_predicted")
        con.execute("DROP TABLE IF EXISTS temp.findings_predicted")


@contextlib.contextmanager
def _known_what_if(con, stand_in: str | None = None):
    """While the block runs (a rule's last statement, in _priced_once), the what_if macro replaced by `stand_in`
    (_what_if_stand_in's, made once for the rules' last statements; by default made here)."""
    con.execute(stand_in or _what_if_stand_in(con))
    try:
        yield
    finally:
        con.execute("DROP MACRO TABLE IF EXISTS temp.what_if")


def _what_if_stand_in(con) -> str:
    """The statement that makes the macro standing in for what_if on `con`: it reads a priced change's rows of the
    default windows from what_if_known, and passes any other call on to what_if itself (by its full name, its
    arguments written out as typed literals): query() binds only the statement it is given, so what_if is not
    bound where it is not asked (0.06-0.1 s a rule at 24x). Its arguments must be constants (_changes says
    whether a rule's are)."""
    definition = dict(functions.definitions())["what_if"]
    signature = re.search(r"\bwhat_if\((.*?)\)\s+AS\s+TABLE", definition, re.DOTALL).group(1)
    names = [parameter.split(":=")[0].strip() for parameter in signature.split(",")]
    # (where the session's what_if is: its own schema, else the compiled macros' database; functions.install)
    found = con.execute("SELECT database_name, schema_name FROM duckdb_functions() WHERE function_name = 'what_if' "
                        "AND database_name <> 'temp' ORDER BY database_name <> current_database()").fetchall()[0]
    where = ".".join('"' + name.replace('"', '""') + '"' for name in found)
    change = ", ".join(WHAT_IF_CHANGE)
    known = _call_sql("what_if_known", [(None, name) for name in WHAT_IF_CHANGE + ("rank_filter",)])
    full = _call_sql(f"{where}.what_if", [(name, name) for name in names])
    return (f"CREATE OR REPLACE TEMP MACRO what_if({signature}) AS TABLE FROM query(CASE "
            f"WHEN annotation IS NULL AND occurrence IS NULL AND replay = 1 AND predict = 1 "
            f"AND what_if_priced({change}) THEN {known} ELSE {full} END)")


def _call_sql(macro: str, arguments: list[tuple[str | None, str]]) -> str:
    """A SQL expression of the text `FROM macro(...)` with these arguments ((its parameter's name or None,
    the expression whose value it passes)), each value written as a literal of its type (NULL as NULL)."""
    def literal(value: str) -> str:  # CAST('its text, quotes doubled' AS its type)
        return (f"CASE WHEN {value} IS NULL THEN 'NULL' ELSE printf('CAST(''%s'' AS %s)', "
                f"replace(CAST({value} AS VARCHAR), '''', ''''''), typeof({value})) END")
    placeholders = ", ".join("%s" if name is None else f"{name} := %s" for name, _ in arguments)
    return f"printf({quote(f'FROM {macro}({placeholders})')}, {', '.join(literal(value) for _, value in arguments)})"


#: The what_if macro's parameters of a change (what_if_priced's, what_if_known's)
WHAT_IF_CHANGE = ("faster", "faster_pct", "hide_communication", "no_launch_overhead", "remove_syncs",
                  "straggler_to_median")


def _changes_nothing(change: dict) -> bool:
    """Whether the change changes no event and no gap: its predicted time is the unchanged replay's."""
    return change["faster"] is None and not any(change[name] for name in (
        "hide_communication", "no_launch_overhead", "remove_syncs", "straggler_to_median"))


def _scaling(change: dict) -> tuple:
    """The change's parameters of critical_path_scales."""
    return tuple(change[name] for name in SCALE_PARAMETERS)


#: critical_path_scales' parameters of a change (what_if_change's columns)
SCALE_PARAMETERS = ("faster", "faster_pct", "hide_communication", "remove_syncs", "straggler_to_median")


def _literal(value) -> str:
    """A SQL literal of a change's value (a DOUBLE cast as one: a decimal literal would be a DECIMAL)."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, float):
        return f"CAST('{value!r}' AS DOUBLE)"
    if isinstance(value, list):
        return "[" + ", ".join(map(_literal, value)) + "]"
    return str(value)


def run(con, target: str, params: dict | None = None):
    """Every rule's rows on `con`, largest saving first, as a DuckDB relation on `con`. `target`: the run as the
    user named it, written into each row's `query` command; `params` (name -> value) go to the rules that take
    them (e.g. min_saving_pct, every rule's threshold).

    The rules' statements before their last (what each prices) run first, and the scales of their changes are
    computed (_Scales), then their changes are priced together (_priced_once), then the rules' last statements
    run. The walks (Python) run in a thread while DuckDB runs SQL (_in_thread), in two rounds: the rules whose
    first statements walk no path run those first, and the rules that price nothing (call no what_if) run whole,
    while each step's unchanged replay and HTA path are walked (critical_path.walk_ahead); the changes of the
    first are walked (critical_path.replay_lengths) while the unchanged replays' rows (_unchanged_once), the
    paths (_paths_once) and the other rules' first statements are computed; the other rules' changes while the
    first rules' last statements run."""
    import pyarrow as pa

    params = check(dict(params or {}))
    rules = catalogue()
    given = {rule.name: {"run": target} | {k: v for k, v in params.items() if k in rule.params} for rule in rules}
    walking = [rule for rule in rules if _walks(" ".join(s.query for s in con.extract_statements(rule.sql)[:-1]))]
    first_rules = [rule for rule in rules if rule not in walking]
    unpriced = [rule for rule in first_rules if "what_if" not in functions.words(rule.sql)]
    first_rules = [rule for rule in first_rules if rule not in unpriced]
    changes: list[dict] = []
    constant: set[str] = set()  # the rules whose what_if calls' arguments are constants (_changes)
    stand_in = _what_if_stand_in(con)

    def prepare(some: list) -> list[dict]:
        found = []
        for rule in some:
            its, is_constant = _changes(con, queries.prepare(con, rule, given[rule.name]))
            found += its
            if is_constant:
                constant.add(rule.name)
        scales.add(found)
        changes.extend(found)
        return found

    def last(some: list, priced: bool = False) -> list:
        """The rules' last statements' rows; priced (in _priced_once): what_if's known rows read (_known_what_if)."""
        out = []
        for rule in some:
            with _known_what_if(con, stand_in) if priced and rule.name in constant else contextlib.nullcontext():
                out.append(queries.run(con, rule, given[rule.name], prepared=True).to_arrow_table())
        return out

    # (the walks' loops compiled, loaded while DuckDB computes the event lists, unless the CLI loaded them while
    # it opened the run: longest_path)
    with _in_thread(longest_path.load), _event_lists_once(con) as lists, _cores(con) as cores:
        scales = _Scales(con, lists)
        arrays: list = []  # (the lists' events as the walks ahead read them, read again by the replays)
        walks = critical_path.walk_ahead(lists, arrays)
        with _in_thread(walks.work) as walked:
            first = prepare(first_rules)
            first_input = _lengths_input(lists, first, scales)
            prepare(unpriced)
            found = last(unpriced)
            walks.work()  # (what is left of them, on this thread too: its SQL is done)
            walked()
        first_replays = _replays(*first_input, arrays)
        with _in_thread(_walk, first_replays) as first_walked:
            paths, ahead = walks.result()
            with critical_path.walked_ahead(ahead), _paths_once(con, paths), _unchanged_once(con, lists):
                priced = {c["key"] for c in first}
                cores(walking=False)  # (the first changes' walks end before these rules' first statements do)
                later = [c for c in prepare(walking) if c["key"] not in priced]
                later_replays = _replays(*_lengths_input(lists, later, scales), arrays)
                del lists, first_input, paths, scales, arrays  # (what the walks read, no longer needed)
                _walk(first_replays)  # (what is left of them, on this thread too: its SQL is done)
                first_walked()
                lengths = [_lengths(first_replays)]
                with _in_thread(_walk, later_replays) as later_walked:
                    cores(walking=later_replays is not None)
                    with _priced_once(con, first, lengths):
                        found += last(first_rules, priced=True)
                    _walk(later_replays)
                    later_walked()
                    lengths.append(_lengths(later_replays))
                cores(walking=False)
                with _priced_once(con, changes, lengths):
                    found += last(walking, priced=True)
    order = [("saving_ns", "descending")] + [(c, "ascending") for c in ("run_id", "rank", "step", "finding")]
    return con.from_arrow(pa.concat_tables(found).sort_by(order))


@contextlib.contextmanager
def _cores(con):
    """DuckDB on one thread fewer (at least one) while a thread of Python walks beside its SQL: from the block's
    start (the event lists computed: the walks ahead start), until the block says otherwise by the function it
    gets (walking: whether a thread walks beside the SQL to come); the threads as they were when it ends. (On two
    cores, DuckDB's two threads and the walks' one took 8 % more time and 7 % more CPU at 24x than one of each;
    DuckDB's one thread left a core idle for ~0.5 s at 24x where its statements outlasted the walks.)"""
    (threads,) = con.execute("SELECT current_setting('threads')").fetchone()
    threads = int(threads)
    now = [threads]

    def cores(walking: bool) -> None:
        wanted = max(1, threads - 1) if walking else threads
        if wanted != now[0]:
            con.execute(f"SET threads = {wanted}")
            now[0] = wanted

    try:
        cores(walking=True)
        yield cores
    finally:
        con.execute(f"SET threads = {threads}")


def _walks(sql: str) -> bool:
    """Whether `sql` walks a critical path (functions.walks)."""
    return functions.walks(functions.words(sql))
