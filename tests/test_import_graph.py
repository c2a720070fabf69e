"""The packages' import graph: no cycles, and the direction sage_env <- agents <- sage_trl.

Every import statement counts, wherever it stands: at the top, inside a function (a lazy import is still a
dependency) and behind ``if TYPE_CHECKING``. ``from package import name`` counts as an import of the module that
defines ``name`` (a package's ``__init__`` re-exports names; importing one from it is an import of its home).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sage_env", "agents", "sage_trl")
LAYER = {package: index for index, package in enumerate(PACKAGES)}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def _home(module: str, name: str) -> str:
    """The module ``from module import name`` depends on: the submodule ``name``, or where ``name`` is defined."""
    if f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    value = getattr(importlib.import_module(module), name, None)
    owner = getattr(value, "__module__", None)
    return owner if isinstance(owner, str) and owner in MODULES else module


def _imports(module: str, source: str | None = None) -> set[str]:
    """The project modules ``module`` imports (its file, or ``source`` when given)."""
    targets: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text() if source is None else source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in MODULES:
            targets.update(_home(node.module, alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names if alias.name in MODULES)
    return targets - {module}


def _graph() -> dict[str, set[str]]:
    return {module: {target for target in _imports(module) if target in MODULES} for module in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
            elif successor not in index:
                index[successor] = low[successor] = len(index)
                stack.append(successor)
                on_stack.add(successor)
                work.append((successor, iter(sorted(graph[successor]))))
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
    return components


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_there_is_no_import_cycle() -> None:
    graph = _graph()
    described = [
        " -> ".join(component)
        + "\n"
        + "\n".join(f"    {m} imports {sorted(graph[m] & set(component))}" for m in component)
        for component in _cycles(graph)
    ]
    assert not described, "import cycles:\n" + "\n".join(described)


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_down_the_layers(package: str) -> None:
    upward = {
        (module, target)
        for module, targets in _graph().items()
        if module.split(".")[0] == package
        for target in targets
        if LAYER[target.split(".")[0]] > LAYER[package]
    }
    assert not upward, (
        f"{package} must not import a package above it ({' <- '.join(PACKAGES)}): {sorted(upward)}"
    )


def test_lazy_and_type_checking_imports_count() -> None:
    """The graph sees an import behind ``if TYPE_CHECKING`` (the checkpoint circle once hid there) and one inside a
    function, and resolves a re-exported name to its home module."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from sage_trl.trainer import SageGRPOTrainer\n"
        "def later():\n    import sage_trl.hub\n"
        "from sage_env import DenoisingVectorEnv\n"
    )
    assert _imports("sage_trl.checkpoints", source) == {
        "sage_trl.trainer",
        "sage_trl.hub",
        "sage_env.env.vector",
    }
