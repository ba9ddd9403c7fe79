"""Compile ``decode_step.cpp`` once per machine and ISA variant, and load the best with ctypes.

    decode_step.cpp + *.h --(g++ -O3 <ISA flags> -fopenmp, ~5 s)--> ~/.cache/tandem/native/
                                                                decode_step-<isa>-<hash>.so

The same source is compiled once per ISA variant (:data:`VARIANTS`):

* ``avx2``: ``-mavx2 -mfma -mf16c``; every kernel's AVX2 path. The baseline.
* ``avx512``: the avx2 flags plus ``-mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512vnni``;
  the sources' ``TND_AVX512`` paths (``#if defined(__AVX512F__) && defined(__AVX512VNNI__)``)
  replace the hottest loops, everything else is the avx2 code compiled again:
  - few-row Q4 dot (dot_rows512.h ``dot_rows512_pairs``): two groups of 32 per step, the int16
    activations stored pair-interleaved so one ``vpmovzxbw`` of 32 bytes serves both, two
    ``_mm512_dpwssd_epi32`` (the same exact int32 products as ``vpmaddwd`` + ``vpaddd``), one
    conversion and one FMA per pair and row;
  - few-row Q8 dot (``dot_rows512_groups``): one group per 512-bit register, ``vpdpwssd``;
  - partial blocks of group scales and zero points through masked loads;
  - the tiled GEMM (gemm_tiled.h): a 12 x 16 micro-kernel, one 512-bit panel row per input,
    every output summed in the same order as the avx2 6 x 16 kernel (bit-identical results).
  Only the fp32 accumulation order of the few-row loops differs from the avx2 build (under
  1e-6 relative in tests/unit/engine/native/test_isa.py). Measured on a 2-vCPU AVX-512 Xeon VM (``python -m bench.engine.native_isa``,
  SmolLM2 Q4_1, 2 threads): prefill 512 1.08-1.15x, a 32-row decode step 1.04-1.10x, a
  one-row step 0.97-1.09x (1.12-1.17x on one thread) the avx2 build's speed; so avx512 is the
  default wherever the CPU has it.

:func:`load` picks the best variant the CPU supports (its ``/proc/cpuinfo`` flags), or the
one ``TANDEM_NATIVE_ISA=avx2|avx512`` names (an unknown name, or a variant this CPU cannot
run, raises :class:`NativeISAError`); :func:`isa` says which was loaded (logged once at load).
The hash covers the source, the flags and the compiler, so an edited source or another
compiler builds a new library; the write is atomic, so concurrent first loads are safe.
``make install`` builds every variant this CPU supports ahead of time (``python -m
tandem.engine.native``). Where there is no compiler or no AVX2/FMA/F16C, :func:`load` returns
``None`` and the engine keeps its torch path.
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
from collections.abc import Iterable
from pathlib import Path

from tandem.engine.loader import default_cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_step.cpp")
COMMON_FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17"]
# ISA variant -> (extra compiler flags, /proc/cpuinfo flags the CPU needs), best last.
VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "avx2": (("-mavx2", "-mfma", "-mf16c"), ("avx2", "fma", "f16c")),
    "avx512": (("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512dq",
                "-mavx512vl", "-mavx512vnni"),
               ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
                "avx512_vnni")),
}
PREFERENCE = ("avx512", "avx2")  # best first
ISA_ENV = "TANDEM_NATIVE_ISA"
REQUIRED_CPU_FLAGS = VARIANTS["avx2"][1]  # the baseline: without it, no native kernels
FLAGS = [*COMMON_FLAGS, *VARIANTS["avx2"][0]]  # the avx2 variant's command line
ABI_VERSION = 11


class NativeISAError(ValueError):
    """``TANDEM_NATIVE_ISA`` names an unknown variant or one this CPU cannot run."""


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where it cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f
                                   if line.startswith("flags")), []))
    except OSError:
        return frozenset()


def supported_isas(flags: Iterable[str]) -> list[str]:
    """The variants a CPU with these flags can run, best first."""
    have = set(flags)
    return [name for name in PREFERENCE if all(f in have for f in VARIANTS[name][1])]


def choose_isa(flags: Iterable[str], requested: str | None = None) -> str | None:
    """The variant to load: ``requested`` (``TANDEM_NATIVE_ISA``'s value) if given, else the
    best one the flags allow; ``None`` when the CPU runs none (no AVX2/FMA/F16C).

    Raises :class:`NativeISAError` for an unknown name or one the flags do not allow."""
    supported = supported_isas(flags)
    requested = (requested or "").strip().lower()
    if not requested:
        return supported[0] if supported else None
    if requested not in VARIANTS:
        raise NativeISAError(f"{ISA_ENV}={requested!r}: unknown; use one of "
                             f"{', '.join(sorted(VARIANTS))}")
    if requested not in supported:
        missing = [f for f in VARIANTS[requested][1] if f not in set(flags)]
        raise NativeISAError(f"{ISA_ENV}={requested}: this CPU lacks {', '.join(missing)}")
    return requested


def selected_isa() -> str | None:
    """The variant :func:`load` uses on this machine, honouring ``TANDEM_NATIVE_ISA``."""
    return choose_isa(cpu_flags(), os.environ.get(ISA_ENV))


def cpu_supported() -> bool:
    """True on an x86-64 CPU with the instructions the (avx2) kernels use."""
    return bool(supported_isas(cpu_flags()))


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _flags(isa: str) -> list[str]:
    return [*COMMON_FLAGS, *VARIANTS[isa][0]]


def library_path(cache_dir: Path | None = None, isa: str = "avx2") -> Path | None:
    """Where the library for this source, these flags and this compiler lives."""
    cxx = _compiler()
    if cxx is None:
        return None
    digest = hashlib.sha256()
    for src in sorted(SOURCE.parent.glob("*.[ch]*")):  # the .cpp and the headers it includes
        digest.update(src.name.encode() + src.read_bytes())
    digest.update(" ".join([cxx, *_flags(isa)]).encode())
    base = (cache_dir or default_cache_dir()) / "native"
    return base / f"decode_step-{isa}-{digest.hexdigest()[:16]}.so"


def build(cache_dir: Path | None = None, isa: str | None = None) -> Path:
    """Compile the ``isa`` variant (default: :func:`selected_isa`) if it is not built yet;
    returns its path. Raises on failure."""
    if isa is None:
        isa = selected_isa()
        if isa is None:
            raise RuntimeError(f"this CPU lacks one of {REQUIRED_CPU_FLAGS}")
    elif isa not in supported_isas(cpu_flags()):
        raise RuntimeError(f"this CPU cannot run the {isa} variant (needs {VARIANTS[isa][1]})")
    target = library_path(cache_dir, isa)
    if target is None:
        raise RuntimeError("no C++ compiler (g++) found")
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [_compiler() or "g++", *_flags(isa), str(SOURCE), "-o", tmp]
    log.info("building the native decode kernels (%s): %s", isa, " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling {SOURCE.name} ({isa}) failed:\n{proc.stderr[-4000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


_LOADED_ISA: list[str] = []  # the variant load() opened (set once)


def isa() -> str | None:
    """The ISA variant of the loaded native library (``"avx512"`` or ``"avx2"``), loading it
    if needed; ``None`` when the native kernels are unavailable."""
    return _LOADED_ISA[0] if load() is not None and _LOADED_ISA else None


def open_variant(isa: str) -> ctypes.CDLL | None:
    """The ``isa`` variant's library, built if needed and opened (not cached: each call opens
    it anew; for benchmarks and tests comparing variants in one process); ``None``, logged,
    when it cannot be built or opened."""
    try:
        import torch  # noqa: F401  (torch's libgomp must be loaded first: one OpenMP pool)

        lib = ctypes.CDLL(str(build(isa=isa)))
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
    lib.tnd_moe_route.argtypes, lib.tnd_moe_route.restype = [ptr, ptr, i32, ptr, ptr], None
    lib.tnd_mla_decompresses.argtypes = [ptr, i32, ctypes.c_int64]
    lib.tnd_mla_decompresses.restype = i32
    lib.tnd_forward.argtypes = [ptr, ptr, i32, ptr, i32, ptr, i32]
    lib.tnd_forward.restype = i32
    lib.tnd_isa_width.argtypes, lib.tnd_isa_width.restype = [], i32
    if lib.tnd_isa_width() != (512 if isa == "avx512" else 256):
        log.warning("native library %s reports %d-bit kernels; using torch ops", isa,
                    lib.tnd_isa_width())
        return None
    return lib


@functools.cache
def load() -> ctypes.CDLL | None:
    """The loaded library (the variant :func:`selected_isa` names), building it on first use;
    ``None`` (logged once) when unavailable.

    ``TANDEM_NATIVE=0`` turns the native path off. An invalid ``TANDEM_NATIVE_ISA`` raises
    :class:`NativeISAError` rather than quietly running another variant; without it, a best
    variant that cannot be built or opened falls back to the next (avx512 -> avx2)."""
    if os.environ.get("TANDEM_NATIVE", "1") == "0":
        return None
    chosen = selected_isa()  # raises NativeISAError on a bad override
    if chosen is None:
        log.warning("native CPU decode kernels unavailable, using torch ops: this CPU lacks "
                    "one of %s", REQUIRED_CPU_FLAGS)
        return None
    # Without an override, a variant that cannot be built here (an image built on a CPU
    # without it, and no compiler where it runs) gives way to the next one the CPU runs.
    candidates = [chosen] if os.environ.get(ISA_ENV) else supported_isas(cpu_flags())
    for variant in candidates:
        lib = open_variant(variant)
        if lib is not None:
            _LOADED_ISA[:] = [variant]
            log.info("native CPU kernels: the %s variant (%s=%s overrides)", variant, ISA_ENV,
                     "|".join(PREFERENCE[::-1]))
            return lib
    return None
