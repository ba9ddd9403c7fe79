"""The routed experts of one MoE layer, computed expert by expert over grouped rows.

A step's T tokens each pick k experts. Rather than run each token through its experts (k
small matmuls per token, every expert's weights read once per token routed to it), the
``T x k`` (token, expert) slots are sorted by expert, and each *active* expert runs one
matmul over all the rows routed to it: its weights are read once per step, whatever the
batch. Decoding many sequences, an expert serves many rows at the cost of one.

    ids [T, k] --flatten, stable sort--> slots grouped by expert: e0 e0 e0 | e2 | e5 e5 ...
    x[token of slot] --expert e's MLP, one call per group--> y [T*k, hidden]
    out[token] += weight[slot] * y[slot]                    (index_add, in expert order)

Under expert parallelism (tandem/engine/parallel/plan.py) a rank holds a contiguous range
``held`` of the experts; the others are :class:`AbsentExpert` placeholders (no weights, so
their names stay the checkpoint's expert ids). Sorted by expert, the held experts' slots are
one run ``[lo, hi)`` of the sorted slots, so only those rows are gathered and computed; a
token routed to none of them gets zero here (its experts' ranks add theirs in the block's
all-reduce).

The experts are ordinary gated MLPs (tandem/engine/models/layers/mlp.py) of our ``Linear``
layers, so every weight format the dense path loads (float, int8/int4, AWQ/GPTQ/
compressed-tensors, the native kernels' packed layout) serves them unchanged.
"""

from __future__ import annotations

import torch
from torch import nn

from tandem.engine.models.arch import ModelArch
from tandem.engine.models.layers.mlp import MLP


class AbsentExpert(nn.Module):
    """The place of an expert another rank of an expert-parallel group holds: no weights."""


class Experts(nn.ModuleList):
    """``num_experts`` gated MLPs of width ``intermediate_size``, no biases (expert ``e`` is
    ``self[e]``); ``held`` the ones this process holds (all, until :meth:`keep`)."""

    def __init__(self, arch: ModelArch, num_experts: int, intermediate_size: int) -> None:
        super().__init__(MLP(arch, intermediate_size, bias=False) for _ in range(num_experts))
        self.held = range(num_experts)

    def keep(self, held: range) -> None:
        """Hold experts ``held`` only (one rank's under expert parallelism), an
        :class:`AbsentExpert` in each other's place: done before the weights are loaded."""
        if held.step != 1 or held.start < 0 or held.stop > len(self) or held.start > held.stop:
            raise ValueError(f"held experts {held} are not a range of the {len(self)}")
        for e in range(len(self)):
            if e not in held:
                self[e] = AbsentExpert()
        self.held = held

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                ) -> torch.Tensor:
        """``x`` ``[T, hidden]``, each token's experts ``ids`` ``[T, k]`` and their ``weights``
        ``[T, k]`` (fp32) -> ``sum_j weights[t, j] * expert_{ids[t, j]}(x[t])`` ``[T, hidden]``,
        the sum over the held experts only."""
        k = ids.shape[1]
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # slots grouped by expert, token order within
        counts = torch.bincount(flat, minlength=len(self)).tolist()
        held = self.held
        if len(held) < len(self):  # the held experts' slots: one run of the sorted ones
            lo = sum(counts[:held.start])
            order = order[lo:lo + sum(counts[held.start:held.stop])]
        rows = order // k  # the token of each sorted slot
        xs = x.index_select(0, rows)  # [S, hidden], S = T*k when every expert is held
        ys = torch.empty_like(xs)
        lo = 0
        for e in held:
            n = counts[e]
            if n:
                ys[lo:lo + n] = self[e](xs[lo:lo + n])
                lo += n
        ys = (ys.float() * weights.reshape(-1)[order, None]).to(x.dtype)
        return torch.zeros_like(x).index_add_(0, rows, ys)


def per_row_reference(experts: Experts, x: torch.Tensor, ids: torch.Tensor,
                      weights: torch.Tensor) -> torch.Tensor:
    """What :meth:`Experts.forward` computes, one token and one expert at a time (the
    reference the grouped compute is tested against)."""
    out = torch.zeros_like(x, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            if int(ids[t, j]) not in experts.held:
                continue
            y = experts[int(ids[t, j])](x[t:t + 1])[0]
            out[t] += weights[t, j].float() * y.float()
    return out.to(x.dtype)
