"""The one error type users see: a file (or run) and what is wrong with it, on one line; and the one warning."""

import os


class TraceError(Exception):
    """Bad input or an unusable run. `str(err)` is the one-line message shown to users."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = " ".join(str(problem).split())  # one line, whatever the cause said
        super().__init__(f"{self.path}: {self.problem}")

    def __reduce__(self):  # rebuilt from (path, problem) when it crosses from a worker process
        return TraceError, (self.path, self.problem)


def install_extra(extra: str) -> str:
    """How to install an optional extra, as the README installs tracesql: from its checkout."""
    return f'pip install ".[{extra}]" in the tracesql checkout'


class OlderSchemaWarning(UserWarning):
    """A run of an older schema version is read as the current one (the CLI prints it as a `Note:` line)."""


def env_number(name: str, default, parse, valid, requirement: str):
    """A number from the environment variable `name` (`default` when unset or empty), refused in one line naming the
    variable when it does not parse or is not `valid`."""
    value = os.environ.get(name)
    if not value:
        return default
    try:
        number = parse(value)
    except ValueError:
        number = None
    if number is None or not valid(number):
        raise TraceError(name, f"{value!r} is not {requirement}")
    return number
