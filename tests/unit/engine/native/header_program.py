"""Compile a small C++ program against tandem/engine/native's headers, for the tests of one header."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import pytest

native_build = importlib.import_module("tandem.engine.native.build")  # the package re-exports a build()


def compile_program(work: Path, name: str, source: str, isa: str = "avx2") -> Path:
    """``source`` built with ``isa``'s flags (tandem/engine/native/build.py's VARIANTS) into
    ``work/name``; skips the test where there is no compiler or the CPU cannot run it."""
    cxx = native_build._compiler()
    if cxx is None:
        pytest.skip("no C++ compiler here")
    if isa not in native_build.supported_isas(native_build.cpu_flags()):
        pytest.skip(f"this CPU cannot run the {isa} build")
    src, exe = work / f"{name}.cpp", work / name
    src.write_text(source)
    subprocess.run([cxx, "-O2", "-fopenmp", "-std=c++17", *native_build.VARIANTS[isa][0],
                    f"-I{native_build.SOURCE.parent}", str(src), "-o", str(exe)],
                   check=True, timeout=180)
    return exe


def variants() -> list[str]:
    """The ISA variants this CPU runs (none: the tests that need one skip)."""
    return list(native_build.supported_isas(native_build.cpu_flags()))
