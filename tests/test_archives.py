"""Archives of traces (zip, tar, tar.gz) ingested directly, and malicious ones refused without writing anything
outside tracesql's own scratch folder."""

from __future__ import annotations

import io
import json
import stat
import tarfile
import zipfile

import pytest
from click.testing import CliRunner

import tracesql
from conftest import DATASETS, write_trace
from tracesql import ingestion, schema, store
from tracesql.cli import main

TRACE_FILTER = DATASETS / "hta_trace_filter"
GLOO = DATASETS / "torch_gloo_2rank"


def _zip(path, members: dict[str, bytes]):
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _tar(path, members: list[tarfile.TarInfo | tuple[str, bytes]]):
    with tarfile.open(path, "w:gz" if path.name.endswith("gz") else "w") as t:
        for m in members:
            if isinstance(m, tarfile.TarInfo):
                t.addfile(m)
            else:
                info = tarfile.TarInfo(m[0])
                info.size = len(m[1])
                t.addfile(info, io.BytesIO(m[1]))
    return path


def _tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def _same_slices(run_a, run_b):
    con = tracesql.connect(run_a)
    return con.execute(f"SELECT count(*) FROM (SELECT * EXCLUDE (run_id) FROM slices EXCEPT ALL "
                       f"SELECT * EXCLUDE (run_id) FROM read_parquet('{run_b}/slices/*.parquet'))").fetchone()[0] == 0


#: The per-rank tables: every one but those written once per run over all its ranks (schema.RUN_TABLES), and
#: `warnings`, whose run-wide checks (clocks far apart) depend on the other ranks of the run.
RANK_TABLES = sorted(set(schema.TABLES) - set(schema.RUN_TABLES) - {"warnings"})


def _rows(con, table: str, ranks: list[int]) -> list[tuple]:
    """The rows of `table` for `ranks`, less what differs between runs (the run's id, where the trace was found)."""
    differ = "source_path, source_bytes, run_id" if table == "ranks" else "run_id"
    rows = con.execute(f"SELECT * EXCLUDE ({differ}) FROM {table} WHERE list_contains($ranks, rank)",
                       {"ranks": ranks}).fetchall()
    return sorted(rows, key=repr)


MESH = DATASETS / "torch_mesh_dp2_tp2"


def _mesh_artifact(tmp_path):
    """A zip of the ranks of the dp2 x tp2 mesh (collectives, steps, process groups) with a member between them
    (rank 7) that has a memory event, a communication kernel and no steps; and the mesh's trace files."""
    host = {"pid": 1, "tid": 1}
    events = [  # an allocation, then an all-gather kernel and its launch
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 5, "s": "t", **host,
         "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512, "Total Allocated": 512, "Addr": 64}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9, "dur": 3, **host,
         "args": {"correlation": 3}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "pid": 0, "tid": 9, "ts": 14,
         "dur": 8, "args": {"correlation": 3, "device": 0, "stream": 9}},
    ]
    other = write_trace(tmp_path / "other.json", events, distributedInfo={"rank": 7, "world_size": 8}).read_bytes()
    traces = sorted(MESH.glob("*.json.gz"))
    return _zip(tmp_path / "artifact.zip", {"README.txt": b"CI job 1234", f"traces/{traces[0].name}":
                                            traces[0].read_bytes(), "traces/rank-7.json": other,
                                            **{f"traces/{f.name}": f.read_bytes() for f in traces[1:]}}), traces


def test_zip_artifact_ingests_like_the_folder(tmp_path, ingested):
    """The members are read one after another by one process (-j 1), on the DuckDB connections it keeps between
    traces (db.for_trace), skipping the queries a member has no input for: nothing of one member's work may
    reach the next. The ranks of the dp2 x tp2 mesh (collectives, steps, process groups), with a member read
    between them that has a memory event, a communication kernel and no steps, give the rows of the folder."""
    artifact, traces = _mesh_artifact(tmp_path)
    result = CliRunner().invoke(main, ["ingest", str(artifact), "-o", str(tmp_path / "run"), "-j", "1"])
    assert result.exit_code == 0, result.output
    run, folder = tracesql.connect(tmp_path / "run"), tracesql.connect(ingested(MESH))
    assert run.execute("SELECT rank, source_path FROM ranks ORDER BY rank").fetchall() == [
        *[(r, f"artifact.zip/traces/rank-{r}.pt.trace.json.gz") for r in range(4)],
        (7, "artifact.zip/traces/rank-7.json")]
    for table in RANK_TABLES:
        assert _rows(run, table, [0, 1, 2, 3]) == _rows(folder, table, [0, 1, 2, 3]), table
    # the member between them: its own rows only (the mesh's steps and ops did not reach it, nor its rows them)
    assert {t: run.execute(f"SELECT count(*) FROM {t} WHERE rank = 7").fetchall()[0][0]
            for t in ("slices", "ops", "steps", "collectives", "memory")} == {
        "slices": 3, "ops": 0, "steps": 0, "collectives": 1, "memory": 1}
    assert run.execute("SELECT collective, bytes FROM collectives JOIN memory USING (rank)").fetchall() == [
        ("all_gather", 512)]
    run.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.lock", "artifact.zip", "other.json", "run"]

    again = tracesql.ingest([artifact], tmp_path / "run")
    assert not again.changed and len(again.reused) == 5
    _zip(artifact, {f"traces/{f.name}": f.read_bytes() for f in traces[:1]})
    changed = tracesql.ingest([artifact], tmp_path / "run")
    assert changed.removed == [*(f"artifact.zip/traces/{f.name}" for f in traces[1:]),
                               "artifact.zip/traces/rank-7.json"]


def _all_rows(run) -> dict[str, list]:
    con = tracesql.connect(run)
    rows = {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in schema.TABLES}
    con.close()
    return rows


def test_small_members_read_in_batches_give_the_tables_read_one_by_one(tmp_path, monkeypatch):
    """An archive's small members are read in batches (ingestion.read_group: one part per table per batch, listed
    under each member) by two processes; every table equals the one-by-one ingest's, row for row. The shared
    parts verify, are carried over once when the archive is unchanged, and replaced when it changes."""
    artifact, traces = _mesh_artifact(tmp_path)
    monkeypatch.setattr(ingestion, "BATCH_MEMBER_BYTES", -1)  # no member is small: each read alone
    tracesql.ingest([artifact], tmp_path / "alone", run_id="job", jobs=1)
    monkeypatch.undo()
    tracesql.ingest([artifact], tmp_path / "batched", run_id="job", jobs=2)
    alone_rows, batched_rows = _all_rows(tmp_path / "alone"), _all_rows(tmp_path / "batched")
    assert {t: len(r) for t, r in batched_rows.items() if r} == {
        "runs": 1, "ranks": 5, "devices": 1, "process_groups": 12, "slices": 239, "ops": 184, "op_costs": 184,
        "collectives": 17, "memory": 1, "steps": 8, "warnings": 1}
    assert batched_rows == alone_rows
    manifest = json.loads((tmp_path / "batched" / "tracesql.json").read_text())
    parts = [entry["parts"] for entry in manifest["sources"].values()]
    assert sorted(map(len, parts)) == [1] * 5 and len({p[0] for p in parts}) == 2  # five members, two batches
    assert all(p[0].startswith("batch-") for p in parts)
    assert sorted(f for f in manifest["files"] if f.startswith("slices/")) == sorted(
        f"slices/{p}" for p in {p[0] for p in parts})
    assert store.verify(tmp_path / "batched")["files"] == len(manifest["files"])

    again = tracesql.ingest([artifact], tmp_path / "batched", run_id="job")
    assert not again.changed and len(again.reused) == 5
    _zip(artifact, {f"traces/{f.name}": f.read_bytes() for f in traces[:2]})
    changed = tracesql.ingest([artifact], tmp_path / "batched", run_id="job", jobs=1)
    assert changed.ingested == [f"artifact.zip/traces/{f.name}" for f in traces[:2]] and len(changed.removed) == 3
    assert tracesql.connect(tmp_path / "batched").execute("SELECT rank FROM ranks ORDER BY rank").fetchall() == [
        (0,), (1,)]
    store.verify(tmp_path / "batched")


def test_members_normalized_together_keep_their_own_steps_and_notes(tmp_path, monkeypatch):
    """A batch's members are normalized together (normalize_batch): each keeps the steps of its own ranges by the
    user's --step-pattern (renumbered from 0 per rank, as alone), and only the member it matched nothing in says
    so; every table and warning equals the one-by-one ingest's."""
    artifact, _ = _mesh_artifact(tmp_path)
    pattern = r"^ProfilerStep#\d+$"  # (no `step` group: each rank's steps numbered 0, 1, ... in time order)
    monkeypatch.setattr(ingestion, "BATCH_MEMBER_BYTES", -1)
    alone = tracesql.ingest([artifact], tmp_path / "alone", run_id="job", jobs=1, step_pattern=pattern)
    monkeypatch.undo()
    batched = tracesql.ingest([artifact], tmp_path / "batched", run_id="job", jobs=1, step_pattern=pattern)
    assert sorted(batched.warnings) == sorted(alone.warnings) == [
        f"{artifact}/traces/rank-7.json: --step-pattern {pattern!r} matched no range; the trace has no steps"]
    alone_rows, batched_rows = _all_rows(tmp_path / "alone"), _all_rows(tmp_path / "batched")
    assert batched_rows == alone_rows
    steps = tracesql.connect(tmp_path / "batched").execute("SELECT rank, step, name, rule FROM steps ORDER BY ALL")
    assert steps.fetchall() == [(r, i, f"ProfilerStep#{i + 2}", "user") for r in range(4) for i in (0, 1)]


def test_a_batch_that_fails_together_is_normalized_member_by_member(tmp_path, monkeypatch):
    """When normalizing a batch together fails (here: a DuckDB error), each member is read and normalized alone
    (read again: the failed pass may have added notes to what it read), and the tables are the one-by-one ingest's."""
    import duckdb

    from tracesql import normalize

    artifact, _ = _mesh_artifact(tmp_path)
    monkeypatch.setattr(ingestion, "BATCH_MEMBER_BYTES", -1)
    alone = tracesql.ingest([artifact], tmp_path / "alone", run_id="job", jobs=1, step_pattern="^nothing$")
    monkeypatch.undo()
    together = normalize.normalize_batch

    def failing(traces, *args):
        if len(traces) > 1:
            together(traces, *args)  # (the whole pass, then the failure: what it left must not count)
            raise duckdb.OutOfMemoryException("failed to pin block")
        return together(traces, *args)

    monkeypatch.setattr(normalize, "normalize_batch", failing)
    result = tracesql.ingest([artifact], tmp_path / "batched", run_id="job", jobs=1, step_pattern="^nothing$")
    assert _all_rows(tmp_path / "batched") == _all_rows(tmp_path / "alone")
    assert sorted(result.warnings) == sorted(alone.warnings) and len(alone.warnings) == 5  # a note each, not two


def test_a_damaged_member_of_a_batch_is_named(tmp_path):
    """One bad member among small ones read in one batch (-j 1): the same one-line error as when read alone,
    and nothing written."""
    artifact = _zip(tmp_path / "artifact.zip", {"ranks/rank-0.json.gz": TRACE, "ranks/rank-1.json.gz": TRACE[:3000],
                                                "ranks/rank-2.json.gz": TRACE})
    result = CliRunner().invoke(main, ["ingest", str(artifact), "-o", str(tmp_path / "run"), "-j", "1"])
    assert result.exit_code == 1
    assert result.output == f"Error: {artifact}/ranks/rank-1.json.gz: truncated gzip\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.lock", "artifact.zip"]


@pytest.mark.parametrize("suffix", [".tar", pytest.param(".tar.gz", marks=pytest.mark.slow),
                                    pytest.param(".tgz", marks=pytest.mark.slow)])  # one reader: .tar in the fast suite
def test_tar_artifacts(tmp_path, suffix, ingested):
    artifact = _tar(tmp_path / f"job{suffix}", [
        tarfile.TarInfo("logs"),  # a folder entry
        *[(f"logs/{f.name}", f.read_bytes()) for f in sorted(GLOO.glob("*.json.gz"))]])
    tracesql.ingest([artifact], tmp_path / "run")
    con = tracesql.connect(tmp_path / "run")
    assert [r[0] for r in con.execute("SELECT source_path FROM ranks ORDER BY rank").fetchall()] == [
        f"job{suffix}/logs/rank-0.pt.trace.json.gz", f"job{suffix}/logs/rank-1.pt.trace.json.gz"]
    assert _same_slices(tmp_path / "run", ingested(GLOO))


def test_member_names_never_become_paths(tmp_path):
    """A member's name is kept as the source's path in the run, never used to name a file."""
    odd = "odd dir/..hidden/rank-0;touch x$(id).json.gz"  # not '..' itself: allowed, but no path of its own
    artifact = _zip(tmp_path / "a.zip", {odd: (GLOO / "rank-0.pt.trace.json.gz").read_bytes()})
    tracesql.ingest([artifact], tmp_path / "run")
    assert tracesql.connect(tmp_path / "run").execute("SELECT rank, source_path FROM ranks").fetchall() == \
        [(0, f"a.zip/{odd}")]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.lock", "a.zip", "run"]


def _link(name, target, kind):
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def _device(name):
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    return info


def _zip_symlink(path):
    with zipfile.ZipFile(path, "w") as z:
        info = zipfile.ZipInfo("rank-0.json")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(info, "/etc/passwd")
    return path


TRACE = (GLOO / "rank-0.pt.trace.json.gz").read_bytes()
MALICIOUS = {
    "dot-dot (zip)": (lambda d: _zip(d / "a.zip", {"../evil.json": TRACE}),
                      "unsafe member '../evil.json': '..' leads outside"),
    "nested dot-dot (tar)": (lambda d: _tar(d / "a.tar", [("x/../../evil.json", TRACE)]),
                             "unsafe member 'x/../../evil.json': '..' leads outside the archive"),
    "absolute (tar)": (lambda d: _tar(d / "a.tar", [(str(d / "evil.json"), TRACE)]), "absolute path"),
    "absolute (zip)": (lambda d: _zip(d / "a.zip", {"/tmp/evil.json": TRACE}), "absolute path"),
    "windows drive (zip)": (lambda d: _zip(d / "a.zip", {"C:/evil.json": TRACE}), "absolute path"),
    "symlink (tar)": (lambda d: _tar(d / "a.tar.gz", [_link("rank-0.json", "/etc/passwd", tarfile.SYMTYPE)]),
                      "unsafe member 'rank-0.json': a symbolic link (to '/etc/passwd')"),
    "hardlink (tar)": (lambda d: _tar(d / "a.tar", [_link("rank-0.json", "/etc/passwd", tarfile.LNKTYPE)]),
                       "a hard link"),
    "symlink (zip)": (lambda d: _zip_symlink(d / "a.zip"), "unsafe member 'rank-0.json': a symbolic link"),
    "device (tar)": (lambda d: _tar(d / "a.tar", [_device("rank-0.json")]), "a device, fifo or other special file"),
    "duplicate name (tar)": (lambda d: _tar(d / "a.tar", [("rank-0.json.gz", TRACE), ("rank-0.json.gz", b"{}")]),
                             "member 'rank-0.json.gz' appears twice"),
    "bomb (zip)": (lambda d: _zip(d / "a.zip", {"rank-0.json": b" " * 3_000_000}),
                   "unpacks to 3,000,000 bytes, over the cap of 1,000,000 (TRACESQL_MAX_ARCHIVE_BYTES)"),
    "not an archive": (lambda d: (d / "a.zip").write_bytes(TRACE) and d / "a.zip", "damaged archive"),
    "truncated tar.gz": (lambda d: (d / "a.tgz").write_bytes(
        _tar(d / "full.tar.gz", [("rank-0.json.gz", TRACE)]).read_bytes()[:2000]) and d / "a.tgz", "damaged archive"),
    "no traces": (lambda d: _zip(d / "a.zip", {"notes.txt": b"hi"}), "no trace files in the archive"),
}


@pytest.mark.parametrize("case", MALICIOUS)
def test_malicious_archives_are_refused_without_writing_anything(tmp_path, monkeypatch, case):
    monkeypatch.setenv("TRACESQL_MAX_ARCHIVE_BYTES", "1000000")
    work = tmp_path / "work"
    work.mkdir()
    make, problem = MALICIOUS[case]
    archive = make(work)
    (work / "full.tar.gz").unlink(missing_ok=True)
    before = _tree(tmp_path)
    result = CliRunner().invoke(main, ["ingest", str(archive), "-o", str(work / "runs" / "run")])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {archive}: ") and problem in result.output
    assert result.output.count("\n") == 1
    assert _tree(tmp_path) in (before, sorted(before + ["work/runs", "work/runs/.run.lock"]))
    assert not (tmp_path / "evil.json").exists()


def test_a_damaged_member_is_named_as_archive_slash_member(tmp_path):
    artifact = _zip(tmp_path / "artifact.zip", {"ranks/rank-0.json.gz": TRACE, "ranks/rank-1.json.gz": TRACE[:3000]})
    result = CliRunner().invoke(main, ["ingest", str(artifact), "-o", str(tmp_path / "run")])
    assert result.exit_code == 1
    assert result.output == f"Error: {artifact}/ranks/rank-1.json.gz: truncated gzip\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.lock", "artifact.zip"]

