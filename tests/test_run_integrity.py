"""Runs verify themselves (issue 16, items 2 and 4; issue 26 item 7): the manifest lists every Parquet file with
its size, SHA-256 and XXH3-128; opening a run refuses one whose files are not those (missing, added, resized, a
flipped bit in a file the SQL reads) in one line naming the file; `tracesql verify` also checks every checksum;
files are named one by one, so glob characters in a run's path neither break it nor pull in sibling runs."""

from __future__ import annotations

import hashlib
import json
import random
import shutil

import pyarrow.parquet as pq
import pytest
import xxhash
from click.testing import CliRunner

import tracesql
from conftest import DATASETS
from tracesql import store
from tracesql.cli import main

TRACE = DATASETS / "hta_trace_filter" / "sampled_rank-0.json.gz"


@pytest.fixture
def run(ingested, tmp_path):
    """A copy of the run of TRACE, for the test to damage."""
    copy = tmp_path / "run"
    shutil.copytree(ingested(TRACE), copy)
    return copy


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output.strip()


def test_manifest_lists_every_file_with_size_and_checksum(run):
    manifest = json.loads((run / store.MANIFEST).read_text())
    assert sorted(manifest["files"]) == store.parquet_files(run)
    for rel, entry in manifest["files"].items():
        data = (run / rel).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                         "xxh3_128": xxhash.xxh3_128_hexdigest(data)}
    assert "slices/" in " ".join(manifest["files"]) and any(f.startswith("warnings/run-checks-") for f in manifest["files"])
    assert cli("verify", run) == (0, f"{run}: ok — {len(manifest['files'])} files, "
                                     f"{sum(e['size'] for e in manifest['files'].values()):,} bytes match the "
                                     "manifest's checksums")


@pytest.mark.parametrize("table", ["slices", "ops"])  # written from Arrow; streamed from a DuckDB query
def test_parts_have_page_checksums(run, table):
    """pyarrow (and Spark) verify them on read when asked, and `verify` does: a flipped bit in a data page is
    a CRC failure, not a different number."""
    part = next((run / table).glob("*.parquet"))
    pq.read_table(part, page_checksum_verification=True)
    column = pq.ParquetFile(part).metadata.row_group(0).column(0)
    data = bytearray(part.read_bytes())
    data[column.data_page_offset + column.total_compressed_size // 2] ^= 0x01
    part.write_bytes(bytes(data))
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        pq.read_table(part, page_checksum_verification=True)


def test_missing_part_is_refused_naming_it(run):
    part = next((run / "slices").glob("*.parquet"))
    part.unlink()
    for command in (["info", run], ["query", "steps", run], ["verify", run]):
        code, out = cli(*command)
        assert (code, out) == (1, f"Error: {part}: missing: the run's manifest lists it (a damaged run: "
                                  "re-ingest the traces)"), command
    with pytest.raises(tracesql.TraceError, match="missing"):
        tracesql.connect(run)


def test_foreign_part_is_refused_naming_it(run, tmp_path):
    other = tmp_path / "other"
    tracesql.ingest([TRACE], other, run_id="other", rank=7)
    foreign = run / "slices" / next((other / "slices").glob("*.parquet")).name
    foreign.write_bytes(next((other / "slices").glob("*.parquet")).read_bytes())
    code, out = cli("query", "steps", run)
    assert (code, out) == (1, f"Error: {foreign}: not part of the run: its manifest does not list it (remove it, "
                              "or re-ingest the traces)")


def test_resized_part_is_refused(run):
    part = next((run / "ops").glob("*.parquet"))
    size = part.stat().st_size
    with open(part, "ab") as f:
        f.write(b"\0")
    code, out = cli("info", run)
    assert code == 1 and out == (f"Error: {part}: changed: {size + 1:,} bytes where the run's manifest records "
                                 f"{size:,} (a damaged run: re-ingest the traces)")


def test_flipped_bit_is_found_by_verify(run):
    """Same size, one bit flipped inside a data page: DuckDB would read a different sum(dur) without a word;
    `tracesql verify` names the file."""
    before = tracesql.connect(run).execute("SELECT sum(dur) FROM slices").fetchone()[0]
    part = next((run / "slices").glob("*.parquet"))
    data = bytearray(part.read_bytes())
    data[len(data) // 3] ^= 0x04
    part.write_bytes(bytes(data))
    code, out = cli("verify", run)
    assert (code, out) == (1, f"Error: {part}: changed: its SHA-256 differs from the one the run's manifest "
                              "records (a damaged run: re-ingest the traces)")
    # the page checksum finds it too, without the manifest
    with pytest.raises(OSError, match="CRC"):
        pq.read_table(part, page_checksum_verification=True)
    assert before is not None


def _without_xxh3(run):
    """Make `run`'s manifest one of a tracesql that recorded SHA-256 only."""
    manifest = json.loads((run / store.MANIFEST).read_text())
    for entry in manifest["files"].values():
        del entry["xxh3_128"]
    (run / store.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("digest", ["XXH3-128", "SHA-256"])  # a run of this tracesql; one of an older one
def test_every_flipped_bit_is_refused_by_the_query_that_reads_it(run, tmp_path, digest):
    """Bit rot: 20 single bits flipped at random (one at a time) in the run's files, each refused in one line
    naming the file by a query that reads its table (the XXH3-128 of every file a query reads is checked on
    opening the run; a run whose manifest predates it, its SHA-256), never a changed answer; a query that does
    not read that table still runs."""
    if digest == "SHA-256":
        _without_xxh3(run)
    rng = random.Random(26)
    files = sorted(json.loads((run / store.MANIFEST).read_text())["files"])
    for trial in range(20):
        rel = rng.choice(files)
        table, part = rel.split("/")[0], run / rel
        data = part.read_bytes()
        flipped = bytearray(data)
        flipped[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        part.write_bytes(bytes(flipped))
        (tmp_path / "q.sql").write_text(f"SELECT count(*) AS n FROM {table}")
        assert cli("query", tmp_path / "q.sql", run, "-f", "csv") == (
            1, f"Error: {part}: changed: its {digest} differs from the one the run's manifest records (a damaged "
               "run: re-ingest the traces)"), (trial, rel)
        other = "steps" if table != "steps" else "ranks"
        (tmp_path / "q.sql").write_text(f"SELECT count(*) AS n FROM {other}")
        assert cli("query", tmp_path / "q.sql", run, "-f", "csv")[0] == 0
        part.write_bytes(data)


def test_a_flipped_bit_at_any_byte_is_refused(run):
    """The check a query makes on opening a run, at every byte of a part (one bit of each, drawn at random)."""
    files = store.load_manifest(run)["files"]
    rel = next(f for f in sorted(files) if f.startswith("collectives/"))  # 7.5 KB: 41 collectives
    entry, part = files[rel], run / rel
    data = part.read_bytes()
    rng = random.Random(7)
    store.check_digest(run, rel, entry)
    with open(part, "r+b", buffering=0) as f:
        for offset, byte in enumerate(data):
            f.seek(offset)
            f.write(bytes([byte ^ 1 << rng.randrange(8)]))
            with pytest.raises(tracesql.TraceError, match="changed: its XXH3-128 differs"):
                store.check_digest(run, rel, entry)
            f.seek(offset)
            f.write(bytes([byte]))
    assert len(data) > 5000


def test_verify_checks_both_digests_and_the_next_ingest_records_xxh3(run, tmp_path):
    """`verify` holds a file to each digest its manifest records, so a run it passes opens for every query; a run
    whose manifest predates XXH3-128 is verified by its SHA-256 and gets XXH3-128 for every file from the next
    ingest that carries its parts over."""
    manifest = json.loads((run / store.MANIFEST).read_text())
    rel = next(f for f in manifest["files"] if f.startswith("slices/"))
    manifest["files"][rel]["xxh3_128"] = "0" * 32
    (run / store.MANIFEST).write_text(json.dumps(manifest))
    message = (1, f"Error: {run / rel}: changed: its XXH3-128 differs from the one the run's manifest records (a "
                  "damaged run: re-ingest the traces)")
    assert cli("verify", run) == message
    assert cli("query", "hotspots", run) == message
    _without_xxh3(run)
    assert cli("verify", run)[0] == 0
    job = tmp_path / "job"  # the run's trace and another
    job.mkdir()
    shutil.copy2(TRACE, job)
    (job / "rank-1.json").write_text(
        json.dumps({"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]}))
    assert tracesql.ingest([job], run).reused == [TRACE.name]
    after = json.loads((run / store.MANIFEST).read_text())["files"]
    assert rel in after  # carried over
    for f, entry in after.items():
        assert entry["xxh3_128"] == xxhash.xxh3_128_hexdigest((run / f).read_bytes()), f
    assert cli("verify", run)[0] == 0


def test_damaged_run_is_rebuilt_by_the_next_ingest(run):
    """A part missing or a manifest damaged: the next ingest reads every source again (no AttributeError)."""
    next((run / "slices").glob("*.parquet")).unlink()
    result = tracesql.ingest([TRACE], run)
    assert result.ingested and any("missing" in w and "read again" in w for w in result.warnings)
    assert cli("verify", run)[0] == 0
    manifest = json.loads((run / store.MANIFEST).read_text())
    manifest["sources"] = {"x": "not an entry"}
    (run / store.MANIFEST).write_text(json.dumps(manifest))
    result = tracesql.ingest([TRACE], run)
    assert result.ingested and any("damaged manifest" in w for w in result.warnings)
    assert tracesql.connect(run).execute("SELECT count(*) FROM slices").fetchone()[0] == 4811


@pytest.mark.parametrize("folder", ["exp[1]", "a*", "what?", "it's"])
def test_glob_characters_in_run_paths(tmp_path, folder, ingested):
    """A run under `exp[1]/` is written and read; one named `a*` or `what?` reads only its own files, not the
    sibling runs the pattern would match (copies of another run of the trace: read too, they would add their
    slices and their run_id)."""
    parent = tmp_path / folder
    tracesql.ingest([TRACE], parent / "run")
    shutil.copytree(ingested(TRACE), tmp_path / "ab" / "run")  # what `a*` would also match
    shutil.copytree(ingested(TRACE), tmp_path / "whatX" / "run")  # and `what?`
    con = tracesql.connect(parent / "run")
    assert con.execute("SELECT count(*), count(DISTINCT run_id) FROM slices").fetchone() == (4811, 1)
    assert cli("verify", parent / "run")[0] == 0
    init = (parent / "run" / "init.sql").read_text()
    assert "*.parquet" not in init and "'slices/rank00000-" in init  # the run's own files, by name
