"""One linear layer cut to a rank's rows or columns, whatever format it was loaded in.

    Linear       weight [N, K]                  rows: weight[idx]           cols: weight[:, c]
    Int4Linear   q [N, K], scale, zero [N, K/g] rows: q, scale, zero [idx]  cols: q[:, c] and
                                                the groups of c (c on multiples of g, or refused)
    Int8Linear   q [N, K], scale [N]            rows: q[idx], scale[idx]    cols: q[:, c], scale

The quantized layers are cut after their format's reader unpacked them into our convention
(tandem/engine/quant/prequantized/unpacked.py): AWQ's nibble order and GPTQ's packing along K
are undone by then, and the groups run in column order (an act-order ``g_idx`` is refused at
load), so a column span on a group boundary keeps whole groups with their own scale and zero,
and the cut layer computes exactly that slice of the whole one. A column-parallel cut keeps
the bias rows; a row-parallel cut keeps the bias only where asked (rank 0: the all-reduce
adds the partial products, so the bias enters once).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tandem.engine.models.linear import Linear
from tandem.engine.parallel.plan import Span, TensorParallelError
from tandem.engine.quant.int4 import Int4Linear
from tandem.engine.quant.int8 import Int8Linear


def span_index(spans: list[Span]) -> np.ndarray:
    """Every index the ``spans`` hold, in order."""
    return np.concatenate([np.arange(s.start, s.stop) for s in spans])


def cut_rows(lin: nn.Module, spans: list[Span], name: str) -> nn.Module:
    """A column-parallel slice of ``lin`` (named ``name`` in errors): the output rows in
    ``spans``, with their bias."""
    with torch.no_grad():
        if isinstance(lin, Linear):
            idx = _torch_index(spans, lin.weight.device)
            return _linear(lin.weight[idx], None if lin.bias is None else lin.bias[idx])
        if isinstance(lin, Int4Linear):
            idx = _torch_index(spans, lin.qweight.device)
            return Int4Linear(lin.unpack()[idx], lin.scale[idx], lin.zero[idx],
                              None if lin.bias is None else lin.bias[idx], lin.group_size)
        if isinstance(lin, Int8Linear):
            idx = _torch_index(spans, lin.qweight.device)
            return Int8Linear(lin.qweight[idx], lin.scale[idx],
                              None if lin.bias is None else lin.bias[idx])
    raise TensorParallelError(f"{name}: a {type(lin).__name__} has no tensor-parallel split")


def cut_cols(lin: nn.Module, cols: Span, bias: bool, name: str) -> nn.Module:
    """A row-parallel slice of ``lin`` (named ``name`` in errors): the input columns
    ``cols``; the bias only where ``bias``. TensorParallelError when ``cols`` cuts one of an
    int4 layer's quantization groups."""
    c0, c1 = cols.start, cols.stop
    with torch.no_grad():
        keep = lin.bias if bias else None
        if isinstance(lin, Linear):
            return _linear(lin.weight[:, c0:c1], keep)
        if isinstance(lin, Int4Linear):
            g = lin.group_size
            if c0 % g or c1 % g:  # plan_shards refused it already, given the group
                raise TensorParallelError(
                    f"{name}: columns {c0}..{c1} of {lin.in_features} cut a quantization "
                    f"group of {g} (each rank's share must be a multiple of {g})")
            return Int4Linear(lin.unpack()[:, c0:c1], lin.scale[:, c0 // g : c1 // g],
                              lin.zero[:, c0 // g : c1 // g], keep, g)
        if isinstance(lin, Int8Linear):
            return Int8Linear(lin.qweight[:, c0:c1].contiguous(), lin.scale, keep)
    raise TensorParallelError(f"{name}: a {type(lin).__name__} has no tensor-parallel split")


def _torch_index(spans: list[Span], device: torch.device) -> torch.Tensor:
    return torch.from_numpy(span_index(spans)).to(device)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
    out_f, in_f = weight.shape
    lin = Linear(in_f, out_f, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    lin.weight.copy_(weight)
    if bias is not None:
        lin.bias.copy_(bias)
    return lin
