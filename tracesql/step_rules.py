"""What makes a range a step: training steps (ProfilerStep#N) and inference iterations (vLLM, SGLang), or a
pattern the user gives at ingest (`tracesql ingest --step-pattern REGEX`, `tracesql.ingest(step_pattern=...)`).

Each rule is a regular expression (Python `re` and DuckDB's RE2 alike) over the names of host ranges of some
kinds. A rank's steps come from one rule: the user's pattern when it matches something, else the first built-in
rule below (in this order) that matches a range of the trace. Inference iterations say more than a number: the
rule reads the phase (prefill / decode / mixed, 'idle' for SGLang's idle batches), the batch size (requests) and
the tokens of the iteration, and how many of those tokens were prefill, when the name carries them.

Named groups of a pattern: `step` (the step number; else steps are numbered 0, 1, ... in time order), `phase`
(a word: prefill/extend/context → prefill, decode/generation → decode, mixed; anything else is kept, lower case),
`batch` (requests), `tokens`, `prefill_tokens`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .arrays import array, texts, to_numpy
from .db import sql_list
from .errors import TraceError
from .functions import quote

#: Host kinds a step range can be (built-in rules say which of them they look at)
HOST_KINDS = ("user_annotation", "cpu_op", "python_function")


@dataclass(frozen=True)
class StepRule:
    name: str  # as stored in steps.rule
    pattern: str
    kinds: tuple[str, ...]
    doc: str
    quick: str | None = None  # a cheap SQL test every matching name passes (regular expressions cost 10x more)

    def ranges(self, matches: list) -> list[tuple]:
        """(slice_id, ts, dur, window_ts, end_ts, name, match) of each step range: the matched ranges, each
        assigning the events that start within it."""
        return [(slice_id, ts, dur, ts, ts + dur, name, m) for (slice_id, ts, dur, name, _), m in matches]

    def fields(self, m: re.Match) -> dict:
        """phase, batch_size, tokens, prefill_tokens (None when the name does not carry them) from a match."""
        g = {k: v for k, v in m.groupdict().items() if v is not None}
        phase = _phase(g.get("phase"))
        batch, tokens, prefill = _int(g.get("batch")), _int(g.get("tokens")), _int(g.get("prefill_tokens"))
        if prefill is None and tokens is not None and phase in ("prefill", "decode"):
            prefill = tokens if phase == "prefill" else 0
        return {"phase": phase, "batch_size": batch, "tokens": tokens, "prefill_tokens": prefill}


class _SGLang(StepRule):
    """SGLang's ModelRunner ranges: step[DECODE bs=32], step[EXTEND bs=15 toks=15360] (ForwardMode names). A
    DECODE batch runs one token per request, so its tokens are its batch size."""

    def fields(self, m):
        out = super().fields(m)
        if m["phase"] == "DECODE" and out["tokens"] is None and out["batch_size"] is not None:
            out["tokens"], out["prefill_tokens"] = out["batch_size"], 0
        elif out["phase"] == "decode" and out["tokens"] is None:
            out["prefill_tokens"] = 0
        return out


class _VLLMContextGeneration(StepRule):
    """vLLM's execute_{tokens}_context_{C}(sq{Σq}sk{Σk}sqsq{..}sqsk{..})_generation_{G}(sq{Σq}...): tokens
    scheduled, C requests in prefill (context) with Σq query tokens, G in decode (generation)."""

    def fields(self, m):
        ctx, gen = int(m["context"]), int(m["generation"])
        return {"phase": _mix(ctx, gen), "batch_size": ctx + gen, "tokens": int(m["tokens"]),
                "prefill_tokens": int(m["context_tokens"]) if m["context_tokens"] is not None else None}


class _VLLMNewCached(StepRule):
    """vLLM v1's older execute_new_{N}_cached_{M}: N newly scheduled requests (their prefill), M running ones."""

    def fields(self, m):
        new, cached = int(m["new"]), int(m["cached"])
        return {"phase": _mix(new, cached), "batch_size": new + cached, "tokens": None, "prefill_tokens": None}


class _DeviceSteps(StepRule):
    """XPlane's device 'Steps' line (TPU cores; TensorFlow's GPU profiles): one event per device and step, named by
    the step's number, XProf's step markers. As in XProf (StepDetails::StepTime), a step is its longest device's
    event: the steps row is that event (its span: XProf's step time); the events of every device that start from
    the first device's start of the step to the last device's end are the step's."""

    def ranges(self, matches):
        by_step: dict[int, list] = {}
        for (slice_id, ts, dur, name, _), m in matches:
            by_step.setdefault(int(m["step"]), []).append((slice_id, ts, dur, name, m))
        out = []
        for markers in by_step.values():
            slice_id, ts, dur, name, m = max(markers, key=lambda r: (r[2], -r[1], -r[0]))
            out.append((slice_id, ts, dur, min(r[1] for r in markers), max(r[1] + r[2] for r in markers), name, m))
        return sorted(out, key=lambda r: (r[3], r[0]))


def _mix(prefill_requests: int, decode_requests: int) -> str | None:
    if prefill_requests and decode_requests:
        return "mixed"
    return "prefill" if prefill_requests else "decode" if decode_requests else None


_PHASES = {"prefill": "prefill", "extend": "prefill", "context": "prefill", "split_prefill": "prefill",
           "draft_extend": "prefill", "decode": "decode", "generation": "decode", "generate": "decode",
           "target_verify": "decode", "mixed": "mixed", "idle": "idle"}


def _phase(word: str | None) -> str | None:
    if not word:
        return None
    return _PHASES.get(word.lower(), word.lower())


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


#: Built-in rules, in the order they are tried (the first that matches a rank's ranges defines its steps)
RULES: tuple[StepRule, ...] = (
    _SGLang("sglang", r"^step\[(?P<phase>[A-Za-z_]+)(?: bs=(?P<batch>\d+))?(?: toks=(?P<tokens>\d+))?[^\]]*\]$",
            ("user_annotation", "cpu_op"), "SGLang: step[DECODE bs=32], step[EXTEND bs=15 toks=15360]",
            "starts_with(name, 'step[')"),
    _VLLMContextGeneration(
        "vllm", r"^execute_(?P<tokens>\d+)_context_(?P<context>\d+)\((?:sq(?P<context_tokens>\d+))?[^)]*\)"
                r"_generation_(?P<generation>\d+)\([^)]*\)$",
        ("user_annotation", "cpu_op"), "vLLM: execute_{tokens}_context_{C}(sq..)_generation_{G}(sq..)",
        "starts_with(name, 'execute_')"),
    _VLLMNewCached("vllm_new_cached", r"^execute_new_(?P<new>\d+)_cached_(?P<cached>\d+)$",
                   ("user_annotation", "cpu_op"), "vLLM v1 (older): execute_new_{N}_cached_{M}",
                   "starts_with(name, 'execute_new_')"),
    StepRule("profiler_step", r"^ProfilerStep#(?P<step>\d+)(?:\s.*)?$", ("user_annotation", "cpu_op"),
             "PyTorch: ProfilerStep#N (profiler schedule / prof.step()), also with a trailing label",
             "starts_with(name, 'ProfilerStep#')"),
    StepRule("vllm_execute_model", r"^\S*model_runner\.py\(\d+\): execute_model$", ("python_function",),
             "vLLM's model runner execute_model (with_stack traces that carry no iteration ranges)",
             "ends_with(name, ': execute_model')"),
    _DeviceSteps("xplane_steps", r"^(?P<step>\d+)$", ("gpu_annotation",),
                 "XPlane: the device 'Steps' line (TPU, TensorFlow GPU), when the host marks no step",
                 "ends_with(track, ' / Steps')"),
)

#: The columns `find` returns (steps: by rank, then ts, then slice id), and their types
#: (window_ts, end_ts: where the events that belong to the step by time start; ts, dur: the range that names it)
COLUMNS = pa.schema([("rank", pa.int32()), ("slice_id", pa.int64()), ("ts", pa.int64()), ("dur", pa.int64()),
                     ("window_ts", pa.int64()), ("end_ts", pa.int64()),
                     ("step", pa.int32()), ("name", pa.string()), ("rule", pa.string()), ("phase", pa.string()),
                     ("batch_size", pa.int32()), ("tokens", pa.int64()), ("prefill_tokens", pa.int64())])


def user_rule(pattern: str | None) -> StepRule | None:
    """The user's --step-pattern as a rule; a pattern neither Python nor DuckDB (RE2) can compile is an error."""
    if pattern is None:
        return None
    try:
        compiled = re.compile(pattern)
    except re.error as e:
        raise TraceError("--step-pattern", f"{pattern!r} is not a regular expression: {e}") from None
    unknown = set(compiled.groupindex) - {"step", "phase", "batch", "tokens", "prefill_tokens"}
    if unknown:
        raise TraceError("--step-pattern", f"unknown named group(s) {', '.join(sorted(unknown))}: use step, phase, "
                                           "batch, tokens, prefill_tokens")
    import duckdb

    try:
        duckdb.sql(f"SELECT regexp_matches('', {quote(pattern)})").fetchall()
    except duckdb.Error as e:
        raise TraceError("--step-pattern", f"{pattern!r}: DuckDB's regular expressions (RE2) reject it: "
                                           f"{str(e).splitlines()[0]}") from None
    return StepRule("user", pattern, HOST_KINDS, "the --step-pattern given at ingest")


def candidates_sql(table: str, rules: tuple[StepRule, ...]) -> str:
    """The ranges of `table` that any rule matches (few: the rules are checked in Python on them)."""
    clauses = " OR ".join(f"(kind IN ({sql_list(r.kinds)}) AND {r.quick or 'true'} "
                          f"AND regexp_matches(name, {quote(r.pattern)}))" for r in rules)
    return f"SELECT rank, slice_id, ts, dur, name, kind FROM {table} WHERE name IS NOT NULL AND ({clauses}) " \
           "ORDER BY rank, ts, slice_id"


def find(con, table: str, notes: dict[int, list], pattern: str | None = None) -> pa.Table:
    """The step ranges of each rank of `table` (slices with their rank; `notes`: each rank's notes), by the
    first rule that matches any of the rank's ranges (the user's first), as COLUMNS. Ranges of the chosen rule
    that start together are all kept (the later one counts when events are assigned to steps, as before). A
    rank's notes get a line when the user's pattern matched none of its ranges."""
    user = user_rule(pattern)
    rules = ((user,) if user else ()) + RULES
    candidates: dict[int, list] = {rank: [] for rank in sorted(notes)}
    for rank, *row in con.execute(candidates_sql(table, rules)).fetchall():
        candidates[rank].append(row)
    out = {c: [] for c in COLUMNS.names}
    for rank, rows in candidates.items():
        chosen, matches = None, []
        for rule in rules:
            matches = [(row, m) for row in rows if row[4] in rule.kinds and (m := re.search(rule.pattern, row[3]))]
            if matches:
                chosen = rule
                break
        if user and chosen is not user:
            notes[rank].append(f"--step-pattern {pattern!r} matched no range"
                               + (f"; steps are {chosen.name} ranges" if chosen else "; the trace has no steps"))
        if chosen is not None:
            _add_ranges(out, rank, chosen, matches)
    return _table(out)


def _add_ranges(out: dict[str, list], rank: int, chosen: StepRule, matches: list) -> None:
    """The step ranges of rank `rank` by rule `chosen` (`matches`: its ranges and the rule's matches) added to the
    columns `out`."""
    for i, (slice_id, ts, dur, window_ts, end_ts, name, m) in enumerate(chosen.ranges(matches)):
        number = m.groupdict().get("step")
        fields = chosen.fields(m)
        out["rank"].append(rank)
        out["slice_id"].append(slice_id)
        out["ts"].append(ts)
        out["dur"].append(dur)
        out["window_ts"].append(window_ts)
        out["end_ts"].append(end_ts)
        out["step"].append(int(number) if number is not None and number.isdigit() and int(number) < 2**31 else i)
        out["name"].append(name)
        out["rule"].append(chosen.name)
        for k, v in fields.items():
            out[k].append(v)


def _table(columns: dict[str, list]) -> pa.Table:
    """COLUMNS from Python lists, through numpy (pa.array and Table.from_pydict import pandas: a second per
    ingest process; see tracesql.arrays)."""
    arrays = []
    for f in COLUMNS:
        values = columns[f.name]
        if pa.types.is_string(f.type):
            arrays.append(texts(values))
        else:  # a number the column cannot hold (ProfilerStep#99999999999) is unknown
            limit = np.iinfo(f.type.to_pandas_dtype()).max
            values = [v if v is not None and -limit <= v <= limit else None for v in values]
            missing = np.array([v is None for v in values], bool)
            arrays.append(array(np.array([0 if v is None else v for v in values], np.int64).astype(
                f.type.to_pandas_dtype()), f.type, missing))
    return pa.Table.from_arrays(arrays, schema=COLUMNS)


def as_numpy(steps: pa.Table) -> dict[str, np.ndarray]:
    """rank, ts (the window's start), end_ts, step, slice_id, name as arrays (what the nesting pass and the checks
    read)."""
    out = {c: to_numpy(steps[c]) for c in ("rank", "end_ts", "step", "slice_id")}
    out["ts"] = to_numpy(steps["window_ts"])
    out["name"] = np.array(steps["name"].to_pylist(), object)
    return out
