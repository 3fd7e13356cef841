"""Fuzzing the readers (harness.py); `python -m tests.fuzz --minutes 10` is the long run."""
