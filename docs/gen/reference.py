"""The generated reference pages of the documentation site, made from the code so they cannot drift:

- `reference/queries/NAME.md`: one page per curated query, from its header (what it answers, definition,
  parameters with their allowed values, columns), with its real output on a bundled dataset (EXAMPLES below)
  and its SQL;
- `reference/tables.md`: the tables, from `tracesql/schema.py`;
- `reference/functions.md`: the SQL macros and data tables, from the comments in `tracesql/functions/`;
- `reference/cli.md`: every command's `--help`, from the click commands;
- `reference/json.md`: the JSON Schema of every command's `-f json`, from `tracesql/json_schemas.py`;
- `reference/datasets.md`: the bundled traces, from `datasets/README.md`.

Every curated query needs an entry in EXAMPLES (a test fails, and the strict site build with it, until a new query
has one): the command line after `tracesql` that shows it on a bundled dataset (`-f markdown` is added), and how
many rows to show.

    python docs/gen/reference.py OUT_DIR      # write the pages to OUT_DIR (docs/gen/build.py stages them for the site)
"""

from __future__ import annotations

import csv
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for _path in (REPO, Path(__file__).resolve().parent):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from examples import Workdir, escape_html, render_command  # noqa: E402


@dataclass(frozen=True)
class Example:
    command: str  # after `tracesql`, without `-f markdown`
    rows: int = 8
    note: str = ""  # a sentence under the output (what to notice)


EXAMPLES: dict[str, Example] = {
    "annotations": Example("query annotations datasets/hta_nccl_parser_config/ -p top=5", 5),
    "bound": Example(
        "query bound datasets/hta_trace_filter/",
        note="HTA's sampled trace keeps few ops: its steps are bound by host work (Python between the ops)."),
    "bubbles": Example("query bubbles datasets/hta_trace_filter/ -p scope=device", 6),
    "bubbles_largest": Example("query bubbles_largest datasets/hta_trace_filter/ -p top=3", 6),
    "collective_stragglers": Example(
        "query collective_stragglers datasets/torch_gloo_4rank_straggler/",
        note="Rank 2 of this job sleeps 5 ms before each collective (it was made so): it is last 23 times out of 27."),
    "clock_offsets": Example(
        "query clock_offsets datasets/torch_pipeline_gpipe_4stage/",
        note="The four ranks ran on one host (one clock): the offsets are within their uncertainty of 0."),
    "collectives": Example("query collectives datasets/torch_gloo_4rank_straggler/", 6),
    "cost_coverage": Example(
        "query cost_coverage datasets/tracelens_b200_eager/ -p per=kernel", 5,
        note="GPT-OSS with MXFP4 experts on a B200: 20 % of the compute time is under an op with a cost; vLLM's MoE "
             "op records the hidden states and router logits but not the experts' weights, so its grouped GEMMs "
             "cannot be rated."),
    "comm_matrix": Example("query comm_matrix datasets/torch_pipeline_gpipe_4stage/", 6),
    "critical_path": Example(
        "query critical_path datasets/hta_trace_filter/ -p rank=0 -p instance=0", 6,
        note="HTA's sampled trace keeps few ops: the path is mostly host time between them (cpu_bound); "
             "`-p per=class` sums it per bound_by and cause."),
    "diff": Example(
        "diff datasets/torch_gloo_2rank/ datasets/torch_gloo_4rank_straggler/ --top 4",
        note="`tracesql diff BEFORE AFTER` runs this query on two runs; gloo runs on the CPU, so without device "
             "events on both sides ops are compared on host self time."),
    "hotspots": Example("query hotspots datasets/tracelens_b200_eager/ -p top=3", 6),
    "iterations": Example(
        "query iterations datasets/tracelens_vllm_graph_execution/",
        note="TraceLens' vLLM decode trace replays a full graph: 32 requests decode one token each; the host range "
             "launches the graph and returns while the device runs for 10.7 ms."),
    "kernel_breakdown": Example("query kernel_breakdown datasets/hta_trace_filter/", 8),
    "launch": Example("query launch datasets/hta_trace_filter/", 6),
    "queue_length": Example(
        "query queue_length datasets/hta_nccl_parser_config/ -p max_queue_length=8",
        note="DDP on an A100: the compute stream's queue holds 10 launches at most, so the host never ran far "
             "ahead of the device; CUDA would block the host at 1024."),
    "copy_bandwidth": Example("query copy_bandwidth datasets/hta_nccl_parser_config/"),
    "kernel_sequences": Example("query kernel_sequences datasets/hta_nccl_parser_config/ -p operator=aten::conv -p top=3", 3),
    "kernel_counters": Example(
        "query kernel_counters datasets/hta_cupti_profiler/", 4),
    "memory": Example("query memory datasets/torch_gloo_2rank/"),
    "memory_curve": Example("query memory_curve datasets/torch_gloo_2rank/ -p points=4"),
    "memory_ops": Example("query memory_ops datasets/torch_gloo_2rank/ -p top=3", 6),
    "mfu": Example(
        "query mfu datasets/hta_trace_filter/ -p device=A100-SXM-40GB -p dtype=fp32 -p params=100000000 "
        "-p tokens_per_step=1000000",
        note="MFU needs the model's FLOPs: here 6 · 10⁸ parameters · 10⁶ tokens per step over the job's 128 "
             "devices; HFU counts the FLOPs of the ops the trace recorded with shapes."),
    "modules": Example(
        "query modules datasets/tracelens_b200_eager/ -p top=6", 6,
        note="GPT-OSS on a B200, recorded with with_stack: 36 TransformerBlock calls; the model spends 11.6 ms on "
             "the device and 79 ms on the host (an eager, host-bound run)."),
    "overlap": Example("query overlap datasets/hta_trace_filter/ -p per=step"),
    "phases": Example(
        "query phases datasets/hta_nccl_parser_config/",
        note="DDP on an A100: backward (on the autograd thread) takes twice the forward; the device idles 77 % of "
             "each step, and 10 to 19 ms of communication per step is not hidden under compute."),
    "parallelism": Example(
        "query parallelism datasets/torch_mesh_dp2_tp2/ -p per=group",
        note="DeviceMesh names its groups mesh_dp and mesh_tp; -p parallelism=tp=2,dp=2 labels them from the "
             "layout instead, with the same result."),
    "pipeline": Example(
        "query pipeline datasets/torch_pipeline_1f1b_4stage_slow2/", 4,
        note="Stage 2 does three times the others' work: it computes longest and limits the pipeline "
             "(limiting); the other stages wait for it (imbalance_ns)."),
    "roofline": Example("query roofline datasets/tracelens_b200_eager/ -p top=4", 4),
    "steps": Example("query steps datasets/hta_trace_filter/"),
    "temporal_breakdown": Example("query temporal_breakdown datasets/hta_trace_filter/ -p per=step"),
    "timeline": Example("query timeline datasets/hta_trace_filter/ -p step=551", 6),
    "what_if": Example(
        "query what_if datasets/hta_trace_filter/ -p no_launch_overhead=1 -p faster=^aten:: -p faster_pct=50", 4,
        note="Unchanged, the replay lasts what each step measured (replayed_ns = measured_ns); the changes save "
             "saving_ns."),
    "xla_breakdown": Example("query xla_breakdown datasets/xprof_tpu_inference/ -p dimensions=category", 8),
}


def missing_examples() -> list[str]:
    """Curated queries without an EXAMPLES entry."""
    from tracesql import queries

    return [q.name for q in queries.catalogue() if q.name not in EXAMPLES]


def stale_examples() -> list[str]:
    """EXAMPLES entries for queries that no longer exist."""
    from tracesql import queries

    names = {q.name for q in queries.catalogue()}
    return [name for name in EXAMPLES if name not in names]


def _text(doc: str) -> str:
    """A header's free text as Markdown, HTML-escaped. Headers are hard-wrapped prose; a line that starts a
    definition (`name = ...`) or a list item starts a new paragraph, as its author laid it out."""
    out = []
    # the README's HTA section moved to the HTA guide (query pages are reference/queries/NAME.md)
    text = _plain(escape_html(doc)).replace("see README", "see the [HTA guide](../../guides/hta.md)")
    for line in text.splitlines():
        if out and (re.match(r"^[\w.]+(\(\w*\))? = ", line) or line.startswith(("- ", "* "))):
            out.append("")
        out.append(line)
    return "\n".join(out)


def _plain(text: str) -> str:
    """Text that is not Markdown: every `*` and `_` (`__next__`, `a * b`) kept as it is; `code spans` untouched."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        parts[i] = re.sub(r"[*_]", lambda m: "\\" + m[0], parts[i])
    return "`".join(parts)


def _cell(text: str) -> str:
    return _plain(escape_html(text)).replace("|", "\\|")


def params_table(q) -> str:
    """A query's or findings rule's parameters as a Markdown table."""
    out = ["| parameter | default | values | meaning |", "|---|---|---|---|"]
    for p in q.params.values():
        rule = p.rule or ""
        meaning = p.doc[len(rule) + 1:].strip() if rule and p.doc.startswith(rule) else p.doc
        out.append(f"| `{p.name}` | `{_cell(p.default)}` | {_cell(rule)} | {_cell(meaning)} |")
    return "\n".join(out)


def findings_page() -> str:
    """The findings rules (findings/*.sql), each from its header, with its SQL."""
    from tracesql import findings

    rules = findings.catalogue()
    out = ["# Findings rules\n",
           "The rules `tracesql findings` runs (and the report's Findings section): plain SQL files in `findings/` "
           "with the curated queries' header; each prices its cause with the what-if replay (the `what_if` table "
           "macro). Every rule returns the same columns; `-p NAME=VALUE` sets a parameter of every rule that takes "
           "it. See the [findings guide](../guides/findings.md).\n",
           "| rule | detects |\n|---|---|"]
    out += [f"| [`{r.name}`](#{r.name}) | {_cell(r.title)} |" for r in rules]
    out.append("\n## Columns\n\n| column | type | meaning |\n|---|---|---|")
    out += [f"| `{name}` | {typ} | {_cell(doc)} |" for name, typ, doc in findings.FINDING_COLUMNS]
    for r in rules:
        out += [f"\n## {r.name}\n", f"{_text(r.title)}\n", f"{_text(r.doc)}\n"]
        if r.needs:
            out.append(f"**Needs:** {_text(r.needs)}.\n")
        out += [params_table(r), f"\n`findings/{r.name}.sql`:\n\n```sql\n{r.sql.rstrip()}\n```"]
    return "\n".join(out) + "\n"


def query_page(q, work: Workdir) -> str:
    from tracesql import queries

    out = [f"# `{q.name}`\n", f"{_text(q.title)}\n"]
    if q.doc:
        out.append(f"{_text(q.doc)}\n")
    if q.needs:
        out.append(f"**Needs:** {_text(q.needs)}.\n" if not q.needs.endswith(".") else f"**Needs:** {_text(q.needs)}\n")
    out.append("## Parameters\n")
    if q.params:
        out.append(params_table(q))
        out.append("\nGive them as `-p name=value` (CLI), keyword arguments (`tracesql.query(...)`), or "
                   "`SET VARIABLE name = value;` in a plain DuckDB session; a value outside the allowed ones is "
                   "refused before the query runs.\n")
    else:
        out.append("None.\n")
    out.append("## Columns\n\n| column | type | meaning |\n|---|---|---|")
    out += [f"| `{name}` | {typ} | {_cell(doc)} |" for name, typ, doc in q.columns]
    out.append("")
    example = EXAMPLES.get(q.name)
    out.append("## Example\n")
    if example is None:
        out.append("No example yet: add one to `EXAMPLES` in `docs/gen/reference.py`.\n")
    else:
        out.append(render_command(f"tracesql {example.command} -f markdown", work, example.rows))
        if example.note:
            out.append(f"{example.note}\n")
    out.append("## Run it\n")
    out.append(_run_it(q, example))
    out.append(f"## SQL\n\n`queries/{q.name}.sql`:\n\n```sql\n{queries.find(q.name).sql.rstrip()}\n```\n")
    return "\n".join(out)


def python_call(example: Example) -> tuple[list[str], dict[str, str]]:
    """The targets and the parameters (name -> value as typed) of an example's command line."""
    import shlex

    argv = shlex.split(example.command)
    params, targets = {}, []
    i = 2 if argv[0] == "query" else 1
    while i < len(argv):
        if argv[i] in ("-p", "--param"):
            name, _, value = argv[i + 1].partition("=")
            params[name] = value
            i += 2
        elif argv[i] == "--top":
            params["top"] = argv[i + 1]
            i += 2
        else:
            targets.append(argv[i])
            i += 1
    return targets, params


def _py(value: str) -> str:
    return value if re.fullmatch(r"-?\d+(\.\d+)?", value) else repr(value)


def _run_it(q, example: Example | None) -> str:
    """How to run the query from Python and plain DuckDB, with the example's arguments (a test runs the call)."""
    targets, params = python_call(example) if example else (["runs/1234"], {})
    target = repr(targets[0]) if len(targets) == 1 else "[" + ", ".join(map(repr, targets)) + "]"
    kwargs = "".join(f", {k}={_py(v)}" for k, v in params.items())
    sets = " ".join(f"SET VARIABLE {k} = {_py(v)};" for k, v in params.items())
    return ("```python\nimport tracesql\n\n"
            f"df = tracesql.query({q.name!r}, {target}{kwargs})   # a pandas DataFrame\n```\n\n"
            "In a plain DuckDB shell on a run (`duckdb -init init.sql` in the run folder), the file runs as it is"
            + (f" once its parameters are set: `{sets}`, then" if sets else ":")
            + f" `.read {q.name}.sql` (from `queries/` in this repository, or `tracesql/queries/` where it is "
              "installed). "
              "Without a value, a parameter takes its default.\n")


def queries_index() -> str:
    from tracesql import queries

    out = ["# Queries\n",
           "The curated queries: plain SQL files in `queries/` whose header says what they answer, how, with which "
           "parameters and which columns; a test checks each header against what the query really returns. Each "
           "page below is generated from that header, with the query's real output on a bundled dataset.\n",
           "| query | answers | parameters |\n|---|---|---|"]
    for q in queries.catalogue():
        params = ", ".join(f"`{p}`" for p in q.params) or "none"
        out.append(f"| [`{q.name}`]({q.name}.md) | {_cell(q.title)} | {params} |")
    out.append("\nYour own SQL runs the same way: `tracesql query my_question.sql RUN`, with the "
               "[tables](../tables.md) and the [functions](../functions.md).\n")
    return "\n".join(out)


def tables_page() -> str:
    from tracesql import schema

    out = ["# Tables\n",
           "Generated from `tracesql/schema.py`, the one place that defines them (`tracesql schema` prints the "
           "same). Every time is an integer nanosecond; unknown values are NULL, never 0 or −1; ids are unique "
           "within (`run_id`, `rank`).\n",
           schema.markdown(),
           "## Schema versions\n",
           "Every run records the schema version that wrote it. Runs from an older version are read (what they "
           "lack reads as NULL) and re-read from their sources by the next ingest; a newer one is refused.\n",
           "| version | what changed |\n|---|---|"]
    out += [f"| {v} | {_cell(text)} |" for v, text in sorted(schema.SCHEMA_CHANGES.items())]
    return "\n".join(out) + "\n"


_MACRO = re.compile(r"^CREATE (?:OR REPLACE )?MACRO (\w+)\s*\(", re.M)


def macros(text: str) -> tuple[str, list[tuple[str, str, bool, str]]]:
    """A macro file's leading comment, and (name, arguments, is a table macro, its comment) for each macro."""
    lines = text.splitlines()
    intro = []
    for line in lines:
        if not line.startswith("--"):
            break
        intro.append(line[2:].strip())
    found = []
    for m in _MACRO.finditer(text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        args = " ".join(text[m.end():i - 1].split())
        is_table = bool(re.match(r"\s*AS\s+TABLE\b", text[i:]))
        doc, j = [], text.count("\n", 0, m.start()) - 1
        while j >= 0 and lines[j].startswith("--"):
            doc.insert(0, lines[j][2:].strip())
            j -= 1
        if j < 0:  # the file's own comment is the intro, not this macro's
            doc = []
        found.append((m[1], args, is_table, "\n".join(doc).strip()))
    return "\n".join(intro).strip(), found


def _csv_table(path: Path) -> str:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows[1:]]
    return "\n".join(out)


def functions_page() -> str:
    from tracesql import functions

    out = ["# Functions\n",
           "SQL macros and data tables that exist in every session on a run: `tracesql.connect`, `tracesql query`, "
           "`tracesql shell`, and any DuckDB client through the run's `init.sql`. Generated from "
           "`tracesql/functions/`, one section per file; each macro's text is the comment above it.\n"]
    for file_name, text in functions.sql_files():
        intro, found = macros(text)
        topic = file_name.removesuffix(".sql").split("_", 1)[-1]
        out.append(f"## {topic.replace('_', ' ').capitalize()}\n")
        where = (f"`tracesql/functions/{file_name}`" if (functions.HERE / file_name).exists()
                 else "generated when a session starts, no file")
        out.append(where + (f": {_text(intro)}" if intro else "") + "\n")
        for name, args, is_table, doc in found:
            kind = "table macro" if is_table else "macro"
            out.append(f"### `{name}`\n")
            out.append(f"`{name}({args})` — {kind}\n")
            if doc:
                out.append(f"{_text(doc)}\n")
    for path in sorted(functions.HERE.glob("*.csv")):
        out.append(f"## Table `{path.stem}`\n")
        out.append(f"From `tracesql/functions/{path.name}`, created as a table in every session (edit the "
                   f"table, or insert rows, to change it for that session).\n")
        out.append(_csv_table(path) + "\n")
    return "\n".join(out)


def cli_page() -> str:
    import click

    from tracesql.cli import main

    out = ["# Command line\n",
           "Every command's `--help`, generated from the click commands. `tracesql --version` prints the "
           "version. Errors are one line naming the file or parameter, with a non-zero exit status.\n"]
    for name in sorted(main.commands):
        cmd = main.commands[name]
        ctx = click.Context(cmd, info_name=f"tracesql {name}", terminal_width=100, max_content_width=100)
        out.append(f"## `tracesql {name}`\n")
        short = cmd.get_short_help_str(limit=200)
        out.append(f"{_text(short)}\n")
        out.append(f"```text\n{cmd.get_help(ctx).rstrip()}\n```\n")
    return "\n".join(out)


def json_page() -> str:
    import json

    from tracesql import json_schemas
    from tracesql.version import __version__

    out = ["# JSON output\n",
           f"What `-f json` writes, for programs, as [JSON Schema](https://json-schema.org) (draft 2020-12), for "
           f"tracesql {__version__}. The shapes are versioned with the package: each schema's `$id` names the "
           "version, and a shape changes (a column added to a query, a field to `info`) only with a new version. "
           "Values are raw: times integer nanoseconds, sizes bytes (the column names say the unit, see "
           "[units](../concepts/units.md)); NULL and NaN are `null`. A curated query's rows are its declared "
           "columns, so its schema is its [reference page](queries/index.md)'s column table. The MCP server's "
           "tools answer with the same rows, as lists under their `columns` ([agents](../guides/agents.md)).\n"]
    for command, found in json_schemas.commands().items():
        out.append(f"## `{command} -f json`\n")
        out.append(f"```json\n{json.dumps(found, indent=2, ensure_ascii=False)}\n```\n")
    return "\n".join(out)


_LINK = re.compile(r"\[([^\]]+)\]\(([^)]+)\)")


def _unlink_repo_paths(text: str) -> str:
    """Links to files of the repository (outside the site) become code: the site cannot link to them."""
    def fix(m):
        target = m[2]
        if re.match(r"^[a-z]+://|^#|^mailto:", target):
            return m[0]
        return m[1] if m[1].startswith("`") else f"`{m[1]}`"

    return _LINK.sub(fix, text)


def datasets_page() -> str:
    text = (REPO / "datasets" / "README.md").read_text()
    text = re.sub(r"^# .*\n", "# Datasets\n\nFrom `datasets/README.md`.\n", text, count=1)
    return _unlink_repo_paths(text)


def generate() -> dict[str, str]:
    """Every generated page: path under docs/ -> Markdown."""
    from tracesql import queries

    pages = {
        "reference/queries/index.md": queries_index(),
        "reference/tables.md": tables_page(),
        "reference/functions.md": functions_page(),
        "reference/cli.md": cli_page(),
        "reference/json.md": json_page(),
        "reference/datasets.md": datasets_page(),
        "reference/findings.md": findings_page(),
    }
    with Workdir() as work:
        for q in queries.catalogue():
            pages[f"reference/queries/{q.name}.md"] = query_page(q, work)
    return pages


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    for rel, text in generate().items():
        (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (out_dir / rel).write_text(text)
        print(out_dir / rel)
