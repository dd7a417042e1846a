"""pikku_django's modules import each other without a cycle, and in layers."""

from __future__ import annotations

import ast
from pathlib import Path

import pikku_django

ROOT = Path(pikku_django.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The pikku_django modules ``module`` imports anywhere in its text (functions and
    ``TYPE_CHECKING`` blocks too): for ``from a import b``, ``a.b`` when it is a module,
    else ``a``."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        for target in targets:
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            name = ".".join(parts)
            if name and name != module:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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


def test_the_graph_is_read_from_every_module() -> None:
    graph = _graph()
    assert "pikku_django.workflows.engine" in graph
    assert "pikku_django.workflows.store" in graph["pikku_django.workflows.engine"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_of_pikku_django_imports_itself_through_others() -> None:
    cycles = _cycles(_graph())
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_workflow_package_imports_nothing_from_webhooks() -> None:
    graph = _graph()
    offending = {
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("pikku_django.workflows")
        for target in targets
        if target.startswith("pikku_django.webhooks")
    }
    assert not offending, sorted(offending)


def test_only_the_workflow_package_writes_run_rows() -> None:
    """Run rows are created by the workflow package: others hand it inputs."""
    writers = []
    for name, path in _modules().items():
        if name.startswith("pikku_django.workflows"):
            continue
        text = path.read_text(encoding="utf-8")
        if "INSERT INTO" in text and "WorkflowRun" in text:
            writers.append(name)
        if "WorkflowRun.objects" in text and ".create(" in text:
            writers.append(name)
    assert writers == []
