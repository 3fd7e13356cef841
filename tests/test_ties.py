"""Every pick and every ordered window has a unique tie-break: equal keys give the same, documented answer
whatever order the rows arrive in and however many threads DuckDB uses.

Each test builds a tiny session straight from the schema (no trace file), inserts rows whose ordering keys tie,
in both orders, and runs the query several times on several threads."""

from __future__ import annotations

import duckdb
import pytest

from tracesql import functions, queries, schema


def session(threads: int = 4) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(config={"threads": threads})
    for name, table in schema.TABLES.items():
        con.execute(f"CREATE TABLE {name} ({', '.join(f'{c.name} {c.type}' for c in table.columns)})")
    return con


def insert(con, table: str, rows: list[dict]) -> None:
    for row in rows:
        cols = ", ".join(row)
        con.execute(f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' for _ in row)})", list(row.values()))


def answers(build, sql_or_query: str, params: dict | None = None, repeat: int = 5) -> set:
    """The distinct results of running the query on sessions built with the rows in both orders, several times."""
    seen = set()
    is_sql = sql_or_query.lstrip().upper().startswith("SELECT")
    # only the functions it uses, as `tracesql query` installs them: all of them take longer than the runs
    names = functions.words(sql_or_query) if is_sql else queries.names_used(queries.find(sql_or_query))
    for reverse in (False, True):
        for threads in (1, 4):
            con = session(threads)
            build(con, reverse)
            functions.install(con, names=names)
            for _ in range(repeat):
                if is_sql:
                    rows = con.execute(sql_or_query).fetchall()
                else:
                    rel = queries.run(con, queries.find(sql_or_query), params)
                    rows = rel.fetchall()
                seen.add(tuple(tuple(_hashable(v) for v in r) for r in rows))
            con.close()
    return seen


def _hashable(value):
    return tuple(_hashable(v) for v in value) if isinstance(value, list) else value


def kernel(rank, slice_id, stream, ts, dur, name="gemm", step=None, device=0):
    return {"run_id": "r", "rank": rank, "slice_id": slice_id, "kind": "kernel", "name": name, "ts": ts, "dur": dur,
            "device_id": device, "stream": stream, "step": step}


def ordered(rows, reverse):
    return list(reversed(rows)) if reverse else rows


def test_idle_gap_prev_is_the_highest_id_of_the_events_that_end_last():
    def build(con, reverse):
        insert(con, "slices", ordered([kernel(0, 5, 0, 0, 10, "a"), kernel(0, 3, 0, 2, 8, "b"),
                                       kernel(0, 9, 0, 20, 10, "c")], reverse))
    got = answers(build, "SELECT prev_slice_id, prev_name, next_slice_id FROM idle_gaps()")
    assert got == {((5, "a", 9),)}


def test_bubbles_largest_orders_equal_gaps_by_device_and_stream():
    def build(con, reverse):
        rows = [kernel(0, i * 2 + s, s, t, 10) for s in (0, 1) for i, t in enumerate((0, 30))]
        insert(con, "slices", ordered(rows, reverse))
    got = answers(build, "bubbles_largest", {"scope": "stream"})
    assert len(got) == 1
    (rows,) = got
    assert [(r[2], r[4], r[6], r[7]) for r in rows] == [(1, 0, 10, 20), (2, 1, 10, 20)]  # rank_in_rank, stream


def test_slowest_rank_of_a_tied_step_is_the_lowest_rank():
    def build(con, reverse):
        insert(con, "steps", ordered([{"run_id": "r", "rank": rk, "step": 1, "name": "ProfilerStep#1", "ts": 0,
                                       "dur": 100, "device_ts": 0, "device_dur": 50, "kernel_count": 1}
                                      for rk in (0, 1, 2)], reverse))
    got = answers(build, "steps")
    assert {tuple(r[12] for r in rows) for rows in got} == {(0, 0, 0)}


def collective(rank, cid, start, pg="0", seq=0):
    return {"run_id": "r", "rank": rank, "collective_id": cid, "collective": "all_reduce", "source_name": "allreduce",
            "pg_name": pg, "seq": seq, "dtype": "Float", "size_bytes": 1024, "cpu_ts": start, "cpu_dur": 10,
            "device_ts": start, "device_dur": 10, "group_size": 2}


def test_collective_last_rank_ties_go_to_the_higher_rank_then_the_later_call():
    def build(con, reverse):
        insert(con, "ranks", [{"run_id": "r", "rank": 0, "world_size": 2}, {"run_id": "r", "rank": 1,
                                                                           "world_size": 2}])
        # seq 0: both ranks start together; seq 1: rank 1 recorded the call twice (ids 7 and 8), both late
        insert(con, "collectives", ordered([collective(0, 1, 100), collective(1, 2, 100),
                                            collective(0, 3, 200, seq=1), collective(1, 7, 250, seq=1),
                                            collective(1, 8, 250, seq=1)], reverse))
    got = answers(build, "collectives")
    assert len(got) == 1
    (rows,) = got
    # the columns before the three link columns (link_bytes_per_s, predicted_ns, link_pct) and warning
    assert [r[-8] for r in rows] == [1, 1]  # last_rank: the higher rank when starts tie
    assert rows[1][-6] == (0, 1, 1) and rows[1][-5] == (0, 50, 50)  # ranks, start_skew_ns, ordered by (rank, id)
    stragglers = answers(build, "collective_stragglers")
    assert len(stragglers) == 1


def test_diff_picks_runs_with_equal_starts_by_name():
    def build(con, reverse):
        insert(con, "ranks", ordered([{"run_id": "b", "rank": 0, "trace_start_ns": 0},
                                      {"run_id": "a", "rank": 0, "trace_start_ns": 0}], reverse))
        insert(con, "ops", [{"run_id": run, "rank": 0, "op_id": 1, "name": "aten::mm", "ts": 0, "dur": d,
                             "self_dur": d, "device_self_ns": 0} for run, d in (("a", 10), ("b", 20))])
    got = answers(build, "diff")
    assert {rows[0][:2] for rows in got} == {("a", "b")}


def test_idle_gap_steps_and_windows_do_not_depend_on_row_order():
    def build(con, reverse):
        # two steps whose first events start together: the lower step number comes first, with a 0-length window
        insert(con, "slices", ordered([kernel(0, 1, 0, 0, 10, step=2), kernel(0, 2, 1, 0, 5, step=1),
                                       kernel(0, 3, 0, 20, 10, step=3)], reverse))
    got = answers(build, "SELECT step, ts, te FROM step_windows() ORDER BY ts, step")
    assert got == {((1, 0, 0), (2, 0, 20), (3, 20, 30))}
    gaps = answers(build, "SELECT ts, dur, step FROM idle_gaps(scope := 'device')")
    assert gaps == {((10, 10, 2),)}


@pytest.mark.parametrize("query", ["kernel_breakdown", "timeline", "bubbles", "temporal_breakdown", "overlap"])
def test_timeline_queries_are_deterministic_on_identical_kernels(query):
    def build(con, reverse):
        rows = [kernel(0, i, i % 3, 10 * (i // 3), 10 if i % 2 else 5) for i in range(12)]
        rows += [{**kernel(0, 100 + i, 5, 7 * i, 4), "name": "ncclDevKernel_AllReduce"} for i in range(4)]
        insert(con, "slices", ordered(rows, reverse))
    assert len(answers(build, query, repeat=3)) == 1
