"""Regenerate the Python modules for tandem/protos/v1/*.proto (run from the repo root).

Generated modules import each other by the .proto path (``tandem.protos.v1...``), so they are
compiled from the repository root (the include path is the root, where ``tandem/`` lives).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = sorted((ROOT / "tandem" / "protos" / "v1").glob("*.proto"))


def generate(out_dir: Path) -> None:
    """Compile every proto into ``out_dir`` (which mirrors the repository root)."""
    from grpc_tools import protoc  # dev dependency

    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(ROOT)) for p in PROTOS],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(ROOT)
    sys.exit(0)
