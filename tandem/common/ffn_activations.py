"""Bytes per token a step's feed-forward keeps live at once: a gated MLP's, or a mixture-of-
experts layer's, as tandem/engine/models/layers (mlp.py, moe.py, moe_experts.py,
moe_routing.py) compute them. The engine's activation reserve (tandem/engine/kv_budget.py)
and the planner's (tandem/planner/roofline.py) both count them here. Torch-free.

    gated MLP   gate and up (2 I), act(gate), their product (I each), the output (hidden)
    MoE layer   router logits (fp32 for DeepSeek's routers, with the input in fp32) and three
                fp32 working copies (scores, corrected choice, its mask), E each; top-k
                weights and ids; per (token, expert) slot (k a token): the gathered input and
                the expert's output (hidden each), that output in fp32 and weighted (hidden
                each, fp32), three int64 indices (sort order, token, sort scratch); one
                expert's gated MLP at a time over at most every token of the step (a token
                picks an expert once); the summed output; a shared expert's MLP, output and
                gate

The experts run one after another, so one expert's intermediate is live at a time, but an
expert may take every token of the step.
"""

from __future__ import annotations

FP32, INDEX = 4, 8  # bytes of an fp32 value, of an int64 index


def gated_mlp_bytes(width: int, hidden: int, act_bytes: int) -> int:
    """Bytes per row of one gated MLP ``width`` wide."""
    return act_bytes * (4 * width + hidden)


def moe_layer_bytes(hidden: int, num_experts: int, top_k: int, expert_width: int,
                    act_bytes: int, *, shared_width: int = 0, shared_gate: bool = False,
                    fp32_router: bool = False) -> int:
    """Bytes per token of one mixture-of-experts layer (the module docstring's MoE row):
    ``num_experts`` experts ``expert_width`` wide, ``top_k`` a token, a shared expert
    ``shared_width`` wide (0: none) behind a sigmoid gate when ``shared_gate``."""
    e, k = num_experts, top_k
    router = (e * (FP32 if fp32_router else act_bytes) + 3 * e * FP32 + k * (FP32 + INDEX)
              + (hidden * FP32 if fp32_router else 0))
    slots = k * (2 * hidden * act_bytes + 2 * hidden * FP32 + 3 * INDEX)
    expert = gated_mlp_bytes(expert_width, hidden, act_bytes)
    summed = hidden * act_bytes
    shared = 0
    if shared_width:
        shared = gated_mlp_bytes(shared_width, hidden, act_bytes)
        if shared_gate:
            shared += act_bytes * (1 + hidden)  # the gate and the gated output
    return router + slots + expert + summed + shared
