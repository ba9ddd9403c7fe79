"""GGUF checkpoints of the mixture-of-experts families, converted to an HF directory here.

transformers' GGUF loader reads a Mixtral GGUF (llama.cpp writes it as architecture ``llama``
with stacked expert tensors) as a dense Llama without its experts, and takes Qwen-MoE's
expert widths from its config defaults rather than the file; so these families are converted
by this module, from the GGUF's metadata and tensors alone:

    GGUF architecture            family      experts in the HF directory
    llama + llama.expert_count   mixtral     model.layers.i.block_sparse_moe.experts.e.w1/w3/w2
    qwen2moe                     qwen2_moe   model.layers.i.mlp.experts.e.{gate,up,down}_proj,
                                             mlp.shared_expert.*, mlp.shared_expert_gate
    qwen3moe                     qwen3_moe   model.layers.i.mlp.experts.e.{gate,up,down}_proj
    deepseek2                    deepseek_v2 (softmax router) / deepseek_v3 (sigmoid): latent
                                 attention and DeepSeek's MoE (tandem/engine/gguf_deepseek.py)

    blk.i.ffn_{gate,up,down}_exps  [E, out, in]  --split on E--> expert e's [out, in]
    blk.i.ffn_{gate,up,down}.e     [out, in]     Mixtral GGUFs of before the stacked tensors
    blk.i.ffn_gate_inp             [E, hidden]   the router (llama.cpp never quantizes it)
    blk.i.attn_q / attn_k (llama)  rows un-permuted (llama.cpp permutes them for its RoPE)

Every tensor is dequantized to fp32 with the gguf package's reference code into a
safetensors shard per run of one layer's tensors (llama.cpp writes a file layer by layer, so
one layer's tensors are in memory at a time). The quantized blocks themselves are
what the engine serves where its kernels run them (tandem/engine/quant/gguf_blocks.py reads
them by the same names); this directory is the float model behind them.

The router's numerics follow llama.cpp's graph for each architecture: softmax top-k,
renormalised for Mixtral and Qwen3-MoE, not for Qwen2-MoE. A metadata key that would change
the forward otherwise (RoPE scaling, a sliding window, expert weight scaling, leading dense
layers) is refused by name, and so is any tensor this mapping does not consume.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tandem.engine.errors import ModelLoadError, UnsupportedConfigError
from tandem.engine.gguf_deepseek import ARCHITECTURE as DEEPSEEK
from tandem.engine.gguf_deepseek import (
    OUTSIDE_LAYERS,
    deepseek_config,
    deepseek_tensors,
    save_gguf_tokenizer,
    vocab_size,
)

# the families whose GGUFs this module converts (not transformers)
MOE_MODEL_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
_ARCHITECTURES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}
_HF_CLASS = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
             "qwen3_moe": "Qwen3MoeForCausalLM"}
# the routers' renormalisation as llama.cpp computes each architecture (src/models/*.cpp)
_NORM_TOPK = {"qwen2_moe": False, "qwen3_moe": True}
# metadata keys (after "<arch>.") that change the forward and are not mapped: refused
_REFUSED = ("rope.scaling.type", "rope.scaling.factor", "attention.sliding_window",
            "expert_weights_scale", "expert_gating_func", "leading_dense_block_count",
            "expert_group_count", "attn_logit_softcapping", "final_logit_softcapping")
_REFUSED_DEFAULTS: dict[str, tuple[object, ...]] = {
    "rope.scaling.type": ("none",), "rope.scaling.factor": (1.0,),
    "expert_weights_scale": (1.0,), "expert_gating_func": (1,),  # 1: softmax
    "leading_dense_block_count": (0,), "expert_group_count": (0, 1),
}
_EXPERT = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight")
# one tensor per expert: how llama.cpp wrote Mixtral before it stacked them (GGUFs of 2023)
_EXPERT_LEGACY = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight")
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")


def moe_model_type(metadata: dict[str, Any]) -> str | None:
    """The MoE family a GGUF's metadata describes (``mixtral``, ``qwen2_moe``, ``qwen3_moe``),
    None for any other GGUF."""
    arch = metadata.get("general.architecture")
    if arch == "llama" and int(metadata.get("llama.expert_count") or 0) > 0:
        return "mixtral"
    return _ARCHITECTURES.get(str(arch))


def hf_config(metadata: dict[str, Any], tensor_shapes: dict[str, tuple[int, ...]]) -> dict:
    """config.json of the HF checkpoint the GGUF holds (``tensor_shapes``: GGUF name -> numpy
    shape, which settles the vocabulary, tied embeddings and biases)."""
    model_type = moe_model_type(metadata)
    if model_type is None:
        raise ModelLoadError("not a mixture-of-experts GGUF: "
                             f"{metadata.get('general.architecture')!r}")
    arch = str(metadata["general.architecture"])

    def get(key: str, default: Any = None) -> Any:
        value = metadata.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata has no {arch}.{key}")
        return value

    for key in _REFUSED:
        value = metadata.get(f"{arch}.{key}")
        if value is not None and value not in _REFUSED_DEFAULTS.get(key, ()):
            raise UnsupportedConfigError(model_type, f"{arch}.{key}", value,
                                         "a GGUF of this family is served without it")
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    config: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [_HF_CLASS[model_type]],
        "vocab_size": vocab_size(tensor_shapes),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(get("context_length")),
        "rope_parameters": {"rope_type": "default",
                            "rope_theta": float(get("rope.freq_base", 10000.0))},
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensor_shapes,
        "num_experts_per_tok": int(get("expert_used_count")),
        "torch_dtype": "float32",
    }
    for ours, theirs in (("bos_token_id", "tokenizer.ggml.bos_token_id"),
                         ("eos_token_id", "tokenizer.ggml.eos_token_id"),
                         ("pad_token_id", "tokenizer.ggml.padding_token_id")):
        if theirs in metadata:
            config[ours] = int(metadata[theirs])
    experts = int(get("expert_count"))
    if model_type == "mixtral":  # always renormalised: no norm_topk_prob in its config
        config.update(num_local_experts=experts, sliding_window=None)
    else:
        config.update(num_experts=experts, norm_topk_prob=_NORM_TOPK[model_type], decoder_sparse_step=1, mlp_only_layers=[],
                      moe_intermediate_size=int(get("expert_feed_forward_length")),
                      use_sliding_window=False)
    biased = "blk.0.attn_q.bias" in tensor_shapes
    if model_type == "qwen2_moe":
        config.update(qkv_bias=biased, shared_expert_intermediate_size=int(
            get("expert_shared_feed_forward_length", 0)))
    elif model_type == "qwen3_moe":
        config["attention_bias"] = biased
    return config


def _hf_name(model_type: str, gguf_name: str) -> str | None:
    """The HF tensor a (non-expert) GGUF tensor becomes; None: not one of this family's."""
    if gguf_name in OUTSIDE_LAYERS:
        return OUTSIDE_LAYERS[gguf_name]
    m = _LAYER.fullmatch(gguf_name)
    if m is None:
        return None
    layer, rest = m.groups()
    moe = "block_sparse_moe" if model_type == "mixtral" else "mlp"
    names = {
        "attn_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "attn_output.weight": "self_attn.o_proj.weight",
        "ffn_gate_inp.weight": f"{moe}.gate.weight",
    }
    for short, proj in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj")):
        names[f"attn_{short}.weight"] = f"self_attn.{proj}.weight"
        names[f"attn_{short}.bias"] = f"self_attn.{proj}.bias"
    if model_type == "qwen3_moe":
        names.update({"attn_q_norm.weight": "self_attn.q_norm.weight",
                      "attn_k_norm.weight": "self_attn.k_norm.weight",
                      "attn_output.bias": "self_attn.o_proj.bias"})
    if model_type == "qwen2_moe":
        names.update({f"ffn_{p}_shexp.weight": f"mlp.shared_expert.{p}_proj.weight"
                      for p in ("gate", "up", "down")})
        names["ffn_gate_inp_shexp.weight"] = "mlp.shared_expert_gate.weight"
    hf = names.get(rest)
    return None if hf is None else f"model.layers.{layer}.{hf}"


def _expert_names(model_type: str, layer: int, part: str, count: int) -> list[str]:
    """The HF names of one stacked GGUF expert tensor's ``count`` experts."""
    if model_type == "mixtral":
        w = {"gate": "w1", "up": "w3", "down": "w2"}[part]
        return [f"model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.weight"
                for e in range(count)]
    return [f"model.layers.{layer}.mlp.experts.{e}.{part}_proj.weight" for e in range(count)]


def unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (its ``LlamaModel.permute``) on whole rows of
    any payload: the transformers order of each head's rotary halves."""
    dim = rows.shape[0] // n_head // 2
    w = rows.reshape(n_head, dim, 2, *rows.shape[1:])
    return w.swapaxes(2, 1).reshape(rows.shape)


def hf_tensors(reader: Any, config: dict) -> Iterator[tuple[int | None, str, np.ndarray]]:
    """(layer or None, HF name, fp32 array) for every tensor of a ``gguf.GGUFReader``;
    ModelLoadError names a tensor this family has no place for."""
    from gguf.quants import dequantize

    model_type = config["model_type"]
    permuted = model_type == "mixtral"  # llama.cpp's llama arch permutes Q and K
    for t in reader.tensors:
        values = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32, copy=False)
        m = _EXPERT.fullmatch(t.name)
        if m is not None:
            layer, part = int(m.group(1)), m.group(2)
            for name, w in zip(_expert_names(model_type, layer, part, values.shape[0]), values,
                               strict=True):
                yield layer, name, w
            continue
        m = _EXPERT_LEGACY.fullmatch(t.name) if model_type == "mixtral" else None
        if m is not None:
            layer, part, e = int(m.group(1)), m.group(2), int(m.group(3))
            yield layer, _expert_names(model_type, layer, part, e + 1)[e], values
            continue
        name = _hf_name(model_type, t.name)
        if name is None:
            raise ModelLoadError(f"GGUF tensor {t.name!r} has no place in a {model_type} model")
        if permuted and t.name.endswith("attn_q.weight"):
            values = unpermute_rows(values, config["num_attention_heads"])
        elif permuted and t.name.endswith("attn_k.weight"):
            values = unpermute_rows(values, config["num_key_value_heads"])
        if t.name.endswith("ffn_gate_inp_shexp.weight"):
            values = values.reshape(1, -1)  # GGUF keeps the shared expert's gate 1-D
        m = _LAYER.fullmatch(t.name)
        yield (int(m.group(1)) if m else None), name, values


def convert_moe_gguf(gguf_path: Path, metadata: dict[str, Any], out: Path) -> None:
    """Write ``gguf_path`` (a GGUF of ``MOE_MODEL_TYPES``, ``metadata`` its key/values) to
    ``out`` as an HF directory: config.json, safetensors shards (one per run of a layer's
    tensors, in file order) with their index, and the tokenizer when the GGUF carries one."""
    import gguf
    import torch
    from safetensors.torch import save_file

    reader = gguf.GGUFReader(str(gguf_path))
    shapes = {t.name: tuple(np.asarray(t.data).shape) for t in reader.tensors}
    if metadata.get("general.architecture") == DEEPSEEK:
        config = deepseek_config(metadata, shapes)
        tensors = deepseek_tensors(reader, config)
    else:
        config = hf_config(metadata, shapes)
        tensors = hf_tensors(reader, config)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    index: dict[str, str] = {}
    pending: dict[str, torch.Tensor] = {}

    def flush() -> None:  # the tensors read since the layer changed: one shard
        if pending:
            file = f"model-{len(set(index.values())) + 1:05d}.safetensors"
            save_file(pending, str(out / file), metadata={"format": "pt"})
            index.update(dict.fromkeys(pending, file))
            pending.clear()

    current: object = object()
    for layer, name, values in tensors:
        if layer != current:
            flush()
            current = layer
        pending[name] = torch.from_numpy(np.array(values, dtype=np.float32))  # off the mmap
    flush()
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": index}, indent=2))
    if "tokenizer.ggml.model" in metadata:
        if metadata.get("general.architecture") == DEEPSEEK:
            save_gguf_tokenizer(gguf_path, out)
        else:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
            tokenizer.save_pretrained(out)
