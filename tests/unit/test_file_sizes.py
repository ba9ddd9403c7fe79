"""No hand-written Python file under tandem/, scripts/ or bench/ is over 400 counted lines
(scripts/count_lines.py: non-blank, not a ``#`` comment, docstrings included); generated
protobuf modules are left out."""

from __future__ import annotations

from pathlib import Path

from scripts.count_lines import LIMIT, counted_lines, over_limit


def test_no_file_is_over_the_limit() -> None:
    found = over_limit()
    listing = "\n".join(f"  {path}: {n} counted lines" for path, n in found)
    assert not found, f"over {LIMIT} counted lines (split each by concept):\n{listing}"


def test_blank_lines_and_comments_do_not_count_docstrings_do() -> None:
    text = '"""A docstring\n\n    on two lines."""\n\n# a comment\n    # indented\nx = 1  # kept\n'
    assert counted_lines(text) == 3


def test_a_file_one_line_over_is_named_and_generated_protobufs_are_not(tmp_path: Path) -> None:
    body = "x = 1\n" * 401
    for rel in ("tandem/big.py", "bench/ok.py", "tandem/protos/v1/worker_pb2_grpc.py",
                "scripts/edge.py"):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body if rel != "bench/ok.py" else "# c\n\n" * 500 + "x = 1\n" * 400)
    (tmp_path / "scripts/edge.py").write_text("x = 1\n" * 400)
    assert over_limit(tmp_path) == [("tandem/big.py", 401)]
