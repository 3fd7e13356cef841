"""The import graph of tracesql runs one way (issue 17): readers -> normalize -> store -> engines -> queries ->
plug-ins (Spark) -> outputs, with no circles and no module reaching into another's private names.

The graph is read from the source with `ast` (every import, also those inside functions: a lazy import still ties
two modules together), so the tests need nothing installed and see what a reader of the code sees.
docs/concepts/architecture.md draws the same layers; a test keeps the drawing and LAYERS in step.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "tracesql"
ARCHITECTURE_DOC = REPO / "docs" / "concepts" / "architecture.md"

#: Bottom to top. A module imports modules of its own layer or of layers below it, never above. `x.*` stands for
#: every module of the package x.
LAYERS = {
    "foundation": ["version", "errors", "limits", "arrays", "db", "schema", "functions", "longest_path", "critical_path"],
    "readers": ["archives", "readers", "readers.*"],
    "normalize": ["quality", "step_rules", "labels", "normalize"],
    "store": ["store", "views", "ingestion"],
    "engines": ["engine"],
    "queries": ["queries", "findings", "steady"],
    "plug-ins": ["transpile", "spark"],
    "outputs": ["output", "json_schemas", "info", "export", "report", "report.*", "api"],
    "front": ["cli", "mcp_server", "__main__", "tracesql"],
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(tracesql module imported, name taken from it or None) for one import statement."""
    mods = modules()
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names if a.name.split(".")[0] == "tracesql"]
    package = module.split(".") if modules()[module].name == "__init__.py" else module.split(".")[:-1]
    if node.level:
        base = package[: len(package) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != "tracesql":
        return []
    found = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        found.append((sub, None) if sub in mods else (target, alias.name))
    return found


def _known(name: str) -> str:
    """The module `name` is, or the package it is an attribute of."""
    while name not in modules() and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


@cache
def imports() -> dict[str, dict[str, list[int]]]:
    """module -> {module it imports: [line numbers]} (any import anywhere in the file)."""
    graph = {}
    for module, path in modules().items():
        edges: dict[str, list[int]] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, _ in _targets(module, node):
                    target = _known(target)
                    if target != module:
                        edges.setdefault(target, []).append(node.lineno)
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, dict]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = iter(range(10**9))

    def visit(v):
        index[v] = low[v] = next(counter)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> str | None:
    short = module.removeprefix("tracesql.") if module != "tracesql" else "tracesql"
    for layer, members in LAYERS.items():
        for member in members:
            if short == member or (member.endswith(".*") and short.startswith(member[:-1])):
                return layer
    return None


def test_graph_is_read():  # the walk finds the modules and edges everyone knows are there
    graph = imports()
    assert {"tracesql", "tracesql.cli", "tracesql.engine", "tracesql.readers.kineto"} <= set(graph)
    assert "tracesql.engine" in graph["tracesql.cli"] and "tracesql.schema" in graph["tracesql.store"]
    assert "tracesql.ingestion" in graph["tracesql.engine"]  # an import inside a function counts too


def test_cycle_finder_finds_cycles():
    assert _cycles({"a": {"b": [1]}, "b": {"c": [1]}, "c": {"a": [1]}, "d": {"a": [1]}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b": [1]}, "b": {}}) == []


def test_no_import_cycles():
    graph = imports()
    problems = []
    for component in _cycles(graph):
        edges = [f"{a} -> {b} (line {graph[a][b][0]})" for a in component for b in graph[a] if b in component]
        problems.append(f"{', '.join(component)}: " + "; ".join(edges))
    assert not problems, "import cycles:\n" + "\n".join(problems)


def test_every_module_has_a_layer():
    assert [m for m in modules() if layer_of(m) is None] == [], "add new modules to LAYERS (and the drawing)"


def test_layers_point_down():
    order = [None] + list(LAYERS)  # (a module without a layer: test_every_module_has_a_layer says so)
    wrong = [f"{m} ({layer_of(m)}) imports {t} ({layer_of(t)}) on line {lines[0]}"
             for m, edges in imports().items() for t, lines in edges.items()
             if order.index(layer_of(t)) > order.index(layer_of(m))]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_no_private_names_of_other_modules():
    """Neither `from tracesql.x import _y` nor `x._y` on an imported tracesql module `x`, from another module."""
    wrong = []
    for module, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}  # local name -> tracesql module
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target, name in _targets(module, node):
                    if name is not None and name.startswith("_") and not name.startswith("__") and target != module:
                        wrong.append(f"{module}:{node.lineno} imports {name} from {target}")
                for alias, (target, name) in zip(node.names, _targets(module, node)):
                    if name is None and target in modules() and target != module:
                        aliases[alias.asname or alias.name.split(".")[-1]] = target
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                wrong.append(f"{module}:{node.lineno} uses {aliases[node.value.id]}.{node.attr}")
    assert not wrong, "private names used from other modules:\n" + "\n".join(wrong)


def test_readers_use_common_not_their_package():
    """Reader modules take their shared helpers from readers.common: the package imports them, so importing it
    back would be a circle."""
    graph = imports()
    wrong = [m for m in graph if m.startswith("tracesql.readers.") and "tracesql.readers" in graph[m]]
    assert wrong == []


@pytest.mark.parametrize("module, forbidden", [
    ("tracesql.ingestion", ("tracesql.engine", "tracesql.spark", "tracesql.queries", "tracesql.api")),
    ("tracesql.queries", ("tracesql.engine", "tracesql.spark", "tracesql.api", "tracesql.output")),
    ("tracesql.normalize", ("tracesql.store", "tracesql.ingestion", "tracesql.engine")),
    ("tracesql.engine", ("tracesql.spark", "tracesql.queries", "tracesql.cli")),
])
def test_engines_stand_alone(module, forbidden):
    assert set(imports()[module]) & set(forbidden) == set()


def test_spark_is_a_plug_in():
    """Only the front (api, cli) knows Spark: the DuckDB path works without pyspark installed."""
    users = sorted(m for m, edges in imports().items() if "tracesql.spark" in edges)
    assert set(users) <= {"tracesql.api", "tracesql.cli"}, users


def _fresh_modules(code: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                          capture_output=True, text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""},
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


HEAVY = {"duckdb", "pyarrow", "pandas", "numpy", "rich", "pyspark", "sqlglot"}


def test_import_tracesql_is_light():
    loaded = _fresh_modules("import tracesql; tracesql.__version__")
    assert loaded & HEAVY == set()
    assert "tracesql.engine" not in loaded


def test_public_api_is_lazy_and_complete():
    import tracesql
    from tracesql import api, engine, errors

    assert tracesql.connect is engine.connect and tracesql.query is api.query and tracesql.ingest is api.ingest
    assert tracesql.TraceError is errors.TraceError
    assert set(tracesql.__all__) <= set(dir(tracesql))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        tracesql.nothing  # noqa: B018


LAYER_IDS = {layer: re.sub(r"\W", "_", layer) for layer in LAYERS}


def drawing() -> str:
    """The mermaid drawing of LAYERS: a box per layer listing its modules, and an arrow from a layer to each layer
    above the foundation that its modules import (every layer uses the foundation: those arrows are left out)."""
    lines = ["flowchart BT"]
    for layer, members in LAYERS.items():
        lines += [f'  subgraph {LAYER_IDS[layer]}["{layer}"]', f'    {LAYER_IDS[layer]}_m["{", ".join(members)}"]', "  end"]
    order = list(LAYERS)
    pairs = {(layer_of(m), layer_of(t)) for m, edges in imports().items() for t in edges} & \
        {(a, b) for a in LAYERS for b in LAYERS}
    for a, b in sorted(pairs, key=lambda p: (order.index(p[0]), -order.index(p[1]))):
        if a != b and b != "foundation":
            lines.append(f"  {LAYER_IDS[b]} --> {LAYER_IDS[a]}")
    return "\n".join(lines) + "\n"


def test_architecture_drawing_matches_the_code():
    """docs/concepts/architecture.md draws exactly LAYERS and the imports between them (arrows point from what
    is used to its user). After changing either, paste the text this test prints."""
    block = re.search(r"```mermaid\n(.*?)```", ARCHITECTURE_DOC.read_text(), re.S)
    assert block, f"{ARCHITECTURE_DOC} has no mermaid drawing"
    assert block[1] == drawing(), "the drawing differs from the code; it should read:\n" + drawing()
