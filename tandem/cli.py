"""The ``tandem`` command. Serving subcommands arrive with the router and workers; today it
runs the engine offline (``tandem offline --prompt ...``, the same as ``python -m engine``)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``tandem <command> ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: tandem offline --prompt TEXT [--model smollm2] [--max-tokens N] ...")
        print("  offline   generate with the local engine (no router, no workers)")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "offline":
        from engine.__main__ import main as offline_main

        return offline_main(rest)
    print(f"tandem: unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
