"""Weight-only int8 / int4 linear layers against an fp32 reference.

Both CPU paths are checked: few rows run torch's packed kernels on bf16 activations (error of
bf16 rounding), many rows dequantize to fp32 (exact up to fp32 matmul rounding). The Triton
kernels run under ``TRITON_INTERPRET=1`` without a GPU, compiled with one.
"""

from __future__ import annotations

import os

import numpy as np
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tandem.engine.quant import int4 as int4_mod  # noqa: E402
from tandem.engine.quant import int8 as int8_mod  # noqa: E402
from tandem.engine.quant.int4 import Int4Linear  # noqa: E402
from tandem.engine.quant.int8 import Int8Linear  # noqa: E402

N, K = 96, 128


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.fixture
def wx() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(N, K, generator=g) / K**0.5
    bias = torch.randn(N, generator=g) * 0.1
    return w, bias, torch.randn(80, K, generator=g)


def test_int8_quantization_error_is_half_a_step(wx) -> None:
    w, _, _ = wx
    lin = Int8Linear.from_float(w)
    step = lin.scale[:, None]
    assert lin.qweight.dtype == torch.int8 and lin.qweight.abs().max() <= 127
    assert ((lin.dequantize() - w).abs() <= step / 2 + 1e-7).all()
    assert torch.equal(lin.scale_bf16.float(), lin.scale)  # the kernel's bf16 scale is exact


def test_int4_quantization_error_is_half_a_step(wx) -> None:
    w, _, _ = wx
    lin = Int4Linear.from_float(w)
    q = lin.unpack()
    assert q.max() <= 15 and lin.scale.shape == (N, K // 32)
    step = lin.scale.repeat_interleave(32, dim=1)
    # zero is rounded to bf16, so the grid may shift by a bf16 ulp: allow that on top.
    slack = lin.zero.abs().repeat_interleave(32, dim=1) * 2**-8
    assert ((lin.dequantize() - w).abs() <= step / 2 + slack + 1e-7).all()
    assert _rel(lin.dequantize(), w) < 0.1  # 16 levels per group of 32


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 5])
def test_kernel_path_matches_dequantized_weights(wx, kind: str, rows: int) -> None:
    w, bias, x = wx
    lin = (Int8Linear if kind == "int8" else Int4Linear).from_float(w, bias)
    x = x[:rows]
    ref = x @ lin.dequantize().t() + bias
    got = lin(x)
    assert got.dtype == torch.float32 and got.shape == (rows, N)
    assert _rel(got, ref) < 1e-2  # bf16 activations in the CPU kernel
    assert _rel(got, x @ w.t() + bias) < (0.02 if kind == "int8" else 0.15)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_many_rows_dequantize_exactly(wx, kind: str) -> None:
    w, bias, x = wx
    mod = int8_mod if kind == "int8" else int4_mod
    lin = (Int8Linear if kind == "int8" else Int4Linear).from_float(w, bias)
    assert x.shape[0] >= mod.DEQUANT_MIN_ROWS
    torch.testing.assert_close(lin(x), x @ lin.dequantize().t() + bias, rtol=1e-5, atol=1e-5)


def test_bf16_activations_keep_their_dtype(wx) -> None:
    w, _, x = wx
    lin = Int4Linear.from_float(w)
    assert lin(x[:2].bfloat16()).dtype == torch.bfloat16


@pytest.mark.parametrize("n", [8, 16])  # 8 rows: no CPU int4 pack (it wants N in 16s)
def test_q4_1_blocks_load_exactly(n: int) -> None:
    """A Q4_1 row (fp16 d, fp16 m, nibbles; value = d * q + m) keeps every value, checked
    against the gguf package's own dequantizer."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(0)
    k = 64
    blocks = np.zeros((n, k // 32, 20), dtype=np.uint8)
    d = (rng.random((n, k // 32)) * 0.1).astype(np.float16)
    m = (rng.standard_normal((n, k // 32)) * 0.5).astype(np.float16)
    blocks[..., 0:2] = d.view(np.uint8).reshape(n, k // 32, 2)
    blocks[..., 2:4] = m.view(np.uint8).reshape(n, k // 32, 2)
    blocks[..., 4:] = rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8)
    raw = blocks.reshape(n, -1)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1).reshape(n, k)
    lin = Int4Linear.from_q4_1(raw)
    np.testing.assert_allclose(lin.dequantize().numpy(), ref, rtol=0, atol=1e-6)
    x = torch.randn(3, k)
    assert _rel(lin(x), x @ torch.from_numpy(ref).float().t()) < 1e-2


def _triton_ready() -> bool:
    if torch.cuda.is_available():
        return True
    from tandem.engine.attention.triton_kernels.common import is_interpreting

    return is_interpreting()


@pytest.mark.skipif(not _triton_ready(), reason="Triton kernels imported compiled, no CUDA")
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_triton_kernel_matches_dequantized_weights(wx, kind: str) -> None:
    from tandem.engine.quant.triton_matmul import int4_matmul, int8_matmul

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    w, _, x = wx
    x = x[:7].to(dev)
    if kind == "int8":
        lin = Int8Linear.from_float(w).to(dev)
        got = int8_matmul(x, lin.qweight, lin.scale)
    else:
        lin = Int4Linear.from_float(w).to(dev)
        got = int4_matmul(x, lin.qweight, lin.scale, lin.zero, lin.group_size)
    ref = x @ lin.dequantize().t()
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_cuda_forward_in_bf16(wx, kind: str) -> None:
    w, bias, x = wx
    lin = (Int8Linear if kind == "int8" else Int4Linear).from_float(w, bias).cuda()
    xb = x[:4].cuda().bfloat16()
    got = lin(xb)
    assert got.dtype == torch.bfloat16
    assert _rel(got, xb.float() @ lin.dequantize().t() + bias.cuda()) < 1e-2


def test_int8_weight_at_an_odd_address_is_copied_aligned() -> None:
    """A weight viewed into a larger buffer (as from a safetensors file) starts anywhere;
    torch's AVX-512 int8 kernel segfaulted on one at 8 bytes past a 64-byte boundary."""
    w = Int8Linear.from_float(torch.randn(N, K)).qweight
    buf = torch.empty(N * K + 8, dtype=torch.int8)
    buf[8:] = w.flatten()
    odd = buf[8:].view(N, K)
    assert odd.data_ptr() % int8_mod.ALIGN_BYTES != 0
    lin = Int8Linear(odd, torch.ones(N), None)
    assert lin.qweight.data_ptr() % int8_mod.ALIGN_BYTES == 0
    assert torch.equal(lin.qweight, w)
    x = torch.randn(3, K)  # few rows: torch's packed int8 kernel
    assert _rel(lin(x), x @ w.float().T) < 1e-2  # bf16 activations' rounding


@pytest.mark.parametrize("k", [8, 72, 104, 96])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_int8_any_in_features_gives_the_dequantized_product(k: int, rows: int) -> None:
    """torch's packed int8 kernel reads K in blocks of 32 and, for any other K, returned
    garbage or segfaulted: such layers run the dequantized product instead (K = 96 keeps the
    kernel)."""
    torch.manual_seed(k + rows)
    lin = Int8Linear.from_float(torch.randn(33, k))
    x = torch.randn(rows, k)
    assert _rel(lin(x), x @ lin.dequantize().T) < 1e-2  # bf16 activations' rounding at most
