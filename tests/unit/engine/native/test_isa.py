"""The native library's ISA variants: which one is chosen (a pure function of the CPU's flags
and ``TANDEM_NATIVE_ISA``, no compiler needed), that each builds what it says, that the
variants agree, and the kernel tests under every variant this CPU runs (the in-process run
covers the default one; the others run in a subprocess with ``TANDEM_NATIVE_ISA`` set).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tandem.engine.native.build import (
    ISA_ENV,
    VARIANTS,
    NativeISAError,
    choose_isa,
    cpu_flags,
    library_path,
    selected_isa,
    supported_isas,
)

# the module (``tandem.engine.native.build`` as an attribute is the package's build() function)
native_build = importlib.import_module("tandem.engine.native.build")

AVX2 = {"sse4_2", "avx", "avx2", "fma", "f16c"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512cd"}
ROOT = Path(__file__).resolve().parents[4]


# -- the choice: pure, no compiler ---------------------------------------------------------

def test_the_best_supported_variant_is_the_default() -> None:
    assert choose_isa(AVX512) == "avx512"
    assert choose_isa(AVX512, "") == "avx512"
    assert choose_isa(AVX2) == "avx2"
    assert choose_isa(AVX2 | {"avx512f", "avx512bw"}) == "avx2"  # no VNNI, DQ, VL: no avx512
    assert choose_isa({"sse4_2", "avx"}) is None  # no AVX2: no native kernels at all
    assert supported_isas(AVX512) == ["avx512", "avx2"]
    assert supported_isas(set()) == []


def test_the_override_picks_a_supported_variant() -> None:
    assert choose_isa(AVX512, "avx2") == "avx2"
    assert choose_isa(AVX512, "avx512") == "avx512"
    assert choose_isa(AVX512, " AVX512 ") == "avx512"
    assert choose_isa(AVX2, "avx2") == "avx2"


def test_an_unknown_override_is_an_error() -> None:
    with pytest.raises(NativeISAError, match="unknown.*avx2, avx512"):
        choose_isa(AVX512, "avx10")


def test_an_override_the_cpu_cannot_run_is_an_error() -> None:
    with pytest.raises(NativeISAError, match="lacks avx512f.*avx512_vnni"):
        choose_isa(AVX2, "avx512")
    with pytest.raises(NativeISAError, match="lacks avx2"):
        choose_isa({"avx"}, "avx2")


def test_load_raises_on_a_bad_override_instead_of_running_another_variant(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ISA_ENV, "avx10")
    monkeypatch.delenv("TANDEM_NATIVE", raising=False)
    with pytest.raises(NativeISAError):
        native_build.load.__wrapped__()  # the uncached body: the cached load() is untouched


def test_without_an_override_a_variant_that_cannot_open_gives_way_to_the_next(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An image built where the CPU lacked AVX-512, run where it has it with no compiler:
    avx512 cannot be built, so avx2 serves (an override would have been an error instead)."""
    monkeypatch.delenv(ISA_ENV, raising=False)
    monkeypatch.delenv("TANDEM_NATIVE", raising=False)
    monkeypatch.setattr(native_build, "cpu_flags", lambda: frozenset(AVX512))
    tried: list[str] = []
    lib = object()

    def open_variant(isa: str) -> object | None:
        tried.append(isa)
        return None if isa == "avx512" else lib

    monkeypatch.setattr(native_build, "open_variant", open_variant)
    saved = list(native_build._LOADED_ISA)
    try:
        assert native_build.load.__wrapped__() is lib
        assert tried == ["avx512", "avx2"] and native_build._LOADED_ISA == ["avx2"]
        tried.clear()
        monkeypatch.setenv(ISA_ENV, "avx512")
        assert native_build.load.__wrapped__() is None and tried == ["avx512"]
    finally:
        native_build._LOADED_ISA[:] = saved


def test_each_variant_has_its_own_library_file(tmp_path: Path) -> None:
    paths = {isa: library_path(tmp_path, isa) for isa in VARIANTS}
    if None in paths.values():
        pytest.skip("no C++ compiler here")
    assert len(set(paths.values())) == len(VARIANTS)
    for isa, path in paths.items():
        assert f"-{isa}-" in path.name


# -- the built variants -----------------------------------------------------------------------

RUNNABLE = supported_isas(cpu_flags())


def _lib(isa: str) -> ctypes.CDLL:
    if isa not in RUNNABLE:
        pytest.skip(f"this CPU cannot run the {isa} variant (needs {', '.join(VARIANTS[isa][1])})")
    if os.environ.get("TANDEM_NATIVE", "1") == "0" or native_build.load() is None:
        pytest.skip("native kernels unavailable here")
    lib = native_build.open_variant(isa)
    assert lib is not None, f"the {isa} variant did not build or load"
    return lib


@pytest.mark.parametrize("isa", sorted(VARIANTS))
def test_a_variant_compiles_the_kernels_it_names(isa: str) -> None:
    assert _lib(isa).tnd_isa_width() == (512 if isa == "avx512" else 256)


def test_the_loaded_variant_is_reported() -> None:
    if native_build.load() is None:
        pytest.skip("native kernels unavailable here")
    assert native_build.isa() == selected_isa()


@pytest.mark.parametrize("rows", [1, 3, 4, 5, 8, 13, 24, 37])
def test_the_variants_agree(rows: int) -> None:
    """The tiled path (8+ rows) sums each output in the same order in both builds: identical
    bits. The few-row integer loops have the same exact integer products per group; only the
    fp32 accumulation order across groups and lanes differs."""
    from tandem.engine.native.fused_forward import NativeLinear
    from tandem.engine.native.packed_linear import PackedLinear

    gguf = pytest.importorskip("gguf")
    libs = {isa: _lib(isa) for isa in ("avx2", "avx512")}
    g = torch.Generator().manual_seed(rows)
    n, k = 45, 352  # a partial 16-row panel, 11 groups (a partial 8-group block, an odd one)
    w = torch.randn(n, k, generator=g).numpy()
    x = torch.randn(rows, k, generator=g) * torch.logspace(-2, 1, k)
    for qtype in (gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0):
        layer = PackedLinear.from_q4_1(gguf.quants.quantize(w, qtype), torch.randn(n)) \
            if qtype == gguf.GGMLQuantizationType.Q4_1 else \
            PackedLinear.from_q8_0(gguf.quants.quantize(w, qtype), torch.randn(n))
        native = NativeLinear(layer)
        out = {}
        for isa, lib in libs.items():
            y = torch.empty(rows, n)
            lib.tnd_linear(ctypes.byref(native.struct), ctypes.c_void_p(x.data_ptr()), rows,
                           ctypes.c_void_p(y.data_ptr()), 2)
            out[isa] = y
        if rows >= 8:
            assert torch.equal(out["avx2"], out["avx512"]), qtype
        else:
            rel = ((out["avx2"] - out["avx512"]).norm() / out["avx2"].norm()).item()
            assert rel < 1e-6, (qtype, rel)


KERNEL_TESTS = ["test_kernels.py", "test_fused_forward.py", "test_fused_16bit.py",
                "test_fused_fp8.py", "test_fused_fp8_kv.py"]


@pytest.mark.parametrize("isa", sorted(VARIANTS))
def test_the_kernel_tests_pass_under_every_variant(isa: str) -> None:
    if isa not in RUNNABLE:
        pytest.skip(f"this CPU cannot run the {isa} variant (needs {', '.join(VARIANTS[isa][1])})")
    if os.environ.get("TANDEM_NATIVE", "1") == "0" or native_build.load() is None:
        pytest.skip("native kernels unavailable here")
    if isa == native_build.isa():
        pytest.skip(f"{isa} is this process's variant: its kernel tests ran in this run")
    here = Path(__file__).parent
    env = {**os.environ, ISA_ENV: isa, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         *(str(here / f) for f in KERNEL_TESTS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout, proc.stdout[-2000:]
