"""Nothing left behind (issue 16, item 5): an ingest keeps its temporary files (readers' and normalize's scratch,
DuckDB's spill files, unpacked archive members) in its `.RUN.extract-*` folder beside the run, which the next
ingest removes whatever killed the last; worker processes die with their parent (`kill -9` included)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import tracesql
from conftest import write_trace
from test_cli_errors import _children_alive


def _traces(folder, n=4, events=60_000):
    folder.mkdir()
    for rank in range(n):
        write_trace(folder / f"rank-{rank}.json", [
            {"ph": "X", "cat": "cpu_op", "name": f"op{i % 50}", "ts": i * 10, "dur": 5, "pid": 1, "tid": 1}
            for i in range(events)], distributedInfo={"rank": rank})
    return folder


def test_temporary_files_stay_in_the_ingest_scratch_folder(tmp_path, monkeypatch):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    src = _traces(tmp_path / "src", n=2, events=2000)
    tracesql.ingest([src], tmp_path / "run", jobs=1)
    tracesql.ingest([src / "rank-0.json"], tmp_path / "run0")
    assert list(tmp.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.lock", ".run0.lock", "run", "run0", "src", "tmp"]


@pytest.mark.concurrency
def test_kill_9_leaves_no_worker_and_the_next_ingest_no_scratch(tmp_path):
    src = _traces(tmp_path / "src")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "tracesql", "ingest", str(src), "-o", str(tmp_path / "run"),
                             "-j", "2", "-q"], env=env, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    # kill it while the workers read: they have put their scratch files into the ingest's folder
    while time.time() < deadline and not any(p.name.startswith("tracesql-") for d in tmp_path.glob(".run.extract-*")
                                             for p in d.iterdir()):
        time.sleep(0.05)
    workers = _children_alive(proc.pid)
    assert workers, "no worker process started"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 30
    while time.time() < deadline and any(os.path.exists(f"/proc/{w}") and _state(w) != "Z" for w in workers):
        time.sleep(0.1)
    assert [w for w in workers if os.path.exists(f"/proc/{w}") and _state(w) != "Z"] == []
    left = sorted(tmp_path.glob(".run.*-*"))
    assert any(p.name.startswith(".run.extract-") for p in left) and not (tmp_path / "run").exists()
    time.sleep(1)
    assert sorted(tmp_path.glob(".run.*-*")) == left  # no worker lives on to write staging folders
    tracesql.ingest([src], tmp_path / "run", jobs=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.lock", "run", "src", "tmp"]
    assert list(tmp.iterdir()) == []


def _state(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"
