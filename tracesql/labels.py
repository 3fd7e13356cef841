"""Run configuration as labels (key = value): what groups replicate runs and sweeps in `tracesql report`.

Four origins, a later one overriding an earlier one for the same key:

1. `trace`: what the traces record: world_size, backend, pg_layout (the process groups), device, framework and
   runtime versions (metadata keys ending in `version`), XLA flags, vLLM / SGLang settings (metadata keys
   starting with `vllm` or `sglang`).
2. `file`: a `tracesql.toml` (its `[labels]` table, else its top-level values) or `labels.json` (an object)
   beside the traces: in each folder given to ingest, or beside each file given.
3. `folder`: `--label-pattern REGEX`, searched in each given source's path; its named groups are labels
   (`'dp(?P<dp>\\d+)-remat_(?P<remat>\\w+)'` on `sweep/dp4-remat_full/` gives dp=4, remat=full).
4. `option`: `--label key=value` (repeatable).

Only the labels from files, folders and options (the `given` ones) say which runs are replicates of one
configuration: the recorded ones describe a run (a framework upgrade is what a gate should catch, not a reason to
compare a run with nothing).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .errors import TraceError

ORIGINS = ("trace", "file", "folder", "option")
GIVEN = ("file", "folder", "option")  # the origins that identify a configuration
LABEL_FILES = ("tracesql.toml", "labels.json")
_KEY = re.compile(r"^[A-Za-z_][\w.-]*$")


def parse(text: str) -> tuple[str, str]:
    """`key=value` -> (key, value); a TraceError naming the label otherwise."""
    key, sep, value = str(text).partition("=")
    key = key.strip()
    if not sep or not _KEY.match(key):
        raise TraceError(f"--label {text!r}", "expected KEY=VALUE with KEY a name (letters, digits, _ . -), "
                                             "e.g. 'remat=full'")
    return key, value.strip()


def parse_set(text: str) -> dict[str, str]:
    """'dp=4,remat=full' -> {'dp': '4', 'remat': 'full'} (a --baseline label set)."""
    return dict(parse(part) for part in text.split(",") if part.strip())


def _value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def _checked(path: Path, pairs: dict) -> dict[str, str]:
    for key in pairs:
        if not _KEY.match(str(key)):
            raise TraceError(path, f"label {key!r} is not a name (letters, digits, _ . -)")
    return {str(k): _value(v) for k, v in pairs.items()}


def read_file(path: Path) -> dict[str, str]:
    """The labels of one tracesql.toml or labels.json; a TraceError naming the file when it does not parse."""
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(path.read_text())
            data = data.get("labels", data)
        else:
            data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:  # tomllib.TOMLDecodeError and JSONDecodeError are ValueErrors
        raise TraceError(path, f"cannot read its labels: {e}") from None
    if not isinstance(data, dict) or any(isinstance(v, dict) for v in data.values()):
        raise TraceError(path, "expected key = value pairs (a [labels] table in TOML, an object of values in JSON)")
    return _checked(path, data)


def from_files(sources: list[Path]) -> dict[str, str]:
    """The labels of the label files beside the sources (in a given folder, or beside a given file)."""
    found: dict[str, str] = {}
    for folder in dict.fromkeys(s if s.is_dir() else s.parent for s in sources):
        for name in LABEL_FILES:
            if (folder / name).is_file():
                found.update(read_file(folder / name))
    return found


def from_folders(sources: list[Path], pattern: str | None) -> dict[str, str]:
    """The named groups of `pattern` where it matches each source's path (the absolute path, / separated)."""
    if not pattern:
        return {}
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise TraceError(f"--label-pattern {pattern!r}", f"not a regular expression: {e}") from None
    if not regex.groupindex:
        raise TraceError(f"--label-pattern {pattern!r}", "has no named group: (?P<key>...) names a label")
    found: dict[str, str] = {}
    for source in sources:
        m = regex.search(Path(source).absolute().as_posix())
        if m:
            found.update({k: v for k, v in m.groupdict().items() if v is not None})
    return found


def given(sources: list[Path], options=(), pattern: str | None = None) -> dict[str, tuple[str, str]]:
    """key -> (value, origin) of the labels given for a run: files, then folder names, then options."""
    out: dict[str, tuple[str, str]] = {}
    for origin, pairs in (("file", from_files(sources)), ("folder", from_folders(sources, pattern)),
                          ("option", dict(parse(o) for o in options))):
        out.update({k: (v, origin) for k, v in pairs.items()})
    return out


RECORDED_SQL = """
SELECT
    (SELECT CAST(coalesce(max(world_size), count(DISTINCT rank)) AS VARCHAR) FROM ranks) AS world_size,
    (SELECT string_agg(DISTINCT backend, ',' ORDER BY backend) FROM ranks) AS backend,
    (SELECT string_agg(DISTINCT model, ',' ORDER BY model) FROM (  -- '/device:GPU:3' is a GPU, not a model
        SELECT regexp_replace(name, '[:#]?[0-9]+$', '') AS model FROM devices WHERE name IS NOT NULL AND name <> ''))
        AS device,
    (SELECT string_agg(part, ', ' ORDER BY part) FROM (
        SELECT coalesce(pg_desc, 'pg') || ':' || group_size
               || CASE WHEN count(DISTINCT pg_name) > 1 THEN ' x' || count(DISTINCT pg_name) ELSE '' END AS part
        FROM process_groups WHERE group_size IS NOT NULL GROUP BY coalesce(pg_desc, 'pg'), group_size))
        AS pg_layout
"""


def _wanted(key: str) -> bool:
    k = key.lower()
    return ((k.endswith("version") and k not in ("schemaversion", "schema_version")) or "xla_flags" in k
            or k.startswith(("vllm", "sglang")))


def from_metadata(documents) -> dict[str, str]:
    """Framework versions, XLA flags and vLLM / SGLang settings from the ranks' metadata (JSON texts): keys at the
    top level or one level down (XPlane's `/host:metadata`); values of several ranks joined by ','."""
    values: dict[str, set[str]] = {}
    for text in documents:
        doc = json.loads(text) if text else {}
        if not isinstance(doc, dict):
            continue
        items = list(doc.items()) + [kv for v in doc.values() if isinstance(v, dict) for kv in v.items()]
        for key, value in items:
            if _wanted(str(key)) and value is not None and _KEY.match(str(key)):
                values.setdefault(str(key).lower(), set()).add(_value(value))
    return {k: ",".join(sorted(v)) for k, v in values.items()}


def recorded(con) -> dict[str, str]:
    """The labels the traces record, from `con` (a session with the run's ranks, devices, process_groups)."""
    cursor = con.execute(RECORDED_SQL)
    row = cursor.fetchall()[0]
    found = {d[0]: v for d, v in zip(cursor.description, row) if v is not None}
    found.update(from_metadata(r[0] for r in con.sql("SELECT DISTINCT CAST(metadata AS VARCHAR) FROM ranks "
                                                     "WHERE metadata IS NOT NULL").fetchall()))
    return found


def merged(recorded_labels: dict[str, str], given_labels: dict[str, tuple[str, str]]) -> tuple[dict, dict]:
    """(labels, label_sources) of a run: the recorded ones overridden by the given ones."""
    labels = {k: (v, "trace") for k, v in recorded_labels.items()}
    labels.update(given_labels)
    keys = sorted(labels)
    return {k: labels[k][0] for k in keys}, {k: labels[k][1] for k in keys}
