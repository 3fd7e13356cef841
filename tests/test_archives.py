"""Archives of traces (zip, tar, tar.gz) ingested directly, and malicious ones refused without writing anything
outside tracesql's own scratch folder."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile

import pytest
from click.testing import CliRunner

import tracesql
from conftest import DATASETS, write_trace
from tracesql import schema
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


def test_zip_artifact_ingests_like_the_folder(tmp_path, ingested):
    artifact = _zip(tmp_path / "artifact.zip", {
        "README.txt": b"CI job 1234",
        **{f"traces/{f.name}": f.read_bytes() for f in sorted(TRACE_FILTER.glob("*.json.gz"))}})
    result = CliRunner().invoke(main, ["ingest", str(artifact), "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    con = tracesql.connect(tmp_path / "run")
    assert con.execute("SELECT rank, source_path FROM ranks ORDER BY rank").fetchall() == [
        (0, "artifact.zip/traces/sampled_rank-0.json.gz"), (1, "artifact.zip/traces/sampled_rank-1.json.gz")]
    assert _same_slices(tmp_path / "run", ingested(TRACE_FILTER))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.lock", "artifact.zip", "run"]  # scratch removed

    again = tracesql.ingest([artifact], tmp_path / "run")
    assert not again.changed and len(again.reused) == 2
    _zip(artifact, {f"traces/{f.name}": f.read_bytes() for f in sorted(TRACE_FILTER.glob("*.json.gz"))[:1]})
    changed = tracesql.ingest([artifact], tmp_path / "run")
    assert changed.removed == ["artifact.zip/traces/sampled_rank-1.json.gz"]


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


#: The per-rank tables: every one but those written once per run over all its ranks (schema.RUN_TABLES), and
#: `warnings`, whose run-wide checks (clocks far apart) depend on the other ranks of the run.
RANK_TABLES = sorted(set(schema.TABLES) - set(schema.RUN_TABLES) - {"warnings"})


def _rows(run, table: str, ranks: tuple[int, ...]):
    con = tracesql.connect(run)
    ranks_of = "rank IN (" + ", ".join(map(str, ranks)) + ")"
    rows = con.execute(f"SELECT * EXCLUDE (run_id) FROM {table} WHERE {ranks_of}").fetchall()
    if table == "ranks":  # where the trace was found differs between runs
        columns = [d[0] for d in con.execute("SELECT * EXCLUDE (run_id) FROM ranks LIMIT 0").description]
        keep = [i for i, c in enumerate(columns) if c not in ("source_path", "source_bytes")]
        rows = [tuple(r[i] for i in keep) for r in rows]
    return sorted(rows, key=repr)


def test_members_read_by_one_process_give_the_rows_each_gives_alone(tmp_path, ingested):
    """One process reads an archive's members one after another on the DuckDB connections it keeps between
    traces (db.for_trace), and skips the queries a member has no input for: nothing of one member's work may
    reach the next. Ranks 0 and 1 of the dp2 x tp2 mesh (collectives, steps, process groups) with, read between
    them, a member with a memory event, a communication kernel and no steps, give each member's own rows."""
    mesh = DATASETS / "torch_mesh_dp2_tp2"
    host = {"pid": 1, "tid": 1}
    events = [  # an allocation, then an all-gather kernel and its launch
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": 5, "s": "t", **host,
         "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512, "Total Allocated": 512, "Addr": 64}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 9, "dur": 3, **host,
         "args": {"correlation": 3}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "pid": 0, "tid": 9, "ts": 14,
         "dur": 8, "args": {"correlation": 3, "device": 0, "stream": 9}},
    ]
    other = write_trace(tmp_path / "rank-2.json", events, distributedInfo={"rank": 2, "world_size": 3})
    artifact = _zip(tmp_path / "artifact.zip", {"a/rank-0.json.gz": (mesh / "rank-0.pt.trace.json.gz").read_bytes(),
                                                "b/rank-2.json": other.read_bytes(),
                                                "c/rank-1.json.gz": (mesh / "rank-1.pt.trace.json.gz").read_bytes()})
    tracesql.ingest([artifact], tmp_path / "run", jobs=1)
    tracesql.ingest([other], tmp_path / "alone")
    for table in RANK_TABLES:
        assert _rows(tmp_path / "run", table, (0, 1)) == _rows(ingested(mesh), table, (0, 1)), table
        assert _rows(tmp_path / "run", table, (2,)) == _rows(tmp_path / "alone", table, (2,)), table
    con = tracesql.connect(tmp_path / "run")  # what the members hold, so that the comparison above can fail
    assert con.execute("SELECT rank, count(*) FROM collectives GROUP BY rank ORDER BY rank").fetchall() == [
        (0, 4), (1, 4), (2, 1)]
    assert con.execute("SELECT rank, count(*) FROM memory GROUP BY rank").fetchall() == [(2, 1)]
    assert con.execute("SELECT DISTINCT rank FROM steps ORDER BY rank").fetchall() == [(0,), (1,)]
