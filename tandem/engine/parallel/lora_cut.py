"""A LoRA adapter cut to one rank's shard, as vLLM and S-LoRA split it.

    column-parallel base (qkv_proj, gate_up_proj): the whole A, B's rows of the base cut
        rank r: y_r += B_r (A x)                      (its own output rows, exactly)
    row-parallel base (o_proj, down_proj): A's input columns of the base cut, the whole B
        rank r: y_r += B (A_r x_r)   then the base's all-reduce:  sum_r B A_r x_r = B A x

So an adapted step needs no collective beyond the base model's: the row-parallel delta joins
the rank's partial product before the all-reduce (the manager hooks the layer inside
``AllReduce``: tandem/engine/lora/manager.py). The fused B is block-diagonal per sub-module
(tandem/engine/lora/adapter.py); cutting its rows by the base's Q, K, V (gate, up) spans keeps
each sub-module's block with its own rows, KV heads replicated over ranks included.
"""

from __future__ import annotations

import dataclasses

import torch

from tandem.engine.lora.adapter import LoraAdapter
from tandem.engine.parallel.cut import span_index
from tandem.engine.parallel.plan import RankShard, Span


def cut_adapter(adapter: LoraAdapter, shard: RankShard) -> LoraAdapter:
    """``adapter`` as rank ``shard.rank`` holds it (the model's own dense MLP width: LoRA is
    served on dense models only)."""
    rows = {"qkv_proj": shard.qkv_rows(), "gate_up_proj": shard.gate_up_rows()}
    cols = {"o_proj": shard.o_cols(), "down_proj": shard.down_cols()}
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for (layer, group), (a, b) in adapter.weights.items():
        if group in rows:
            idx = torch.from_numpy(span_index(rows[group])).to(b.device)
            weights[(layer, group)] = (a, b[idx].contiguous())
        else:
            c: Span = cols[group]
            weights[(layer, group)] = (a[:, c.start:c.stop].contiguous(), b)
    return dataclasses.replace(adapter, weights=weights)
