"""The native linear kernels and their weight layouts against references.

Every weight kind (Q4 with fp32 or fp16 scales, Q8 per row, Q8 groups, fp32, bf16, fp16)
through every row-count class: 1 (decode), 2-7 (the few-row loops' row blocks), 8-64 (the
tiled path, one row block), above 64 (several row blocks), odd N (tile tails), against
``x @ W^T`` with ``W`` the layer's own fp32 dequantization (a 16-bit weight upcast). The GGUF block layouts are checked against the ``gguf``
package's reference dequantization (llama.cpp's own Python port).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tandem.engine.native import NativeLinear, load
from tandem.engine.native.packed_linear import (
    KIND_BF16,
    KIND_F16,
    KIND_F32,
    KIND_Q4_F16,
    KIND_Q4_F32,
    KIND_Q8_F16,
    KIND_Q8_ROW,
    PackedEmbedding,
    PackedLinear,
)
from tandem.engine.quant import Int4Linear, Int8Linear
from tandem.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(load() is None, reason="native kernels unavailable here")
gguf = pytest.importorskip("gguf")
quants = gguf.quants
QT = gguf.GGMLQuantizationType


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def _gguf_blocks(w: np.ndarray, qtype) -> np.ndarray:
    return quants.quantize(w.astype(np.float32), qtype)


def _layer(kind: int, n: int, k: int, g: torch.Generator) -> torch.nn.Module:
    w = torch.randn(n, k, generator=g)
    bias = torch.randn(n, generator=g)
    if kind == KIND_Q4_F32:  # scales below fp16's normal range keep fp32 scales
        return PackedLinear.from_int4(Int4Linear.from_float(w * 1e-6, bias * 1e-6))
    if kind == KIND_Q4_F16:
        return PackedLinear.from_q4_1(_gguf_blocks(w.numpy(), QT.Q4_1), bias)
    if kind == KIND_Q8_ROW:
        return PackedLinear.from_int8(Int8Linear.from_float(w, bias))
    if kind == KIND_Q8_F16:
        return PackedLinear.from_q8_0(_gguf_blocks(w.numpy(), QT.Q8_0), bias)
    dtype = {KIND_BF16: torch.bfloat16, KIND_F16: torch.float16}.get(kind, torch.float32)
    lin = torch.nn.Linear(k, n, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(bias)
    return lin


FLOAT_KINDS = (KIND_F32, KIND_BF16, KIND_F16)


@pytest.mark.parametrize("kind", [KIND_Q4_F32, KIND_Q4_F16, KIND_Q8_ROW, KIND_Q8_F16, KIND_F32,
                                  KIND_BF16, KIND_F16])
@pytest.mark.parametrize("rows", [1, 2, 5, 7, 8, 9, 32, 63, 64, 65, 130, 513])  # 513: passes 256+256+1
def test_linear_matches_the_dequantized_matmul(kind: int, rows: int) -> None:
    g = torch.Generator().manual_seed(kind * 100 + rows)
    n, k = 37, 160  # N odd (a partial tile), K = 5 groups
    layer = _layer(kind, n, k, g)
    native = NativeLinear(layer)
    assert native.kind == kind
    w = layer.weight.float() if kind in FLOAT_KINDS else layer.dequantize()
    x = torch.randn(rows, k, generator=g) * torch.logspace(-2, 1, k)  # uneven magnitudes
    ref = x.double() @ w.double().T + layer.bias.double()
    # few rows of quantized weights: int16 activations (~2e-5); else fp32 summation order
    tol = 1e-4 if rows < 8 and kind not in FLOAT_KINDS else 1e-6
    if kind in (KIND_BF16, KIND_F16):  # read in place: the layer's own tensor, no copy
        assert native.tensors[0].data_ptr() == layer.weight.data_ptr()
    assert _rel(native(x).double(), ref) < tol
    if isinstance(layer, PackedLinear):  # the module's own forward takes the same kernel
        assert torch.equal(layer(x), native(x))


@pytest.mark.parametrize("kind", [KIND_Q4_F32, KIND_Q4_F16, KIND_Q8_ROW, KIND_Q8_F16])
@pytest.mark.parametrize("n", [64, 37])
def test_one_row_blocks_match_the_dequantized_matmul(kind: int, n: int) -> None:
    """A one-row step's loop (dot_rows.h ``dot_1row``): four weight rows at a time over
    blocks of 8 groups and a tail. K = 19 groups: two whole blocks and 3 groups more (the
    160-input test above has only a tail); N = 64 is whole blocks of four rows, 37 ends in
    one row alone."""
    g = torch.Generator().manual_seed(kind * 7 + n)
    k = 19 * 32
    layer = _layer(kind, n, k, g)
    w = layer.dequantize()
    x = torch.randn(1, k, generator=g) * torch.logspace(-2, 1, k)
    ref = x.double() @ w.double().T + layer.bias.double()
    out = NativeLinear(layer)(x).double()
    assert _rel(out, ref) < 1e-4
    # every output row, not only the whole vector's norm (against the largest output: a row
    # that cancels to near zero keeps the activations' absolute rounding)
    assert ((out - ref).abs().max() / ref.abs().max()).item() < 1e-4


@pytest.mark.parametrize("kind", [KIND_Q4_F32, KIND_Q4_F16, KIND_Q8_ROW, KIND_Q8_F16, KIND_F32])
@pytest.mark.parametrize("n", [48, 37])
def test_tiled_panels_hold_the_exact_weights(kind: int, n: int) -> None:
    """The tiled path against the identity: row i of x = e_i gives column i of W (one
    product, no rounding) plus the bias, so every weight its panels hold is checked exactly.
    K = 11 groups: a full window of 256 inputs, then one of 96 (three groups: a Q4 pair
    dequantized straight into the panel and an odd group by rows); N = 48 is whole panels
    of 16 (the direct path), 37 ends in a partial one."""
    g = torch.Generator().manual_seed(kind * 10 + n)
    k = 352
    layer = _layer(kind, n, k, g)
    w = layer.weight.float() if kind in FLOAT_KINDS else layer.dequantize()
    y = NativeLinear(layer)(torch.eye(k))
    assert torch.equal(y, w.T + layer.bias.float())


@pytest.mark.parametrize("qtype,build", [(QT.Q4_0, PackedLinear.from_q4_0),
                                         (QT.Q4_1, PackedLinear.from_q4_1),
                                         (QT.Q8_0, PackedLinear.from_q8_0)])
def test_gguf_blocks_dequantize_as_the_reference(qtype, build) -> None:
    rng = np.random.default_rng(int(qtype))
    w = rng.standard_normal((24, 96)).astype(np.float32) * rng.uniform(0.01, 3, (24, 1))
    blocks = _gguf_blocks(w, qtype)
    ref = torch.from_numpy(quants.dequantize(blocks, qtype).astype(np.float32))
    layer = build(blocks)
    assert torch.equal(layer.dequantize(), ref)
    x = torch.randn(3, 96, dtype=torch.float32)
    assert _rel(layer(x), x @ ref.T) < 1e-4
    ids = torch.tensor([[0, 23], [5, 5]])
    assert torch.equal(PackedEmbedding(layer)(ids), ref[ids])


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_groups_above_32_split_exactly(group: int) -> None:
    """An AWQ/GPTQ-style group of 64 or 128 becomes 2 or 4 groups of 32 sharing the scale and
    zero: the same weights, exactly."""
    g = torch.Generator().manual_seed(group)
    lin = Int4Linear.from_float(torch.randn(16, 256, generator=g), group_size=group)
    packed = PackedLinear.from_int4(lin)
    assert torch.equal(packed.dequantize(), lin.dequantize())


def test_embedding_refuses_ids_outside_the_table() -> None:
    layer = PackedLinear.from_q8_0(_gguf_blocks(np.ones((4, 32), np.float32), QT.Q8_0))
    with pytest.raises(IndexError):
        PackedEmbedding(layer)(torch.tensor([4]))
    with pytest.raises(IndexError):
        PackedEmbedding(layer)(torch.tensor([-1]))


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_layers_the_kernels_cannot_take_stay_on_torch(make_engine, tiny_dir, quant: str) -> None:
    """A hidden size that is not a multiple of 32: the layers reading it stay Int8Linear/
    Int4Linear (the others are packed) and the engine runs on torch ops instead of failing."""
    engine = make_engine(model=str(tiny_dir("llama", hidden_size=48)), dtype="float32",
                         quantization=quant, num_blocks=16)
    assert engine.runner.fused is None
    layers = [m for m in engine.runner.model.modules()
              if isinstance(m, PackedLinear | Int4Linear | Int8Linear)]
    assert all(isinstance(m, PackedLinear) == (m.in_features % 32 == 0) for m in layers)
    assert any(not isinstance(m, PackedLinear) for m in layers)
    rid = engine.add_request([5, 6, 7], SamplingParams(temperature=0.0, max_tokens=3))
    while engine.has_unfinished():
        engine.step()
    assert rid
