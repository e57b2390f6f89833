"""Regenerate fedcore/proto/*_pb2.py, *_pb2.pyi and *_pb2_grpc.py from protos/.

Usage: ``python scripts/gen_protos.py [--out DIR]`` (default: the repository root, which
writes into fedcore/proto/). CI runs it into a temporary folder and fails if the result
differs from the committed files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTOS = ROOT / "protos"


def main(argv: list[str] | None = None) -> int:
    """Run protoc over every .proto under protos/."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT, help="output root (default: repo)")
    args = parser.parse_args(argv)
    sources = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    out = str(args.out)
    (args.out / "fedcore" / "proto").mkdir(parents=True, exist_ok=True)
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTOS}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            *sources,
        ]
    )
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
