"""The reader benchmark runs (smoke mode: tiny crafted inputs, no timing claims), so that it does not rot."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO

pytestmark = pytest.mark.benchmark


def test_bench_readers_smoke_runs():
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_readers.py"), "--smoke",
                          "--memory-limit", "256MB"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split("|")[1].strip() for row in rows] == ["nsys", "rocprof", "perfetto", "xplane", "ascend"]
