"""The one error type users see: a file (or run) and what is wrong with it, on one line; and the one warning."""


class TraceError(Exception):
    """Bad input or an unusable run. `str(err)` is the one-line message shown to users."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = " ".join(str(problem).split())  # one line, whatever the cause said
        super().__init__(f"{self.path}: {self.problem}")

    def __reduce__(self):  # rebuilt from (path, problem) when it crosses from a worker process
        return TraceError, (self.path, self.problem)


class OlderSchemaWarning(UserWarning):
    """A run of an older schema version is read as the current one (the CLI prints it as a `Note:` line)."""
