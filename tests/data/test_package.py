"""The shape of fedcore/data/: no import circle inside the package (function-level imports
included), and the stand-in files come from the registry's list, each dataset's writer in
the module of its loader."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from fedcore import registry
from fedcore.data.standin import STANDINS

PKG = Path(__file__).resolve().parents[2] / "fedcore" / "data"


def _imports_within(path: Path) -> set[str]:
    """The ``fedcore.data`` modules ``path`` imports (by module name, no package prefix)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            inside = parts[:2] == ["fedcore", "data"] and len(parts) > 2
            if inside and (PKG / f"{parts[2]}.py").is_file():
                found.add(parts[2])
    return found


def test_no_import_circle_inside_the_package() -> None:
    graph = {p.stem: _imports_within(p) for p in PKG.glob("*.py") if p.stem != "__init__"}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module in done:
            return
        for target in graph[module]:
            visit(target, (*path, module))
        done.add(module)

    for module in graph:
        visit(module, ())


def test_the_standins_are_the_registrys_datasets_read_from_files() -> None:
    assert registry.DATASETS.tagged("files") == STANDINS
    for name in STANDINS:
        module, _, attribute = registry.DATASETS.entry(name).target.partition(":")
        loaded = importlib.import_module(module)
        assert callable(getattr(loaded, attribute)), name
        assert callable(getattr(loaded, "standin", None)), f"{module} has no stand-in writer"
