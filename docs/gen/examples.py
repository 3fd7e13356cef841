"""Executable examples in the README and the documentation pages, so that what they show cannot drift.

A page marks an example region; its body is generated from the command's real output:

    <!-- example: tracesql query overlap datasets/hta_trace_filter/ -f markdown -->
    ...generated: the command in a console block, then its output...
    <!-- /example -->

    <!-- example rows=4: tracesql query hotspots datasets/tracelens_b200_eager/ -f markdown -->
    ...a Markdown result cut to its first 4 rows, with a line saying how many there were...
    <!-- /example -->

    <!-- example: python -->
    ```python
    ...code written by hand (the region keeps it), run as a script...
    ```
    ...generated: what it printed, in a text block...
    <!-- /example -->

`tracesql ...` commands run in-process (click's test runner) in a scratch folder where `datasets/` is this
repository's (and `queries/`); the examples of one page run in order in one folder, so an `ingest ... -o runs/x` can be queried by
the next example. Outputs are compared with times (`0.72 s`) masked. `-f markdown` results are shown as tables
(with `<`, `>` and `&` escaped, so kernel names survive HTML), any other output verbatim.

    python docs/gen/examples.py README.md docs/guides/hta.md     # rewrite the regions with today's output
    python docs/gen/examples.py --check README.md                # exit 1 and show the differences
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

REGION = re.compile(r"<!-- example(?P<opts>(?: \w+=\S+)*): (?P<cmd>.+?) -->\n(?P<body>.*?)<!-- /example -->", re.S)
_CODE = re.compile(r"```python\n(.*?)```", re.S)
# what Markdown could take for emphasis in a result cell: any `*`, and `_` at the edge of a word (`__next__`);
# `_` inside a word (`hta_trace_filter`) is literal in Python-Markdown and on GitHub, and stays readable
_EMPHASIS = re.compile(r"\*|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_TIME = re.compile(r"\bin \d+(?:\.\d+)? s\b")  # ingest says how long it took


@dataclass
class Region:
    start: int
    end: int
    opts: dict
    cmd: str
    body: str

    @property
    def header(self) -> str:
        opts = "".join(f" {k}={v}" for k, v in self.opts.items())
        return f"<!-- example{opts}: {self.cmd} -->\n"


def regions(text: str) -> list[Region]:
    out = []
    for m in REGION.finditer(text):
        opts = dict(o.split("=", 1) for o in m["opts"].split())
        out.append(Region(m.start(), m.end(), opts, m["cmd"].strip(), m["body"]))
    return out


class Workdir:
    """A scratch folder where `datasets/` and `queries/` are the repository's; commands of one page run here in order."""

    def __init__(self):
        self._tmp = tempfile.TemporaryDirectory(prefix="tracesql-docs-")
        self.path = Path(self._tmp.name)
        for name in ("datasets", "queries"):
            (self.path / name).symlink_to(REPO / name)

    def close(self):
        self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextlib.contextmanager
    def inside(self):
        """cwd is the folder; raw-trace targets are cached in it unless $TRACESQL_CACHE says where."""
        old, cache = os.getcwd(), os.environ.get("TRACESQL_CACHE")
        os.chdir(self.path)
        if cache is None:
            os.environ["TRACESQL_CACHE"] = str(self.path / ".cache")
        try:
            yield
        finally:
            os.chdir(old)
            if cache is None:
                os.environ.pop("TRACESQL_CACHE", None)

    def clean(self, text: str) -> str:
        return text.replace(str(self.path) + "/", "").replace(str(self.path), ".")


def run_tracesql(argv: list[str], work: Workdir) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `tracesql ARGV` run in `work`."""
    from click.testing import CliRunner

    from tracesql.cli import main

    with work.inside():
        result = CliRunner().invoke(main, argv, prog_name="tracesql", catch_exceptions=False)
    return result.exit_code, work.clean(result.stdout), work.clean(result.stderr)


def escape_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def markdown_result(stdout: str, rows: int | None) -> str:
    """A `-f markdown` result as shown on a page: cells HTML-escaped and `*`, `_` kept literal (kernel names hold
    `char const*`), cut to `rows` rows with a line saying so."""
    lines = [_EMPHASIS.sub(lambda m: "\\" + m[0], escape_html(line)) if i > 1 else escape_html(line)
             for i, line in enumerate(stdout.rstrip("\n").split("\n"))]
    header, body = lines[:2], lines[2:]
    text = "\n".join(header + (body[:rows] if rows else body)) + "\n"
    if rows and len(body) > rows:
        text += f"\n({len(body)} rows; the first {rows} shown)\n"
    return text


def render_command(cmd: str, work: Workdir, rows: int | None = None) -> str:
    """The body of a region that runs `cmd` (a `tracesql ...` command line)."""
    argv = shlex.split(cmd)
    if not argv or argv[0] != "tracesql":
        raise ValueError(f"example command must start with 'tracesql' or be 'python': {cmd!r}")
    code, out, err = run_tracesql(argv[1:], work)
    shown = f"```console\n$ {cmd}\n"
    is_table = "markdown" in argv and code == 0 and out.startswith("| ")
    if is_table:
        shown += err + "```\n\n" + markdown_result(out, rows)
    else:
        body = out + err
        shown += body + ("" if body.endswith("\n") or not body else "\n")
        if code:
            shown += f"$ echo $?\n{code}\n"
        shown += "```\n"
    return shown


def render_python(body: str, work: Workdir) -> str:
    """The body of a `python` region: the code it holds, then what the code printed."""
    m = _CODE.search(body)
    if not m:
        raise ValueError("a python example holds a ```python block")
    code = m[1]
    buf = io.StringIO()
    with work.inside(), contextlib.redirect_stdout(buf):
        cwd = os.getcwd()
        try:
            exec(compile(code, "<example>", "exec"), {"__name__": "__example__"})
        finally:
            os.chdir(cwd)
    printed = work.clean(buf.getvalue())
    text = f"```python\n{code}```\n"
    if printed:
        text += f"\n```text\n{printed}{'' if printed.endswith(chr(10)) else chr(10)}```\n"
    return text


def render(region: Region, work: Workdir) -> str:
    rows = int(region.opts["rows"]) if "rows" in region.opts else None
    if region.cmd == "python":
        return render_python(region.body, work)
    return render_command(region.cmd, work, rows)


def normalized(text: str) -> str:
    return _TIME.sub("in T s", text).strip()


def refresh_text(text: str) -> tuple[str, list[tuple[Region, str]]]:
    """The text with every region regenerated, and the regions whose output changed (beyond masked times)."""
    found = regions(text)
    if not found:
        return text, []
    out, pos, changed = [], 0, []
    with Workdir() as work:
        for r in found:
            body = render(r, work)
            out.append(text[pos:r.start])
            if normalized(body) == normalized(r.body):
                body = r.body  # keep the recorded times: only real changes rewrite the page
            else:
                changed.append((r, body))
            out.append(r.header + body + "<!-- /example -->")
            pos = r.end
    out.append(text[pos:])
    return "".join(out), changed


def pages() -> list[Path]:
    """The hand-written pages that may hold examples."""
    return [REPO / "README.md"] + sorted(p for p in (REPO / "docs").rglob("*.md"))


def main(argv: list[str]) -> int:
    check = "--check" in argv
    paths = [Path(a) for a in argv if a != "--check"] or pages()
    status = 0
    for path in paths:
        text = path.read_text()
        new, changed = refresh_text(text)
        for region, body in changed:
            print(f"{path}: example changed: {region.cmd}")
            if check:
                import difflib

                sys.stdout.writelines(difflib.unified_diff(region.body.splitlines(True), body.splitlines(True),
                                                           "page", "today", n=1))
        if changed and not check:
            path.write_text(new)
        status |= bool(changed) and check
    return int(status)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main(sys.argv[1:]))
