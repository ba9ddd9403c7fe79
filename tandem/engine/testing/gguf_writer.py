"""Write a GGUF of a tiny HF checkpoint as llama.cpp's ``convert_hf_to_gguf.py`` writes one, for
tests of the GGUF path on families no wheel ships a file of (Mixtral, Qwen2-MoE, Qwen3-MoE).

What it takes from llama.cpp's converter: the tensor names (the gguf package's own
``TensorNameMap``), the metadata keys (``GGUFWriter``'s ``add_*``), a MoE layer's experts
stacked on a first axis per part (``experts.{e}.w1`` -> ``ffn_gate_exps`` [E, I, hidden]), the
rows of Q and K permuted for the ``llama`` architecture (its ``LlamaModel.permute``), routers
and norms kept F32, every other weight quantized to ``qtype`` with the gguf package's
reference quantizer. Mixtral is written as llama.cpp writes it: architecture ``llama`` with
``llama.expert_count``. No tokenizer is written (tiny checkpoints have none). On tiny
Mixtral, Qwen2-MoE and Qwen3-MoE checkpoints its F32 files hold the tensors (names, shapes,
bytes) and model metadata of llama.cpp's converter's, which is no test dependency here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

_ARCH = {"mixtral": "LLAMA", "qwen2_moe": "QWEN2MOE", "qwen3_moe": "QWEN3MOE"}
_PER_EXPERT = re.compile(r"(.*\.experts)\.(\d+)\.(\w+)\.weight")
_FLOAT_KEPT = ("ffn_gate_inp", "ffn_gate_inp_shexp")  # routers: llama.cpp never quantizes them


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's ``LlamaModel.permute``: each head's rotary halves interleaved."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _stack_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``...experts.{e}.{w}.weight`` of every expert -> ``...experts.{w}.weight`` [E, ...]."""
    out: dict[str, np.ndarray] = {}
    grouped: dict[str, dict[int, np.ndarray]] = {}
    for name, value in tensors.items():
        m = _PER_EXPERT.fullmatch(name)
        if m is None:
            out[name] = value
        else:
            grouped.setdefault(f"{m.group(1)}.{m.group(3)}.weight", {})[int(m.group(2))] = value
    for name, experts in grouped.items():
        out[name] = np.stack([experts[e] for e in range(len(experts))])
    return out


def write_gguf(checkpoint: str | Path, out: str | Path, qtype: str = "F32",
               metadata: dict[str, object] | None = None,
               extra_tensors: dict[str, np.ndarray] | None = None,
               stacked: bool = True) -> Path:
    """Write the HF checkpoint at ``checkpoint`` (one safetensors file) to the GGUF ``out``,
    its weights as ``qtype`` (F32, Q4_0, Q4_1, Q8_0); return ``out``. ``metadata`` (key ->
    str, float or int value) and ``extra_tensors`` (GGUF name -> F32 array) are written
    too: what a test of refusals adds. ``stacked`` False writes a Mixtral's experts one
    tensor each, ``blk.i.ffn_{gate,up,down}.e``, as llama.cpp did before it stacked them."""
    import gguf
    from safetensors.numpy import load_file

    path, out = Path(checkpoint), Path(out)
    config = json.loads((path / "config.json").read_text())
    model_type = config["model_type"]
    if model_type not in _ARCH:
        raise ValueError(f"model_type must be one of {tuple(_ARCH)}")
    # what llama.cpp's graph computes for each architecture (src/models/*.cpp)
    if model_type == "qwen3_moe" and not config.get("norm_topk_prob"):
        raise ValueError("llama.cpp's qwen3moe renormalises the top-k: norm_topk_prob=True")
    if model_type == "qwen2_moe" and config.get("norm_topk_prob"):
        raise ValueError("llama.cpp's qwen2moe does not renormalise: norm_topk_prob=False")
    arch = gguf.MODEL_ARCH[_ARCH[model_type]]
    layers = config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_block_count(layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    if arch == gguf.MODEL_ARCH.LLAMA:
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(head_dim)
    if model_type == "qwen3_moe":  # Qwen3 decouples head_dim from hidden / heads
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_expert_count(config.get("num_local_experts") or config["num_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    if "moe_intermediate_size" in config:
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if config.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    for key, value in (metadata or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, int(value))  # type: ignore[call-overload]

    names = gguf.get_tensor_name_map(arch, layers)
    quant = gguf.GGMLQuantizationType[qtype]
    tensors = load_file(str(path / "model.safetensors"))
    legacy: dict[str, np.ndarray] = {}
    if stacked:
        tensors = _stack_experts(tensors)
    elif model_type == "mixtral":
        parts = {"w1": "gate", "w3": "up", "w2": "down"}
        for hf_name in [n for n in tensors if _PER_EXPERT.fullmatch(n)]:
            m = _PER_EXPERT.fullmatch(hf_name)
            assert m is not None
            layer = hf_name.split(".")[2]
            legacy[f"blk.{layer}.ffn_{parts[m.group(3)]}.{m.group(2)}.weight"] = tensors.pop(
                hf_name)
    else:
        raise ValueError("experts one tensor each: Mixtral only (llama.cpp's old layout)")
    items = sorted(tensors.items()) + sorted(legacy.items())
    for hf_name, value in items:
        base, suffix = hf_name.rsplit(".", 1)
        name = base if hf_name in legacy else names.get_name(base)
        if name is None:
            raise ValueError(f"no GGUF name for {hf_name}")
        value = value.astype(np.float32)
        if arch == gguf.MODEL_ARCH.LLAMA and name.endswith("attn_q"):
            value = _permute(value, heads)
        elif arch == gguf.MODEL_ARCH.LLAMA and name.endswith("attn_k"):
            value = _permute(value, kv_heads)
        full = f"{name}.{suffix}"
        if value.ndim < 2 or quant == gguf.GGMLQuantizationType.F32 or name.split(".")[-1] in (
                _FLOAT_KEPT):
            writer.add_tensor(full, value)
        else:
            writer.add_tensor(full, gguf.quants.quantize(value, quant), raw_dtype=quant)
    for name, value in (extra_tensors or {}).items():
        writer.add_tensor(name, value.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
