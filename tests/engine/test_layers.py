"""The engine's shape: pure (no web or cluster libraries) and layered without import cycles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "app" / "engine"
MODULES = sorted(p.stem for p in ENGINE.glob("*.py") if p.stem != "__init__")
FORBIDDEN = (
    "flask",
    "gunicorn",
    "kubernetes",
    "urllib3",
    "app.source",
    "app.webhook",
    "app.compiled",
    "app.cli",
)
# Pipelines combine rule sets; a rule set never imports a pipeline.
PIPELINES = {"decide", "authorize"}


def _imports(module: str) -> set[str]:
    tree = ast.parse((ENGINE / f"{module}.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def _engine_deps(module: str) -> set[str]:
    prefix = "app.engine."
    return {name[len(prefix) :] for name in _imports(module) if name.startswith(prefix)}


@pytest.mark.parametrize("module", MODULES)
def test_engine_module_is_pure(module: str) -> None:
    bad = [
        name
        for name in _imports(module)
        if name.split(".")[0] in FORBIDDEN or name.startswith(FORBIDDEN)
    ]
    assert bad == [], f"app/engine/{module}.py imports {bad}"


def test_rule_sets_do_not_import_pipelines() -> None:
    offenders = {m: _engine_deps(m) & PIPELINES for m in MODULES if m not in PIPELINES}
    assert {m: deps for m, deps in offenders.items() if deps} == {}


def test_engine_imports_form_no_cycle() -> None:
    graph = {m: _engine_deps(m) for m in MODULES}
    visiting: set[str] = set()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in visiting, f"import cycle: {' -> '.join((*path, module))}"
        if module in done:
            return
        visiting.add(module)
        for dep in graph.get(module, ()):
            visit(dep, (*path, module))
        visiting.discard(module)
        done.add(module)

    for module in MODULES:
        visit(module, ())
