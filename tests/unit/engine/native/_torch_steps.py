"""The torch forward of an engine's model over one step's rows, the reference the fused native
forward's logits are compared with (test_fused_moe.py, test_fused_deepseek.py,
test_fused_mla_prefill.py)."""

from __future__ import annotations

import torch
from torch import nn

from tandem.engine.attention import AttentionMetadata
from tandem.engine.attention.base import AttentionBackend


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``|a - b| / |b|`` (Frobenius), in float64."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def torch_logits(runner, ids, positions, seq, tables, kv, model: nn.Module | None = None,  # noqa: ANN001
                 backend: AttentionBackend | None = None) -> torch.Tensor:
    """The torch forward (of ``model`` over ``backend``; default: the runner's) over rows of
    several sequences (each sequence's rows together, in order; decode sequences first),
    logits of every row."""
    bs, order = runner.block_size, sorted(set(seq), key=seq.index)
    qlens = [seq.count(s) for s in order]
    seq_lens = [max(p for p, s2 in zip(positions, seq, strict=True) if s2 == s) + 1
                for s in order]
    slots = [tables[s][p // bs] * bs + p % bs for p, s in zip(positions, seq, strict=True)]
    meta = AttentionMetadata.build(qlens, seq_lens, [tables[s] for s in order], slots, bs,
                                   torch.device("cpu"))
    with torch.inference_mode():
        model = runner.model if model is None else model
        hidden = model(torch.tensor(ids), torch.tensor(positions), kv, meta,
                       runner.backend if backend is None else backend)
        return model.compute_logits(hidden).float()
