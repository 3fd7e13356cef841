"""The short fuzz run: every reader in READERS gets mutated real traces (tests/fuzz/harness.py); each must be
ingested cleanly or refused with a one-line TraceError — no other exception, crash, hang or runaway memory.

Deterministic here (a derandomized hypothesis profile, a few seconds per reader). The long run:
`python -m tests.fuzz --minutes 10`, or `HYPOTHESIS_PROFILE=long pytest tests/test_fuzz.py`.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.harness import Worker, failure_key, mutants, seeds
from tracesql.readers import READERS

settings.register_profile("fuzz-short", derandomize=True, max_examples=20, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
settings.register_profile("long", max_examples=400, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck))
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "fuzz-short")


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    scratch = tmp_path_factory.mktemp("fuzz")
    worker = Worker(scratch)
    yield seeds(scratch), worker
    worker.stop()


@pytest.mark.parametrize("fmt", [r.FORMAT for r in READERS])
def test_seeds_are_real_traces_that_ingest(fuzz, fmt):
    """The harness starts from inputs that work: otherwise every mutant would only test the error path."""
    by_reader, worker = fuzz
    assert by_reader[fmt], f"no seed for {fmt}: add a small real file to tests/fuzz/seeds"  # CI has no corpus
    for seed in by_reader[fmt]:
        assert worker.run(seed.data, seed.suffix) == {"outcome": "ok"}, seed.origin


@pytest.mark.slow  # hypothesis drives hundreds of mutants through each reader
@pytest.mark.parametrize("fmt", [r.FORMAT for r in READERS])
def test_mutated_traces_give_a_result_or_one_line_error(fuzz, fmt):
    by_reader, worker = fuzz
    assert by_reader[fmt], f"no seed for {fmt}: add a small real file to tests/fuzz/seeds"  # CI has no corpus

    @settings(settings.get_profile(PROFILE))
    @given(st.data())
    def check(data):
        seed = data.draw(st.sampled_from(by_reader[fmt]))
        reply = worker.run(data.draw(mutants(seed)), seed.suffix)
        assert failure_key(reply) is None, reply

    check()
