"""Perplexity of an engine's model on a token sequence, through its own paged-cache forward.

The text runs as one sequence in prefill chunks of ``chunk`` tokens over a private cache laid
out like the engine's (same dtype, int8 scales included), with the engine's attention backend
(so int8 KV is in the measurement). Chunks of fewer rows than the quantized layers' dequant
threshold take the decode kernels (bf16 activations); larger chunks measure the quantized
weights exactly in fp32. ``fused=True`` runs every chunk through the runner's fused native
forward instead (engine/native: int16 activations), the path CPU decode steps take.

    perplexity = exp(mean over t of -log p(x[t+1] | x[..t]))
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from engine.attention import AttentionMetadata
from engine.model_runner import ModelRunner


@torch.inference_mode()
def token_nlls(
    runner: ModelRunner, token_ids: Sequence[int], chunk: int = 256, fused: bool = False
) -> torch.Tensor:
    """Negative log-likelihood of each token after the first: ``[len(token_ids) - 1]`` fp32."""
    if len(token_ids) < 2:
        raise ValueError("need at least two tokens")
    if fused and runner.fused is None:
        raise ValueError("this runner has no fused native forward")
    model, bs, dev = runner.model, runner.block_size, runner.device
    n = len(token_ids)
    num_blocks = -(-n // bs)
    shape = list(runner.kv_cache.shape)
    shape[2] = num_blocks
    kv = torch.zeros(shape, dtype=runner.kv_cache.dtype, device=dev)  # private cache
    table = torch.arange(num_blocks, dtype=torch.int32, device=dev)[None, :]
    ids = torch.tensor(list(token_ids), dtype=torch.int64, device=dev)
    nlls: list[torch.Tensor] = []
    for start in range(0, n - 1, chunk):
        end = min(n - 1, start + chunk)  # rows start..end-1 predict tokens start+1..end
        q = end - start
        meta = AttentionMetadata(
            query_start_loc=torch.tensor([0, q], dtype=torch.int32, device=dev),
            seq_lens=torch.tensor([end], dtype=torch.int32, device=dev),
            block_tables=table,
            slot_mapping=torch.arange(start, end, dtype=torch.int64, device=dev),
            query_lens_cpu=[q],
            seq_lens_cpu=[end],
            num_decodes=1 if q == 1 else 0,
            block_size=bs,
        )
        positions = torch.arange(start, end, dtype=torch.int64, device=dev)
        if fused:
            logits = runner.fused(token_ids[start:end], range(start, end), [0] * q,
                                  [range(num_blocks)], kv, range(q))
        else:
            hidden = model(ids[start:end], positions, kv, meta, runner.backend)
            logits = model.compute_logits(hidden)  # [q, V] fp32
        nlls.append(torch.nn.functional.cross_entropy(logits, ids[start + 1 : end + 1],
                                                      reduction="none").cpu())
    return torch.cat(nlls)


def perplexity(
    runner: ModelRunner, token_ids: Sequence[int], chunk: int = 256, fused: bool = False
) -> float:
    """``exp`` of the mean token NLL (see ``token_nlls``)."""
    return math.exp(token_nlls(runner, token_ids, chunk, fused).mean().item())
