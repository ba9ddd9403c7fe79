"""``python -m tandem.engine.native``: build the native kernels now, every ISA variant this CPU
supports (``make install`` runs it)."""

from __future__ import annotations

import sys

from tandem.engine.native.build import build, cpu_flags, supported_isas


def main() -> int:
    isas = supported_isas(cpu_flags())
    if not isas:
        print("[tandem] native kernels skipped: this CPU lacks AVX2/FMA/F16C (torch path used)")
        return 0
    for isa in isas:
        try:
            path = build(isa=isa)
        except RuntimeError as exc:
            print(f"[tandem] native kernels ({isa}) not built ({exc}); the engine will use "
                  "another variant or torch ops")
            continue
        print(f"[tandem] native kernels ready ({isa}): {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
