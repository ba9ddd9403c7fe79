"""Routers of mixture-of-experts layers: router logits -> each token's experts and weights.

Pure functions over fp32 logits ``[T, E]``, returning ``(weights [T, k] fp32, ids [T, k]
int64)``; the numerics follow transformers' routers (and DeepSeek's reference code) so greedy
output matches ``generate()``:

    softmax_topk        Mixtral (renormalised), Qwen2-MoE / Qwen3-MoE (``norm_topk_prob``)
    deepseek_v2_topk    softmax; greedy or group-limited greedy top-k; routed scaling
    deepseek_v3_topk    sigmoid; bias-corrected choice within the best groups; routed scaling

:class:`Router` holds the router's weights and picks one by ``MoeArch.routing``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tandem.engine.models.arch import MoeArch

ROUTINGS = ("softmax", "deepseek_v2", "deepseek_v3")
V2_TOPK_METHODS = ("greedy", "group_limited_greedy")


def softmax_topk(logits: torch.Tensor, k: int, norm_topk_prob: bool,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over all experts, the ``k`` best, renormalised to sum to one when
    ``norm_topk_prob`` (then equal to a softmax over the ``k`` best logits: Mixtral)."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def _group_mask(group_scores: torch.Tensor, topk_group: int, num_experts: int) -> torch.Tensor:
    """``[T, E]`` bool: the experts of each token's ``topk_group`` best groups."""
    t, n_group = group_scores.shape
    best = torch.topk(group_scores, topk_group, dim=-1, sorted=False).indices  # [T, topk_group]
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best, True)
    return mask[:, :, None].expand(t, n_group, num_experts // n_group).reshape(t, num_experts)


def deepseek_v2_topk(logits: torch.Tensor, k: int, topk_method: str, n_group: int,
                     topk_group: int, routed_scaling_factor: float,
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2: softmax scores; ``greedy`` takes the ``k`` best experts,
    ``group_limited_greedy`` the ``k`` best within the ``topk_group`` groups (of ``n_group``)
    whose best expert scores highest; the weights are their scores x
    ``routed_scaling_factor``."""
    scores = torch.softmax(logits.float(), dim=-1)
    if topk_method == "group_limited_greedy":
        e = scores.shape[-1]
        group_scores = scores.view(-1, n_group, e // n_group).amax(dim=-1)
        scores = scores.masked_fill(~_group_mask(group_scores, topk_group, e), 0.0)
    elif topk_method != "greedy":
        raise ValueError(f"topk_method {topk_method!r}: one of {V2_TOPK_METHODS}")
    weights, ids = torch.topk(scores, k, dim=-1, sorted=False)
    return weights * routed_scaling_factor, ids


def deepseek_v3_topk(logits: torch.Tensor, correction_bias: torch.Tensor, k: int,
                     n_group: int, topk_group: int, routed_scaling_factor: float,
                     norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 (``noaux_tc``): sigmoid scores; the experts are chosen on scores +
    ``correction_bias`` (the load-balancing bias), among the ``topk_group`` groups whose two
    best corrected scores sum highest; the weights are the chosen experts' uncorrected
    scores, renormalised when ``norm_topk_prob``, x ``routed_scaling_factor``."""
    scores = torch.sigmoid(logits.float())
    choice = scores + correction_bias.float()
    e = scores.shape[-1]
    group_scores = choice.view(-1, n_group, e // n_group).topk(2, dim=-1).values.sum(dim=-1)
    choice = choice.masked_fill(~_group_mask(group_scores, topk_group, e), float("-inf"))
    ids = torch.topk(choice, k, dim=-1, sorted=False).indices
    weights = scores.gather(1, ids)
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routed_scaling_factor, ids


class Router(nn.Module):
    """The router of one MoE layer: ``weight`` ``[E, hidden]`` (never quantized: it is small
    and the choice of experts is sensitive to it), and DeepSeek-V3's
    ``e_score_correction_bias`` ``[E]``. DeepSeek's routers are held and score in fp32 (as
    transformers' do); the softmax routers in the model dtype, softmaxed in fp32."""

    def __init__(self, hidden_size: int, moe: MoeArch) -> None:
        super().__init__()
        if moe.routing not in ROUTINGS:
            raise ValueError(f"routing {moe.routing!r}: one of {ROUTINGS}")
        if moe.routing != "softmax" and moe.num_experts % moe.n_group:
            raise ValueError(f"{moe.num_experts} experts do not split into {moe.n_group} groups")
        self.moe = moe
        self.weight = nn.Parameter(torch.empty(moe.num_experts, hidden_size))
        self.e_score_correction_bias = (nn.Parameter(torch.zeros(moe.num_experts))
                                        if moe.routing == "deepseek_v3" else None)

    def _apply(self, fn, recurse: bool = True):  # type: ignore[no-untyped-def]
        """DeepSeek's router weights (and V3's bias) stay fp32 in a 16-bit model, as
        transformers keeps them (``_keep_in_fp32_modules_strict``): a model-wide
        ``.to(dtype)`` before loading leaves room for their fp32 values."""
        super()._apply(fn, recurse)
        if self.moe.routing != "softmax":
            for p in self.parameters(recurse=False):
                if p.is_floating_point() and p.dtype != torch.float32:
                    p.data = p.data.float()
        return self

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[T, hidden]`` -> (weights ``[T, k]`` fp32, expert ids ``[T, k]``)."""
        m = self.moe
        if m.routing == "softmax":
            return softmax_topk(F.linear(x, self.weight), m.top_k, m.norm_topk_prob)
        logits = F.linear(x.float(), self.weight.float())
        if m.routing == "deepseek_v2":
            return deepseek_v2_topk(logits, m.top_k, m.topk_method, m.n_group, m.topk_group,
                                    m.routed_scaling_factor)
        assert self.e_score_correction_bias is not None
        return deepseek_v3_topk(logits, self.e_score_correction_bias, m.top_k, m.n_group,
                                m.topk_group, m.routed_scaling_factor, m.norm_topk_prob)
