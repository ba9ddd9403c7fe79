"""``python -m engine.native``: build the native kernels now (``make install`` runs it)."""

from __future__ import annotations

import sys

from engine.native.build import build, cpu_supported


def main() -> int:
    if not cpu_supported():
        print("[tandem] native kernels skipped: this CPU lacks AVX2/FMA/F16C (torch path used)")
        return 0
    try:
        path = build()
    except RuntimeError as exc:
        print(f"[tandem] native kernels not built ({exc}); the engine will use torch ops")
        return 0
    print(f"[tandem] native kernels ready: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
