"""No import cycles in the repository (the module graph of app, bench, tests and scripts), and
the application's packages importing one way only, downwards through ``LAYERS``.

The graph is read from the source with ``ast``, so nothing is imported to build it. Every import
statement counts: at module level, inside a function (it runs later, but it is the same
dependency) and under ``if TYPE_CHECKING:`` (a type is a dependency of the design too). An edge
goes to the most specific module of the repository an import names: ``from app.engine import
rbac`` depends on ``app.engine.rbac``, ``from app.engine.rbac import Snapshot`` on
``app.engine.rbac``; in a directory that is no package (scripts run as files), a plain
``import helper`` names the sibling ``helper.py``. Imports of anything outside the repository
are left out.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from tests.support import ROOT

PACKAGES = ("app", "bench", "tests", "scripts")
# The application's packages from the bottom up, by rank: a module imports its own package and
# those of a lower rank, never one above it or beside it (the webhook, the compiled path and the
# reporter are three processes over the same engine and source, and know nothing of each other).
Layer = tuple[int, str, tuple[str, ...]]  # rank, name, the modules and packages it holds
LAYERS: tuple[Layer, ...] = (
    (0, "engine", ("app.engine",)),
    (1, "shared", ("app", "app.settings", "app.logs", "app.deepjson")),
    (2, "source", ("app.source",)),
    (3, "webhook", ("app.webhook",)),
    (3, "compiled", ("app.compiled",)),
    # The background audit's reports: a controller of their own (its leader lease is the
    # source's, as the compiler's is), beside the other two processes, read by the command line.
    (3, "reports", ("app.reports",)),
    (4, "cli", ("app.cli", "app.__main__")),
)

Graph = Mapping[str, Iterable[str]]


def module_name(path: Path, root: Path) -> str:
    """``app/engine/rbac.py`` → ``app.engine.rbac``; a package's ``__init__.py`` → the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _known(name: str, modules: set[str]) -> str | None:
    """The longest prefix of the dotted ``name`` that is a module of the repository."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement in ``module`` may load."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return [f"{base}.{alias.name}" for alias in node.names]


def module_graph(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, set[str]]:
    """Every module under ``root/<package>`` and the repository's modules it imports."""
    paths = {
        module_name(path, root): path
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
        if ".venv" not in path.parts
    }
    modules = set(paths)
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        # A directory that is no package holds scripts: run as files, their directory is on
        # sys.path, so ``import helper`` there loads the sibling ``helper.py``.
        script_dir = None if (path.parent / "__init__.py").exists() else module.rpartition(".")[0]
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for name in _imported(node, module, is_package):
                    target = _known(name, modules)
                    if target is None and script_dir and not getattr(node, "level", 0):
                        target = _known(f"{script_dir}.{name}", modules)
                    if target is not None:
                        edges.add(target)
        graph[module] = edges
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle per strongly connected component that has one, as ``[a, b, ..., a]``.

    Tarjan's algorithm finds the components; within each, the shortest way back from its first
    module (in sorted order) to itself names the cycle.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    found = []
    for component in components:
        start = min(component)
        if len(component) == 1 and start not in graph.get(start, ()):
            continue
        found.append(_shortest_cycle(graph, start, component))
    return sorted(found)


def _shortest_cycle(graph: Graph, start: str, component: set[str]) -> list[str]:
    """Breadth first from ``start`` inside ``component`` until an edge leads back to it."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [*reversed(path), start]
                if nxt in component and nxt not in came_from:
                    came_from[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{start} is in no cycle")  # a component of one without a self-loop


def layer_of(module: str, layers: Iterable[Layer] = LAYERS) -> tuple[int, str] | None:
    """(rank, name) of the layer whose module or package ``module`` is, by its longest match."""
    found = None
    longest = -1
    for rank, name, roots in layers:
        for root in roots:
            inside = module == root or (root != "app" and module.startswith(f"{root}."))
            if inside and len(root) > longest:
                found, longest = (rank, name), len(root)
    return found


def upward_imports(graph: Graph, layers: Iterable[Layer] = LAYERS) -> list[str]:
    """Each import of a module in a layer above the importer's, or in another layer of its rank."""
    layers = tuple(layers)
    found = []
    for module in sorted(graph):
        own = layer_of(module, layers)
        for target in sorted(graph[module]):
            theirs = layer_of(target, layers)
            if own is None or theirs is None or own[1] == theirs[1] or theirs[0] < own[0]:
                continue
            found.append(f"{module} ({own[1]}) imports {target} ({theirs[1]})")
    return found


def test_every_application_module_has_a_layer() -> None:
    graph = module_graph(ROOT, ["app"])
    assert [module for module in sorted(graph) if layer_of(module) is None] == []
    # and every layer holds a module: a renamed package cannot leave its layer empty unnoticed
    assert {found[1] for module in graph if (found := layer_of(module))} == {
        name for _, name, _ in LAYERS
    }


def test_the_application_imports_downwards_only() -> None:
    found = upward_imports(module_graph(ROOT, ["app"]))
    assert not found, "imports against the layers:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("edge", "expected"),
    [
        pytest.param(("app.cli.check", "app.webhook.wire"), [], id="cli-over-webhook"),
        pytest.param(("app.webhook.serve", "app.source.cluster"), [], id="webhook-over-source"),
        pytest.param(("app.compiled.compiler", "app.settings"), [], id="compiled-over-shared"),
        pytest.param(("app.source.api", "app"), [], id="source-over-the-package-root"),
        pytest.param(("app.engine.decide", "app.engine.rbac"), [], id="within-a-layer"),
        pytest.param(
            ("app.engine.rbac", "app.settings"),
            ["app.engine.rbac (engine) imports app.settings (shared)"],
            id="engine-up-to-shared",
        ),
        pytest.param(
            ("app.source.cluster", "app.webhook.metrics"),
            ["app.source.cluster (source) imports app.webhook.metrics (webhook)"],
            id="source-up-to-webhook",
        ),
        pytest.param(
            ("app.compiled.registration", "app.webhook.wire"),
            ["app.compiled.registration (compiled) imports app.webhook.wire (webhook)"],
            id="compiled-beside-webhook",
        ),
        pytest.param(
            ("app.webhook.serve", "app.cli.inputs"),
            ["app.webhook.serve (webhook) imports app.cli.inputs (cli)"],
            id="webhook-up-to-cli",
        ),
        pytest.param(
            ("app", "app.__main__"), ["app (shared) imports app.__main__ (cli)"], id="root-up"
        ),
    ],
)
def test_the_layer_check_names_each_upward_import(
    edge: tuple[str, str], expected: list[str]
) -> None:
    source, target = edge
    assert upward_imports({source: {target}, target: set()}) == expected


def test_the_repository_has_no_import_cycle() -> None:
    graph = module_graph(ROOT)
    # The graph covers the whole repository, benchmarks included, and their lazy imports.
    assert {"app.engine.decide", "bench.__main__", "tests.support"} <= set(graph)
    assert "tests.kubeapi" in graph["bench.core.apiserver"]
    assert "bench.http_churn" in graph["bench.http"]  # imported inside a function
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(" → ".join(cycle) for cycle in found)


def test_the_benchmarks_import_the_core_and_no_other_benchmark() -> None:
    graph = module_graph(ROOT, ["bench"])
    core = {module for module in graph if module.startswith("bench.core")}
    benchmarks = set(graph) - core - {"bench", "bench.__main__"}
    assert {"bench.engine", "bench.http", "bench.scale", "bench.soak"} <= benchmarks
    for module in core:
        assert graph[module] <= core, module
    for module in benchmarks:
        extends = {"bench.http_churn"} if module == "bench.http" else set()  # http --churn
        assert graph[module] & benchmarks == extends, module


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        pytest.param({"a": {"b"}, "b": {"c"}, "c": set()}, [], id="a-chain"),
        pytest.param({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}, [], id="a-diamond"),
        pytest.param({"a": {"a"}}, [["a", "a"]], id="self-import"),
        pytest.param({"a": {"b"}, "b": {"a"}}, [["a", "b", "a"]], id="two-modules"),
        pytest.param(
            {"x": {"b"}, "b": {"c"}, "c": {"d"}, "d": {"b", "e"}, "e": set()},
            [["b", "c", "d", "b"]],
            id="three-modules-behind-a-tail",
        ),
        pytest.param(
            {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}},
            [["a", "b", "a"], ["c", "d", "c"]],
            id="two-separate-cycles",
        ),
        pytest.param(
            {"a": {"b", "z"}, "b": {"c"}, "c": {"d"}, "d": {"a"}, "z": {"a"}},
            [["a", "z", "a"]],
            id="the-shortest-of-a-component",
        ),
    ],
)
def test_the_cycle_finder_names_each_cycle(graph: Graph, expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


def test_a_cycle_through_a_function_level_relative_import_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .leaf import value\n")
    (package / "sub" / "leaf.py").write_text("from ..d import value\n")
    (package / "d.py").write_text("value = 1\n")
    (package / "a.py").write_text("def later():\n    from . import b\n    return b\n")
    (package / "b.py").write_text("from pkg.c import thing\nimport json\n")
    (package / "c.py").write_text("import pkg.a\nfrom .sub import value\nthing = 1\n")
    graph = module_graph(tmp_path, ["pkg"])
    assert graph == {
        "pkg": set(),
        "pkg.sub": {"pkg.sub.leaf"},
        "pkg.sub.leaf": {"pkg.d"},
        "pkg.d": set(),
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.c"},
        "pkg.c": {"pkg.a", "pkg.sub"},
    }
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_scripts_importing_each_other_as_files_make_a_cycle(tmp_path: Path) -> None:
    # Not a package: each script runs as a file, with its own directory on sys.path.
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "load.py").write_text("from report import table\nimport json\n")
    (tmp_path / "tools" / "report.py").write_text("def table():\n    import load\n")
    graph = module_graph(tmp_path, ["tools"])
    assert graph == {"tools.load": {"tools.report"}, "tools.report": {"tools.load"}}
    assert cycles(graph) == [["tools.load", "tools.report", "tools.load"]]
