"""One step's adapters: which rows run under which adapter, and the batched delta.

    rows:    [ base | a1 a1 a1 | base | a2 | a1 ]      (a step's flattened tokens, [T])
    groups:  a1 -> rows {1, 2, 3, 6}    a2 -> rows {5}  (the base rows get nothing)

    y[rows_a] += (x[rows_a] @ A_a^T) @ B_a^T           per adapter a in the step

A gather-matmul per adapter slot, as punica's segmented kernels compute it: the rows of one
adapter are gathered once, multiplied by its two low-rank matrices and added back in place
(``index_add_``). The groups are built once a step and serve every layer and projection; a
step where every row runs one adapter skips the gather.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tandem.engine.lora.adapter import LoraAdapter


@dataclass(frozen=True, slots=True)
class LoraBatch:
    """The step's (adapter, row indices) groups; ``None`` indices: every row of the step."""

    groups: tuple[tuple[LoraAdapter, torch.Tensor | None], ...]

    @classmethod
    def build(cls, row_adapters: Sequence[LoraAdapter | None], device: torch.device
              ) -> LoraBatch:
        """Group a step's rows (``None``: the base model) by adapter, first seen first."""
        rows: dict[str, list[int]] = {}
        by_name: dict[str, LoraAdapter] = {}
        for i, adapter in enumerate(row_adapters):
            if adapter is not None:
                rows.setdefault(adapter.name, []).append(i)
                by_name[adapter.name] = adapter
        whole = len(rows) == 1 and len(next(iter(rows.values()))) == len(row_adapters)
        return cls(tuple(
            (by_name[name], None if whole else torch.tensor(ids, dtype=torch.int64,
                                                            device=device))
            for name, ids in rows.items()))

    def add_delta(self, y: torch.Tensor, x: torch.Tensor, layer: int, group: str) -> None:
        """``y`` ([T, out], in place) += each adapter's low-rank delta of ``x`` ([T, in]) on
        its rows, for projection ``group`` of ``layer`` (adapters without it add nothing)."""
        for adapter, rows in self.groups:
            pair = adapter.weights.get((layer, group))
            if pair is None:
                continue
            a, b = pair  # [n r, in], [out, n r]
            if rows is None:
                y.add_(((x @ a.T) @ b.T).to(y.dtype))
            else:
                y.index_add_(0, rows, ((x.index_select(0, rows) @ a.T) @ b.T).to(y.dtype))
