"""FP8 weights in the native kernels (PackedLinear kind 7: tandem/engine/native/fp8_weights.h)
against the reference dequantization ``e4m3.float() * scale``.

The kernels widen each e4m3 byte in registers and multiply it by its block's scale: every
weight they use must be the reference's float bit for bit (checked through the identity,
where each output is one product: every one of the 254 non-NaN codes, under scales of odd
blocks), and a product over many inputs must agree with the fp64 product of the reference
weights to fp32 summation order (the float kinds' tolerance, 1e-6). Both ISA variants the CPU
runs; 1-7 rows (the few-row loop, 1-4 rows a block) and 8 or more (the tiled GEMM, one pass
and two); per-tensor scales, blocks that divide the weight, odd ones with partial edges, one
scale per weight; a fused layer whose parts keep their own scales.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from tandem.engine.native import load
from tandem.engine.native.build import open_variant
from tandem.engine.native.packed_linear import KIND_FP8, PackedLinear
from tandem.engine.quant.prequantized import Fp8Format, Fp8Weight, concat_rows
from tests.unit.engine.native.header_program import variants

pytestmark = pytest.mark.skipif(load() is None, reason="native kernels unavailable here")

E4M3_MAX = 448.0
BLOCKS = {"tensor": None, "48x32": (48, 32), "7x40": (7, 40), "5x96": (5, 96), "1x1": (1, 1),
          "128x128": (128, 128)}


@pytest.fixture(scope="module", params=variants())
def lib(request: pytest.FixtureRequest) -> ctypes.CDLL:
    """Each ISA variant of the library this CPU runs."""
    opened = open_variant(request.param)
    assert opened is not None, request.param
    return opened


def _run(lib: ctypes.CDLL, layer: PackedLinear, x: torch.Tensor, threads: int = 2,
         ) -> torch.Tensor:
    x = x.float().contiguous()
    y = torch.empty(x.shape[0], layer.out_features)
    lib.tnd_linear(ctypes.byref(layer.struct()), ctypes.c_void_p(x.data_ptr()), x.shape[0],
                   ctypes.c_void_p(y.data_ptr()), threads)
    return y


def _quantize(w: torch.Tensor, block: tuple[int, int] | None) -> Fp8Weight:
    """``w`` in e4m3 with one scale per block (amax / 448), as FP8 exports store it."""
    n, k = w.shape
    bn, bk = block or (n, k)
    rows, cols = -(-n // bn), -(-k // bk)
    pad = torch.zeros(rows * bn, cols * bk)
    pad[:n, :k] = w.abs()
    grid = (pad.view(rows, bn, cols, bk).amax(dim=(1, 3)) / E4M3_MAX).clamp(min=1e-12)
    wide = grid.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    q = (w / wide).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return Fp8Weight(q.view(torch.uint8), grid, (torch.arange(n) // bn).to(torch.int32), bk)


def _weights(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """Weights whose magnitudes differ by rows and inputs (blocks get unlike scales)."""
    return torch.randn(n, k, generator=g) * torch.logspace(-3, 1, n)[:, None] \
        * torch.logspace(1, -2, k)


def test_the_reference_is_the_formats_dequantization() -> None:
    """Fp8Weight, PackedLinear and the format's ``float_weight`` (what the torch path loads)
    dequantize to the same floats."""
    g = torch.Generator().manual_seed(0)
    for block in ((48, 32), (7, 40), None):
        w8 = _quantize(_weights(37, 160, g), block)
        name = "weight_scale" if block is None else "weight_scale_inv"
        src = {"l.weight": w8.q.view(torch.float8_e4m3fn),  # a TensorSource: in, get
               f"l.{name}": w8.scale.reshape(1) if block is None else w8.scale}
        ref = Fp8Format(block).float_weight("l", src)
        assert torch.equal(w8.dequantize(), ref)
        packed = PackedLinear.from_fp8(w8.q, w8.scale, w8.rows, w8.block_k)
        assert packed.kind == KIND_FP8 and torch.equal(packed.dequantize(), ref)
        unpacked = Fp8Format(block, native=True).unpack("l", src)
        assert torch.equal(unpacked.dequantize(), ref)


@pytest.mark.parametrize("rows", [1, 3, 7, 300])  # one-row, few-row blocks, tiled in 2 passes
def test_every_code_widens_to_its_value_times_its_scale(lib: ctypes.CDLL, rows: int) -> None:
    """Each weight read alone (x = rows of the identity: one product per output, no rounding
    but the weight's own): all 254 non-NaN codes in every row, under scales of 3 x 48 blocks
    that span small and large magnitudes and are not powers of two."""
    n, k = 11, 256 + 64
    codes = torch.stack([(torch.arange(k) * 7 + 13 * r) % 256 for r in range(n)]).to(torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x00  # the NaN codes are refused at load
    g = torch.Generator().manual_seed(1)
    grid = torch.exp2(torch.randint(-30, 30, (4, 7), generator=g).float()) \
        * (1 + torch.rand(4, 7, generator=g))
    w8 = Fp8Weight(codes, grid, (torch.arange(n) // 3).to(torch.int32), 48)
    layer = PackedLinear.from_fp8(w8.q, w8.scale, w8.rows, w8.block_k)
    want = w8.dequantize().T  # [K, N]
    eye = torch.eye(k)
    for r0 in range(0, k, rows):
        got = _run(lib, layer, eye[r0:r0 + rows])
        assert torch.equal(got, want[r0:r0 + rows]), r0


def test_subnormal_codes_survive_flush_to_zero(lib: ctypes.CDLL) -> None:
    """An e4m3 subnormal passes through an fp16 subnormal, which F16C widens exactly even with
    MXCSR's denormals-are-zero and flush-to-zero set (``torch.set_flush_denormal(True)``
    sets both on this thread; one thread runs the kernel on it)."""
    codes = torch.tensor([[c for c in range(1, 8)] * 4 + [c | 0x80 for c in range(1, 8)] * 4
                          + [0] * 8], dtype=torch.uint8)  # [1, 64]
    w8 = Fp8Weight(codes, torch.ones(1, 1), torch.zeros(1, dtype=torch.int32), 64)
    layer = PackedLinear.from_fp8(w8.q, w8.scale, w8.rows, w8.block_k)
    want = w8.dequantize().T  # +-m * 2^-9: normal in fp32
    assert bool((want[:56] != 0).all())
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode")
    try:
        for rows in (1, 3, 64):
            eye = torch.eye(64)
            got = torch.cat([_run(lib, layer, eye[r:r + rows], threads=1)
                             for r in range(0, 64, rows)])
            assert torch.equal(got, want), rows
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.parametrize("block", list(BLOCKS))
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 33, 300])
def test_linear_matches_the_dequantized_matmul(lib: ctypes.CDLL, block: str, rows: int) -> None:
    g = torch.Generator().manual_seed(rows * 31 + len(block))
    n, k = 37, 160  # N odd (a partial panel), K = 5 groups of 32
    w8 = _quantize(_weights(n, k, g), BLOCKS[block])
    bias = torch.randn(n, generator=g)
    layer = PackedLinear.from_fp8(w8.q, w8.scale, w8.rows, w8.block_k, bias)
    x = torch.randn(rows, k, generator=g) * torch.logspace(-2, 1, k)  # uneven magnitudes
    ref = x.double() @ w8.dequantize().double().T + bias.double()
    out = _run(lib, layer, x).double()
    # fp32 products of the exact weights, summed in another order: relative to the vector,
    # and to the largest output for every output alone (one that cancels to near zero keeps
    # the summation's absolute rounding)
    assert ((out - ref).norm() / ref.norm()).item() < 1e-6
    assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-6


@pytest.mark.parametrize("block", [None, (48, 32), (5, 96)])
def test_fused_parts_keep_their_own_scales(lib: ctypes.CDLL, block) -> None:  # noqa: ANN001
    """A q/k/v-like fusion of three parts (row counts that the block does not divide): each
    part's rows read their own scales."""
    g = torch.Generator().manual_seed(5)
    parts = [_quantize(_weights(n, 96, g) * s, block) for n, s in ((40, 1.0), (9, 30.0),
                                                                   (21, 1e-3))]
    fused = concat_rows(parts)
    assert isinstance(fused, Fp8Weight)
    want = torch.cat([p.dequantize() for p in parts])
    assert torch.equal(fused.dequantize(), want)
    layer = PackedLinear.from_fp8(fused.q, fused.scale, fused.rows, fused.block_k)
    assert torch.equal(layer.dequantize(), want)
    for rows in (1, 4, 20):
        x = torch.randn(rows, 96, generator=g)
        ref = x.double() @ want.double().T
        assert ((_run(lib, layer, x).double() - ref).norm() / ref.norm()).item() < 1e-6
    assert torch.equal(_run(lib, layer, torch.eye(96)), want.T)


def test_bytes_held_per_weight() -> None:
    """One byte per weight, its scale rows (one fp32 per input per block of rows) and a row
    index per output: in blocks of 128 rows 1 + 4 / 128 bytes a weight and 4 bytes an output
    row, not 4 bytes a weight."""
    g = torch.Generator().manual_seed(2)
    n, k = 512, 256
    w8 = _quantize(_weights(n, k, g), (128, 128))
    layer = PackedLinear.from_fp8(w8.q, w8.scale, w8.rows, w8.block_k)
    assert layer.weight_bytes() == n * k + (n // 128) * k * 4 + n * 4
    assert layer.weight_bytes() == n * k * (1 + 4 / 128) + 4 * n


TAIL_BLOCKS = {"tensor": None, "7x24": (7, 24), "3x40": (3, 40), "5x12": (5, 12)}


@pytest.mark.parametrize("block", list(TAIL_BLOCKS))
@pytest.mark.parametrize("k", [1, 17, 33, 100, 130])
def test_any_width_reads_every_weight_bit_for_bit(lib: ctypes.CDLL, k: int, block: str) -> None:
    """K that is not a multiple of 32: a row's last K % 32 weights (their scale blocks
    straddling the last whole 32) are each the reference's float, through the few-row loop
    (1-7 rows), the tiled GEMM's last window (8 or more, two passes at 300) and the embedding
    rows; a product over them agrees with the fp64 one to summation order."""
    g = torch.Generator().manual_seed(k)
    n = 37
    w8 = _quantize(_weights(n, k, g), TAIL_BLOCKS[block])
    layer = PackedLinear.from_fp8(w8.q, w8.scale, w8.rows, w8.block_k)
    assert layer.in_features == k and layer.q.shape == (n, k)  # one byte a weight, no padding
    want = w8.dequantize()
    eye = torch.eye(k)
    for rows in (1, 2, 3, 4, 5, 7, 8, 9, 33, 300):
        pick = torch.arange(rows) % k  # each row reads one input: the weight itself
        assert torch.equal(_run(lib, layer, eye[pick]), want.T[pick]), rows
        x = torch.randn(rows, k, generator=g)
        ref = x.double() @ want.double().T
        out = _run(lib, layer, x).double()
        assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-6, rows
    ids = torch.arange(n, dtype=torch.int64)
    table = torch.empty(n, k)
    assert lib.tnd_embed(ctypes.byref(layer.struct()), ctypes.c_void_p(ids.data_ptr()), n,
                         ctypes.c_void_p(table.data_ptr())) == 0
    assert torch.equal(table, want)


def test_a_tail_reads_nothing_past_its_row(lib: ctypes.CDLL) -> None:
    """Rows of K = 33 packed back to back, the activations' last input followed by NaN in
    the same buffer: the tail step copies exactly K % 32 values, so no NaN reaches an
    output."""
    g = torch.Generator().manual_seed(9)
    n, k = 20, 33
    w8 = _quantize(_weights(n, k, g), (7, 24))
    layer = PackedLinear.from_fp8(w8.q, w8.scale, w8.rows, w8.block_k)
    for rows in (1, 3, 4, 8):
        buf = torch.full((rows * k + 64,), float("nan"))
        buf[:rows * k] = torch.randn(rows * k, generator=g)
        y = torch.empty(rows, n)
        lib.tnd_linear(ctypes.byref(layer.struct()), ctypes.c_void_p(buf.data_ptr()), rows,
                       ctypes.c_void_p(y.data_ptr()), 2)
        ref = buf[:rows * k].view(rows, k).double() @ w8.dequantize().double().T
        assert not y.isnan().any(), rows
        assert ((y.double() - ref).abs().max() / ref.abs().max()).item() < 1e-6
