"""The package layout is the architecture: each layer imports only from the layers below it,
no module imports itself back through a circle, and modules stay small enough to read.

Imports under `if TYPE_CHECKING:` are annotations only (the controller contract names the app's
Options type that way) and are not counted as dependencies."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[2]
MAX_MODULE_LINES = 450
# Lower layers first; a module may import from its own layer and those below.
LAYERS = {
    "pykcm.util": 0,
    "pykcm.client": 1,
    "pykcm.testenv": 2,
    "pykcm.informers": 2,
    "pykcm.workqueue": 2,
    "pykcm.controller": 3,
    "pykcm.controllers": 4,
    "pykcm.serving": 4,
    "pykcm.app": 5,
}


def _modules() -> dict[str, Path]:
    found = {}
    for top, name in ((ROOT / "pykcm", "pykcm"), (ROOT / "controllers", "pykcm.controllers")):
        for path in top.rglob("*.py"):
            parts = path.relative_to(top).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((name, *parts))] = path
    return found


def _imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Project modules imported by `module` (a `from package import submodule` names the submodule)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = set()
    tree = ast.parse(path.read_text())
    type_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                targets.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {t for t in targets if t in known and t != module}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {module: _imports(module, path, known) for module, path in known.items()}


def _layer(module: str) -> tuple[str, int] | None:
    for prefix, rank in sorted(LAYERS.items(), key=lambda item: -len(item[0])):
        if module == prefix or module.startswith(prefix + "."):
            return prefix, rank
    return None


def test_no_import_circles() -> None:
    graph = _graph()
    state: dict[str, int] = {}  # 1 visiting, 2 done
    circles: list[list[str]] = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                circles.append([*trail[trail.index(target) :], target])
            elif target not in state:
                visit(target, [*trail, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_layers_import_only_downwards() -> None:
    upward = []
    for module, targets in _graph().items():
        here = _layer(module)
        for target in targets:
            there = _layer(target)
            if here and there and there[0] != here[0] and there[1] >= here[1]:
                upward.append(f"{module} -> {target}")
    assert sorted(upward) == []


def test_modules_stay_readable() -> None:
    long = {m: n for m, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}
