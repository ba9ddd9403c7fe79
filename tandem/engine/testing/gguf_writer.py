"""Write a GGUF of a tiny HF checkpoint as llama.cpp's ``convert_hf_to_gguf.py`` writes one, for
tests of the GGUF path on families no wheel ships a file of (Mixtral, Qwen2-MoE, Qwen3-MoE,
DeepSeek-V2/V3 as architecture ``deepseek2``).

What it takes from llama.cpp's converter: the tensor names (the gguf package's own
``TensorNameMap``), the metadata keys (``GGUFWriter``'s ``add_*``), a MoE layer's experts
stacked on a first axis per part (``experts.{e}.w1`` -> ``ffn_gate_exps`` [E, I, hidden]), the
rows of Q and K permuted for the ``llama`` architecture (its ``LlamaModel.permute``), routers
and norms kept F32, every other weight quantized to ``qtype`` with the gguf package's
reference quantizer. Mixtral is written as llama.cpp writes it: architecture ``llama`` with
``llama.expert_count``. No tokenizer is written (tiny checkpoints have none). On tiny
Mixtral, Qwen2-MoE and Qwen3-MoE checkpoints its F32 files hold the tensors (names, shapes,
bytes) and model metadata of llama.cpp's converter's, which is no test dependency here.

DeepSeek as llama.cpp writes it: MLA's dims in ``attention.*`` keys, the router's gating
function, scale and renormalisation (no expert groups: llama.cpp's converter writes none for
``deepseek2``; a test adds them as ``metadata``), YaRN as ``rope.scaling.*`` with the log
multiplier ``0.1 * mscale_all_dim``; ``kv_b_proj`` split into ``attn_k_b`` (per head,
transposed) and ``attn_v_b`` with the MLA metadata of llama.cpp's MLA graph, or (``split_kv_b``
False) kept whole as ``attn_kv_b`` with the metadata of the files of before it. A tensor
whose rows are not whole quantization blocks stays F32, as llama.cpp's converter falls back.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

_ARCH = {"mixtral": "LLAMA", "qwen2_moe": "QWEN2MOE", "qwen3_moe": "QWEN3MOE",
         "deepseek_v2": "DEEPSEEK2", "deepseek_v3": "DEEPSEEK2"}
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


def _split_kv_b(tensors: dict[str, np.ndarray], config: dict) -> dict[str, np.ndarray]:
    """llama.cpp's MLA split of every ``kv_b_proj``: ``k_b_proj`` [H, rank, nope] (per head,
    transposed) and ``v_b_proj`` [H, v, rank]."""
    heads, nope = config["num_attention_heads"], config["qk_nope_head_dim"]
    out = {}
    for name, value in tensors.items():
        if not name.endswith("kv_b_proj.weight"):
            out[name] = value
            continue
        kv_b = value.reshape(heads, nope + config["v_head_dim"], value.shape[-1])
        out[name.replace("kv_b_proj", "k_b_proj")] = np.ascontiguousarray(
            kv_b[:, :nope].transpose(0, 2, 1))
        out[name.replace("kv_b_proj", "v_b_proj")] = np.ascontiguousarray(kv_b[:, nope:])
    return out


def _deepseek_metadata(writer: Any, config: dict, split_kv_b: bool) -> None:
    """The ``deepseek2`` keys llama.cpp's converter writes for ``config``."""
    import gguf

    rank, rope = config["kv_lora_rank"], config["qk_rope_head_dim"]
    qk = config["qk_nope_head_dim"] + rope
    writer.add_vocab_size(config["vocab_size"])
    writer.add_leading_dense_block_count(config["first_k_dense_replace"])
    if config.get("q_lora_rank"):
        writer.add_q_lora_rank(config["q_lora_rank"])
    writer.add_kv_lora_rank(rank)
    if split_kv_b:  # MLA's one latent "head": keys rank + rope wide, values rank wide
        writer.add_head_count_kv(1)
        writer.add_key_length(rank + rope)
        writer.add_value_length(rank)
        writer.add_key_length_mla(qk)
        writer.add_value_length_mla(config["v_head_dim"])
    else:
        writer.add_head_count_kv(config["num_key_value_heads"])
        writer.add_key_length(qk)
        writer.add_value_length(config["v_head_dim"])
    writer.add_rope_dimension_count(rope)
    writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    writer.add_expert_count(config["n_routed_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_expert_shared_count(config["n_shared_experts"])
    writer.add_expert_weights_scale(config["routed_scaling_factor"])
    if config.get("norm_topk_prob"):
        writer.add_expert_weights_norm(True)
    v3 = config["model_type"] == "deepseek_v3"
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if v3
                                  else gguf.ExpertGatingFuncType.SOFTMAX)
    rope_params = config["rope_parameters"]
    if rope_params.get("rope_type") == "yarn":
        if rope_params.get("mscale", 1.0) != rope_params.get("mscale_all_dim"):
            raise ValueError("llama.cpp computes YaRN with mscale = mscale_all_dim")
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope_params["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope_params["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_log_mul(0.1 * rope_params["mscale_all_dim"])


def write_gguf(checkpoint: str | Path, out: str | Path, qtype: str = "F32",
               metadata: dict[str, object] | None = None,
               extra_tensors: dict[str, np.ndarray] | None = None,
               stacked: bool = True, split_kv_b: bool = True) -> Path:
    """Write the HF checkpoint at ``checkpoint`` (one safetensors file) to the GGUF ``out``,
    its weights as ``qtype`` (F32, Q4_0, Q4_1, Q8_0); return ``out``. ``metadata`` (key ->
    str, float or int value) and ``extra_tensors`` (GGUF name -> F32 array) are written
    too: what a test of refusals adds. ``stacked`` False writes a Mixtral's experts one
    tensor each, ``blk.i.ffn_{gate,up,down}.e``, as llama.cpp did before it stacked them.
    ``split_kv_b`` (DeepSeek): MLA's ``attn_k_b``/``attn_v_b``, else ``attn_kv_b``."""
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
    deepseek = arch == gguf.MODEL_ARCH.DEEPSEEK2
    layers = config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_block_count(layers)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    if deepseek:
        _deepseek_metadata(writer, config, split_kv_b)
    else:
        _moe_metadata(writer, config, arch)
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
    if deepseek and split_kv_b:
        tensors = _split_kv_b(tensors, config)
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
    block = gguf.GGML_QUANT_SIZES[quant][0]
    for hf_name, value in items:
        # the router's correction bias: llama.cpp maps the gate's "e_score_correction" + .bias
        mapped = hf_name.replace("e_score_correction_bias", "e_score_correction.bias")
        base, suffix = mapped.rsplit(".", 1)
        name = base if hf_name in legacy else names.get_name(base)
        if name is None:
            raise ValueError(f"no GGUF name for {hf_name}")
        value = value.astype(np.float32)
        if arch == gguf.MODEL_ARCH.LLAMA and name.endswith("attn_q"):
            value = _permute(value, heads)
        elif arch == gguf.MODEL_ARCH.LLAMA and name.endswith("attn_k"):
            value = _permute(value, kv_heads)
        full = f"{name}.{suffix}"
        if (value.ndim < 2 or quant == gguf.GGMLQuantizationType.F32
                or name.split(".")[-1] in _FLOAT_KEPT or value.shape[-1] % block):
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


def _moe_metadata(writer: Any, config: dict, arch: Any) -> None:
    """The keys llama.cpp's converter writes for Mixtral, Qwen2-MoE and Qwen3-MoE."""
    import gguf

    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    writer.add_head_count_kv(config["num_key_value_heads"])
    if arch == gguf.MODEL_ARCH.LLAMA:
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(head_dim)
    if config["model_type"] == "qwen3_moe":  # Qwen3 decouples head_dim from hidden / heads
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_expert_count(config.get("num_local_experts") or config["num_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    if "moe_intermediate_size" in config:
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if config.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
