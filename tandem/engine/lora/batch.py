"""One step's adapters: which rows run under which adapter, and the batched delta.

    rows:     [ base | a1 a1 a1 | base | a2 | a1 ]          (a step's flattened tokens, [T])
    A_step:   [A_a1; A_a2]            [r1' + r2', in]        the step's adapters stacked
    B_step:   [B_a1 | B_a2]           [out, r1' + r2']       (r' = the group's n sub-modules x r)
    mask:     row t keeps only its adapter's columns          [T, r1' + r2']  (base rows: none)

    y += ((x @ A_step^T) * mask) @ B_step^T                  two matmuls per projection

A segmented gather-matmul in the form dense kernels run well: every row meets every
adapter of the step in the first (low-rank, cheap) matmul, the mask keeps its own adapter's
columns, and the second matmul adds exactly that adapter's delta (what punica's SGMV computes
per segment). Two matmuls per projection whatever the number of adapters, instead of a
gather, two matmuls and a scatter per adapter: on the CPU the per-adapter loop's small ops
cost more than the arithmetic. The first matmul does S times the work of one adapter's (S:
adapters in the step), negligible beside the base projection. The stacks are built once per
set of adapters and reused while the set stays the same (consecutive decode steps); the
masks once per step, shared by every layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem.engine.lora.adapter import GROUPS, LoraAdapter

# (layer, group) -> (A_step, B_step) of one ordered set of adapters
Stacks = dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def stack(adapters: Sequence[LoraAdapter], num_layers: int, dims: dict[str, tuple[int, int]]
          ) -> Stacks:
    """Each (layer, group)'s A of ``adapters`` stacked and B side by side (zeros for an
    adapter without that projection); ``dims``: group -> (in, out) features."""
    out: Stacks = {}
    ref = next(iter(adapters[0].weights.values()))[0]
    for layer in range(num_layers):
        for group, subs in GROUPS.items():
            pairs = [a.weights.get((layer, group)) for a in adapters]
            if all(p is None for p in pairs):
                continue
            fan_in, fan_out = dims[group]
            a_parts, b_parts = [], []
            for adapter, pair in zip(adapters, pairs, strict=True):
                width = len(subs) * adapter.rank
                if pair is None:
                    pair = (ref.new_zeros(width, fan_in), ref.new_zeros(fan_out, width))
                a_parts.append(pair[0])
                b_parts.append(pair[1])
            out[(layer, group)] = (torch.cat(a_parts).contiguous(),
                                   torch.cat(b_parts, dim=1).contiguous())
    return out


@dataclass(frozen=True, slots=True)
class LoraBatch:
    """A step's stacked adapters and, per group, the row mask (None: every row runs the one
    adapter of the step)."""

    stacks: Stacks
    masks: dict[str, torch.Tensor | None]

    @classmethod
    def build(cls, adapters: Sequence[LoraAdapter], row_slots: Sequence[int], stacks: Stacks,
              dtype: torch.dtype, device: torch.device) -> LoraBatch:
        """``row_slots[t]``: the index in ``adapters`` of row t's adapter (-1: the base)."""
        masks: dict[str, torch.Tensor | None] = {}
        whole = len(adapters) == 1 and all(s == 0 for s in row_slots)
        slots = torch.tensor(row_slots, dtype=torch.int64)
        for group, subs in GROUPS.items():
            if whole:
                masks[group] = None
                continue
            widths = [len(subs) * a.rank for a in adapters]
            owner = torch.repeat_interleave(torch.arange(len(adapters)), torch.tensor(widths))
            masks[group] = (slots[:, None] == owner[None, :]).to(device=device, dtype=dtype)
        return cls(stacks, masks)

    def add_delta(self, y: torch.Tensor, x: torch.Tensor, layer: int, group: str) -> None:
        """``y`` ([T, out], in place) += each row's adapter delta of ``x`` ([T, in]) for
        projection ``group`` of ``layer``."""
        pair = self.stacks.get((layer, group))
        if pair is None:
            return
        a, b = pair  # [sum r', in], [out, sum r']
        xa = x.to(a.dtype) @ a.T
        mask = self.masks[group]
        if mask is not None:
            xa.mul_(mask)
        y.add_((xa @ b.T).to(y.dtype))
