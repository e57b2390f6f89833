"""The layering of DESIGN.md, enforced: dependencies point down only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "fedcore"

# Layer of each module (by its path under fedcore/); lower numbers sit lower.
LAYERS = {
    "errors": 0,
    "messages": 0,
    "config": 0,
    "ids": 0,
    "certs": 1,
    "lazy": 0,
    "runtime": 0,
    "counter_random": 0,
    "registry": 0,
    "family": 0,
    "faults": 1,
    "timing": 1,
    "topology": 1,
    "data": 1,
    "streams": 1,
    "models": 1,
    "architectures": 1,
    "gradients": 1,
    "stacked_training": 1,
    "evaluation": 1,
    "metrics": 1,
    "progress": 1,
    "compression": 2,
    "algorithms": 2,
    "adversary": 2,
    "privacy": 2,
    "transport": 3,
    "node": 4,
    "plotting": 5,
    "setup": 5,
    "engines": 6,
    "simulation": 7,
    "deploy": 8,
    "testing": 8,
    "api": 8,
    "cli": 9,
    "__main__": 9,
    "__init__": 0,
}

# Imports that each lower layer must never make, whatever it is.
SANS_IO = {"asyncio", "grpc", "socket"}


def _modules() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "proto" not in p.relative_to(PKG).parts)


def _layer(path: Path) -> tuple[str, int]:
    top = path.relative_to(PKG).parts[0].removesuffix(".py")
    return top, LAYERS[top]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PKG)))
def test_imports_point_down(path: Path) -> None:
    top, layer = _layer(path)
    for name in _imports(path):
        parts = name.split(".")
        if parts[:2] == ["fedcore", "proto"] or parts[0] == "grpc" or parts[0] == "grpc_health":
            assert path.relative_to(PKG).parts[:2] == ("transport", "grpc"), (
                f"only fedcore/transport/grpc may import {name}, not {path.relative_to(PKG)}"
            )
            continue
        if parts[0] == "fedcore" and len(parts) > 1:
            target = parts[1]
            assert LAYERS[target] <= layer or target == top, (
                f"{path.relative_to(PKG)} (layer {top}) imports fedcore.{target}, a higher layer"
            )


@pytest.mark.parametrize(
    "path",
    [p for p in _modules() if _layer(p)[1] <= 2],
    ids=lambda p: str(p.relative_to(PKG)),
)
def test_math_layers_are_sans_io(path: Path) -> None:
    """Algorithms, compression, topology, data and models know no event loop or socket."""
    bad = {n for n in _imports(path) if n.split(".")[0] in SANS_IO}
    assert not bad, f"{path.relative_to(PKG)} imports {sorted(bad)}"


PICKLE_FILE = PKG / "data" / "cifar.py"
"""The only module that touches pickle: CIFAR's python release is pickled. fedcore.data.cifar
reads it through an unpickler that builds arrays only, and writes stand-in files of it."""


def test_no_pickle_anywhere() -> None:
    """Nothing on the wire, in checkpoints or in configs is a pickle; the CIFAR files alone."""
    for path in _modules():
        if path == PICKLE_FILE:
            continue
        assert not {n for n in _imports(path) if n.split(".")[0] == "pickle"}, path


def test_the_cifar_reader_loads_pickles_only_through_its_unpickler() -> None:
    text = PICKLE_FILE.read_text(encoding="utf-8")
    assert "pickle.load" not in text  # neither pickle.load( nor pickle.loads(
    assert "_ArraysOnly(f, " in text and "def find_class" in text
    assert text.count("pickle.dump(") == 1  # the stand-in writer's


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the fedcore modules it imports (anywhere in it, as the layering test reads
    them). ``from P import a`` imports module ``P.a`` where there is one, and ``P`` itself
    for a name that is not a module; a parent package that Python runs on the way to a
    module is no edge (every module would import ``fedcore``)."""
    paths = {_module_name(p): p for p in _modules()}

    def module_of(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(module_of(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in paths else module_of(base))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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
                    found.append(sorted(component))
    return found


def test_the_circle_finder_finds_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}, "f": set()}
    assert sorted(_circles(graph)) == [["a", "b", "c"], ["d", "e"]]


def test_no_import_circles() -> None:
    """No fedcore module imports, directly or through others, a module that imports it."""
    circles = _circles(_import_graph())
    assert not circles, "import circles among fedcore modules: " + "; ".join(
        " <-> ".join(c) for c in circles
    )


LONG_MODULE = 600
"""Lines past which a module is long: a sign that it holds two jobs."""


def test_at_most_three_long_modules() -> None:
    """A newcomer reads a module whole: at most three (the vectorized engine and its batched
    adapter today) run past 600 lines; generated protobuf code does not count."""
    long = sorted(
        (len(p.read_text(encoding="utf-8").splitlines()), str(p.relative_to(PKG)))
        for p in PKG.rglob("*.py")
        if "proto" not in p.relative_to(PKG).parts
    )
    over = [(lines, name) for lines, name in long if lines > LONG_MODULE]
    assert len(over) <= 3, f"modules over {LONG_MODULE} lines: {over}; split one along a seam"
