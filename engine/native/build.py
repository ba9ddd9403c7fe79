"""Compile ``decode_step.cpp`` once per machine and load it with ctypes.

    decode_step.cpp + *.h --(g++ -O3 -mavx2 -mfma -mf16c -fopenmp, ~5 s)--> ~/.cache/tandem/native/
                                                                       decode_step-<hash>.so

The hash covers the source, the flags and the compiler, so an edited source or another
compiler builds a new library; the write is atomic, so concurrent first loads are safe.
``make install`` builds it ahead of time (``python -m engine.native``). Where there is no
compiler or no AVX2/FMA/F16C, :func:`load` returns ``None`` and the engine keeps its torch path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from engine.loader import default_cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_step.cpp")
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
ABI_VERSION = 4


def cpu_supported() -> bool:
    """True on an x86-64 CPU with the instructions the kernels use."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")),
                         [])
    except OSError:
        return False
    return all(f in flags for f in REQUIRED_CPU_FLAGS)


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def library_path(cache_dir: Path | None = None) -> Path | None:
    """Where the library for this source, these flags and this compiler lives."""
    cxx = _compiler()
    if cxx is None:
        return None
    digest = hashlib.sha256()
    for src in sorted(SOURCE.parent.glob("*.[ch]*")):  # the .cpp and the headers it includes
        digest.update(src.name.encode() + src.read_bytes())
    digest.update(" ".join([cxx, *FLAGS]).encode())
    base = (cache_dir or default_cache_dir()) / "native"
    return base / f"decode_step-{digest.hexdigest()[:16]}.so"


def build(cache_dir: Path | None = None) -> Path:
    """Compile the library if it is not built yet; returns its path. Raises on failure."""
    if not cpu_supported():
        raise RuntimeError(f"this CPU lacks one of {REQUIRED_CPU_FLAGS}")
    target = library_path(cache_dir)
    if target is None:
        raise RuntimeError("no C++ compiler (g++) found")
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [_compiler() or "g++", *FLAGS, str(SOURCE), "-o", tmp]
    log.info("building the native decode kernels: %s", " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE.name} failed:\n{proc.stderr[-4000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


@functools.cache
def load() -> ctypes.CDLL | None:
    """The loaded library, building it on first use; ``None`` (logged once) when unavailable.

    ``TANDEM_NATIVE=0`` turns the native path off."""
    if os.environ.get("TANDEM_NATIVE", "1") == "0":
        return None
    try:
        import torch  # noqa: F401  (torch's libgomp must be loaded first: one OpenMP pool)

        lib = ctypes.CDLL(str(build()))
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        log.warning("native CPU decode kernels unavailable, using torch ops: %s", exc)
        return None
    if lib.tnd_abi_version() != ABI_VERSION:
        log.warning("native library ABI %d != %d; using torch ops", lib.tnd_abi_version(),
                    ABI_VERSION)
        return None
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    lib.tnd_model_create.argtypes, lib.tnd_model_create.restype = [ptr], ptr
    lib.tnd_model_free.argtypes, lib.tnd_model_free.restype = [ptr], None
    lib.tnd_linear.argtypes, lib.tnd_linear.restype = [ptr, ptr, i32, ptr, i32], None
    lib.tnd_embed.argtypes, lib.tnd_embed.restype = [ptr, ptr, i32, ptr], i32
    lib.tnd_forward.argtypes = [ptr, ptr, i32, ptr, i32, ptr, i32]
    lib.tnd_forward.restype = i32
    return lib
