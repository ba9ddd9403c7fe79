"""Which Python files are over the house limit of 400 counted lines (run from the repo root).

    python -m scripts.count_lines            prints each file over the limit; exit 1 if any

A counted line is a non-blank line that is not a ``#`` comment: docstrings count (they are
part of what a reader reads), blank lines and comment-only lines do not. The limit keeps one
concept to a file (docs/design.md section 1, "Small files"); a file over it is split by
concept. The trees checked are the product and the lab's code (tandem/, scripts/, bench/);
generated protobuf modules (tandem/protos/**/*_pb2*.py) are not written by hand and are
left out.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 400
TREES = ("tandem", "scripts", "bench")


def counted_lines(text: str) -> int:
    """Non-blank lines of ``text`` that are not ``#`` comments (docstrings included)."""
    return sum(1 for line in text.splitlines()
               if (stripped := line.strip()) and not stripped.startswith("#"))


def _generated(path: Path, root: Path) -> bool:
    """A protobuf module protoc wrote (scripts/gen_protos.py)."""
    rel = path.relative_to(root)
    return rel.parts[:2] == ("tandem", "protos") and "_pb2" in path.name


def over_limit(root: Path = ROOT, limit: int = LIMIT) -> list[tuple[str, int]]:
    """``(path relative to root, counted lines)`` of every hand-written ``.py`` file under
    ``root``'s TREES with more than ``limit`` counted lines, sorted by path."""
    found = []
    for tree in TREES:
        for path in sorted((root / tree).rglob("*.py")):
            if _generated(path, root):
                continue
            n = counted_lines(path.read_text(encoding="utf-8"))
            if n > limit:
                found.append((path.relative_to(root).as_posix(), n))
    return sorted(found)


def main() -> int:
    """Print the files over the limit (``PATH COUNT``); 1 if there are any."""
    found = over_limit()
    for path, n in found:
        print(f"{path} {n}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
