"""Model definitions: one module per family (a spec of what it reads and consumes), shared
layers in ``layers/``, the decoder that computes them in ``causal_lm.py``.

    registry.py    model_type / GGUF architecture -> FamilySpec   (torch-free)
    spec.py        FamilySpec, ConfigField: honoured, refused and inert config fields
    arch.py        ModelArch: the shape and features every other part of the engine reads
                   (MoeArch: a mixture-of-experts block's routing and sizes; MlaDims:
                   latent attention's shape)
    tensor_plan.py which checkpoint tensors fill which parameters
    moe_config.py  mixture-of-experts config fields, read into MoeArch (Qwen, Mixtral, DeepSeek)
    llama.py, mistral.py, qwen2.py, qwen3.py   the dense families
    mixtral.py, qwen2_moe.py, qwen3_moe.py     the mixture-of-experts families
    deepseek_v2.py, deepseek_v3.py             multi-head latent attention families
    layers/        RMSNorm, RoPE, attention, MLA, MLP, the MoE block and its routers (torch)
    causal_lm.py   the decoder over the paged KV cache (torch)
    mla_lm.py      the decoder with MLA layers over the latent KV cache (torch)
    weights.py     strict loading: every tensor consumed, or the load fails (torch)
"""

from tandem.engine.models.arch import Features, ModelArch, MoeArch
from tandem.engine.models.registry import family, gguf_family, supported_model_types

__all__ = ["Features", "ModelArch", "MoeArch", "family", "gguf_family",
           "supported_model_types"]
