"""Apply the grammar masks of a step's constrained rows to its logits, in place.

One bitmask row per logits row is allocated (xgrammar's kernel indexes both alike) but only
the constrained rows are filled and applied: a disallowed token's logit becomes -inf.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import xgrammar as xgr

from tandem.engine.structured.constraint import Constraint


def apply_constraints(
    x: torch.Tensor, rows: Sequence[int], constraints: Sequence[Constraint],
    pending: Sequence[Sequence[int]],
) -> None:
    """Mask x: [B, V] (float32, CPU) at ``rows``; row j's state is ``constraints[j]`` after
    ``pending[j]`` (speculative drafts not yet accepted)."""
    bitmask = xgr.allocate_token_bitmask(x.shape[0], x.shape[1])
    for row, con, extra in zip(rows, constraints, pending, strict=True):
        con.fill(bitmask, row, extra)
    xgr.apply_token_bitmask_inplace(x, bitmask, vocab_size=x.shape[1], indices=list(rows))
