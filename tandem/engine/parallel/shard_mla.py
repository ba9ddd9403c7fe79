"""Cut one multi-head latent attention layer (layers/mla.py) to a rank's query heads.

    q_proj | q_b_proj   column-parallel: rows of heads [h0, h1) (qk_head_dim rows each)
    kv_b_proj           column-parallel: rows of the same heads (nope + v rows each): their
                        W_UK and W_UV, so absorbed decode and decompressed prefill read only
                        this rank's heads
    o_proj              row-parallel: input columns of those heads (v_head_dim each), then
                        all-reduce (shard.reduce_row_parallel, as for every attention)
    q_a_proj, q_a_layernorm, kv_a_proj_with_mqa, kv_a_layernorm   whole on every rank

Every rank computes the same latent row per token and writes it to its own cache, so each
rank's latent cache is the whole one (the plan's single KV head, replicated: vLLM does the
same); its heads attend over it with their own slice of kv_b_proj. The per-head math is
unchanged, so the ranks' o_proj partials sum to the one-process output.
"""

from __future__ import annotations

import torch
from torch import nn

from tandem.engine.models.layers.mla import MlaAttention
from tandem.engine.parallel.cut import cut_cols, cut_rows, span_index
from tandem.engine.parallel.plan import RankShard, Span


def shard_mla(attn: MlaAttention, shard: RankShard, prefix: str,
              cuts: dict[str, list[Span] | Span]) -> None:
    """Keep ``shard``'s query heads of ``attn`` (module name ``prefix``), in place; record
    what was kept of each cut linear in ``cuts``."""
    heads = shard.q_heads
    q_name = "q_b_proj" if attn.q_lora else "q_proj"
    q_rows = [heads.scaled(attn.qk)]
    kv_rows = [heads.scaled(attn.nope + attn.vd)]
    o_cols = heads.scaled(attn.vd)
    cuts[prefix + q_name], cuts[prefix + "kv_b_proj"] = q_rows, kv_rows
    cuts[prefix + "o_proj"] = o_cols
    setattr(attn, q_name, cut_rows(getattr(attn, q_name), q_rows, prefix + q_name))
    attn.kv_b_proj = _rows_of(attn.kv_b_proj, kv_rows, prefix + "kv_b_proj")
    attn.o_proj = cut_cols(attn.o_proj, o_cols, shard.adds_bias, prefix + "o_proj")
    attn.nh = heads.size


def _rows_of(lin: nn.Module, rows: list[Span], name: str) -> nn.Module:
    """kv_b_proj's rows: a plain ``nn.Linear`` (absorption reads its weight), or any layer
    cut.py cuts."""
    if type(lin) is not nn.Linear:
        return cut_rows(lin, rows, name)
    with torch.no_grad():
        w = lin.weight[torch.from_numpy(span_index(rows)).to(lin.weight.device)]
        out = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        out.weight.copy_(w)
    return out
