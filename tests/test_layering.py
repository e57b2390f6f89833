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
