"""DeepSeek GGUFs (llama.cpp architecture ``deepseek2``: V2, V2-Lite, V2.5, V3, R1 and their
MLA distills), converted to an HF directory by tandem/engine/gguf_moe.py's driver.

llama.cpp writes one architecture for both generations; the router's gating function tells
them apart, and the forward follows llama.cpp's graph for it:

    expert_gating_func   family        routing
    1 (softmax) / absent deepseek_v2   softmax top-k, never renormalised, greedy (grouped only
                                       where the file states expert groups)
    2 (sigmoid)          deepseek_v3   sigmoid scores + exp_probs_b, grouped where the file
                                       states groups, renormalised with expert_weights_norm

    metadata (after "deepseek2.")           HF config
    attention.kv_lora_rank / q_lora_rank    kv_lora_rank / q_lora_rank (absent: no q-LoRA)
    rope.dimension_count                    qk_rope_head_dim
    attention.key_length_mla / value_length_mla   qk_nope + qk_rope / v_head_dim (files of
                                            before llama.cpp's MLA: key_length / value_length)
    leading_dense_block_count               first_k_dense_replace
    expert_count / expert_used_count / expert_shared_count / expert_feed_forward_length
    expert_weights_scale / expert_weights_norm / expert_group_count / expert_group_used_count
    rope.scaling.type yarn, .factor, .original_context_length, .yarn_log_multiplier
                                            rope_parameters yarn with mscale = mscale_all_dim =
                                            log multiplier / 0.1 (what llama.cpp computes:
                                            unscaled rotation, softmax scale x mscale^2)

    GGUF tensor (blk.i.)        HF (model.layers.i.)
    attn_q | attn_q_a, attn_q_a_norm, attn_q_b     self_attn.q_proj | q_a_proj, q_a_layernorm,
                                                   q_b_proj
    attn_kv_a_mqa, attn_kv_a_norm                  self_attn.kv_a_proj_with_mqa, kv_a_layernorm
    attn_kv_b                                      self_attn.kv_b_proj (files of before MLA;
                                                   where a file has the split too, this one)
    attn_k_b [H, rank, nope] + attn_v_b [H, v, rank]   self_attn.kv_b_proj: per head the
                                                   transposed k_b rows, then v_b's (llama.cpp's
                                                   split for weight absorption, undone)
    attn_output, attn_norm, ffn_norm               self_attn.o_proj, input_/post_attention_layernorm
    ffn_{gate,up,down}                             mlp.*_proj (the leading dense layers)
    ffn_gate_inp, exp_probs_b.bias                 mlp.gate.weight, .e_score_correction_bias
    ffn_{gate,up,down}_exps [E, ...]               mlp.experts.e.*_proj
    ffn_{gate,up,down}_shexp                       mlp.shared_experts.*_proj

RoPE rotates adjacent pairs in llama.cpp's deepseek2 graph, as DeepSeek's own code does, so
Q and K rows are taken as stored. Anything else that changes the forward (another RoPE
scaling, a sliding window, soft-capping, next-token-prediction layers, renormalising a
softmax router) is refused by name, and so is a tensor with no place here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tandem.engine.errors import ModelLoadError, UnsupportedConfigError

ARCHITECTURE = "deepseek2"
_SOFTMAX, _SIGMOID = 1, 2  # llama.cpp's expert_gating_func values
_HF_CLASS = {"deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
# metadata keys (after "deepseek2.") that change the forward, with the values served as-is
_REFUSED: dict[str, tuple[object, ...]] = {
    "attention.sliding_window": (0,), "attn_logit_softcapping": (0.0,),
    "final_logit_softcapping": (0.0,), "nextn_predict_layers": (0,),
    "rope.scaling.type": ("none", "yarn"), "expert_gating_func": (_SOFTMAX, _SIGMOID),
}
_EXPERT = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight")
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")
_SPLIT_KV_B = ("attn_k_b.weight", "attn_v_b.weight")


def vocab_size(tensor_shapes: dict[str, tuple[int, ...]]) -> int:
    """The vocabulary a GGUF's token embedding holds (GGUF shapes: fastest dimension first);
    ModelLoadError when the file has none."""
    shape = tensor_shapes.get("token_embd.weight")
    if not shape:
        raise ModelLoadError("the GGUF file has no token embedding (token_embd.weight)")
    return int(shape[0])


def deepseek_config(metadata: dict[str, Any], tensor_shapes: dict[str, tuple[int, ...]]
                    ) -> dict[str, Any]:
    """config.json of the HF checkpoint a ``deepseek2`` GGUF holds (``tensor_shapes``: GGUF
    name -> numpy shape: vocabulary, tied embeddings). UnsupportedConfigError names a key
    whose value this engine does not compute."""
    def get(key: str, default: Any = None) -> Any:
        value = metadata.get(f"{ARCHITECTURE}.{key}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata has no {ARCHITECTURE}.{key}")
        return value

    gating = int(get("expert_gating_func", _SOFTMAX))
    model_type = "deepseek_v3" if gating == _SIGMOID else "deepseek_v2"
    for key, served in _REFUSED.items():
        value = metadata.get(f"{ARCHITECTURE}.{key}")
        if value is not None and value not in served:
            raise UnsupportedConfigError(model_type, f"{ARCHITECTURE}.{key}", value,
                                         "a DeepSeek GGUF is served without it")
    norm = bool(get("expert_weights_norm", False))
    if gating == _SOFTMAX and norm:  # transformers' V2 and DeepSeek's code differ on it
        raise UnsupportedConfigError(model_type, f"{ARCHITECTURE}.expert_weights_norm", True,
                                     "a softmax router is served unrenormalised")
    heads, rope = int(get("attention.head_count")), int(get("rope.dimension_count"))
    if f"{ARCHITECTURE}.attention.key_length_mla" in metadata:  # llama.cpp's MLA files
        qk, v_dim = int(get("attention.key_length_mla")), int(get("attention.value_length_mla"))
    else:  # files of before it: the decompressed heads' widths
        qk, v_dim = int(get("attention.key_length")), int(get("attention.value_length"))
    layers, experts = int(get("block_count")), int(get("expert_count", 0))
    groups, groups_used = int(get("expert_group_count", 1)), int(get("expert_group_used_count", 1))
    grouped = groups > 1
    q_lora = metadata.get(f"{ARCHITECTURE}.attention.q_lora_rank")
    config: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [_HF_CLASS[model_type]],
        "vocab_size": vocab_size(tensor_shapes),
        "hidden_size": int(get("embedding_length")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,  # MLA decompresses a K and V per head
        "kv_lora_rank": int(get("attention.kv_lora_rank")),
        "q_lora_rank": int(q_lora) if q_lora else None,
        "qk_rope_head_dim": rope,
        "qk_nope_head_dim": qk - rope,
        "v_head_dim": v_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(get("context_length")),
        "rope_parameters": _rope(metadata, float(get("rope.freq_base", 10000.0))),
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": "output.weight" not in tensor_shapes,
        "first_k_dense_replace": int(get("leading_dense_block_count", 0)) if experts else layers,
        "n_routed_experts": experts or None,
        "num_experts_per_tok": int(get("expert_used_count", 0)) or None,
        "n_shared_experts": int(get("expert_shared_count", 0)),
        "moe_intermediate_size": int(get("expert_feed_forward_length", 0)) or None,
        "routed_scaling_factor": float(get("expert_weights_scale", 1.0)),
        "norm_topk_prob": norm,
        "n_group": groups if grouped else None,
        "topk_group": groups_used if grouped else None,
        "torch_dtype": "float32",
    }
    if model_type == "deepseek_v2":
        config.update(topk_method="group_limited_greedy" if grouped else "greedy",
                      mlp_bias=False)
    else:
        # llama.cpp's deepseek2 rotates adjacent pairs; it carries no next-token layers
        config.update(topk_method="noaux_tc", rope_interleave=True,
                      num_nextn_predict_layers=0, n_group=groups, topk_group=groups_used)
    for ours, theirs in (("bos_token_id", "tokenizer.ggml.bos_token_id"),
                         ("eos_token_id", "tokenizer.ggml.eos_token_id"),
                         ("pad_token_id", "tokenizer.ggml.padding_token_id")):
        if theirs in metadata:
            config[ours] = int(metadata[theirs])
    return config


def _rope(metadata: dict[str, Any], theta: float) -> dict[str, Any]:
    """rope_parameters of the file's RoPE: default, or YaRN as llama.cpp computes it."""
    key = f"{ARCHITECTURE}.rope.scaling."
    if metadata.get(key + "type", "none") != "yarn":
        return {"rope_type": "default", "rope_theta": theta}
    missing = [k for k in ("factor", "original_context_length") if key + k not in metadata]
    if missing:
        raise ModelLoadError(f"YaRN GGUF metadata has no {', '.join(key + k for k in missing)}")
    mscale = float(metadata.get(key + "yarn_log_multiplier", 0.0)) / 0.1
    return {"rope_type": "yarn", "rope_theta": theta, "factor": float(metadata[key + "factor"]),
            "original_max_position_embeddings": int(metadata[key + "original_context_length"]),
            "mscale": mscale, "mscale_all_dim": mscale,
            "beta_fast": float(metadata.get(key + "yarn_beta_fast", 32.0)),
            "beta_slow": float(metadata.get(key + "yarn_beta_slow", 1.0))}


# the HF tensors of a GGUF's tensors outside the layers (every family's the same)
OUTSIDE_LAYERS = {"token_embd.weight": "model.embed_tokens.weight",
                  "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def _hf_name(gguf_name: str) -> str | None:
    """The HF tensor a (non-expert, non-split) GGUF tensor becomes; None: no place here."""
    if gguf_name in OUTSIDE_LAYERS:
        return OUTSIDE_LAYERS[gguf_name]
    m = _LAYER.fullmatch(gguf_name)
    if m is None:
        return None
    layer, rest = m.groups()
    names = {
        "attn_norm.weight": "input_layernorm.weight",
        "ffn_norm.weight": "post_attention_layernorm.weight",
        "attn_q.weight": "self_attn.q_proj.weight",
        "attn_q_a.weight": "self_attn.q_a_proj.weight",
        "attn_q_a_norm.weight": "self_attn.q_a_layernorm.weight",
        "attn_q_b.weight": "self_attn.q_b_proj.weight",
        "attn_kv_a_mqa.weight": "self_attn.kv_a_proj_with_mqa.weight",
        "attn_kv_a_norm.weight": "self_attn.kv_a_layernorm.weight",
        "attn_kv_b.weight": "self_attn.kv_b_proj.weight",
        "attn_output.weight": "self_attn.o_proj.weight",
        "ffn_gate_inp.weight": "mlp.gate.weight",
        "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    }
    for p in ("gate", "up", "down"):
        names[f"ffn_{p}.weight"] = f"mlp.{p}_proj.weight"
        names[f"ffn_{p}_shexp.weight"] = f"mlp.shared_experts.{p}_proj.weight"
    hf = names.get(rest)
    return None if hf is None else f"model.layers.{layer}.{hf}"


def merge_kv_b(k_b: np.ndarray, v_b: np.ndarray) -> np.ndarray:
    """``kv_b_proj`` [H * (nope + v), rank] from llama.cpp's split: ``k_b`` [H, rank, nope]
    (transposed for absorption) and ``v_b`` [H, v, rank]; per head its nope rows, then its
    v rows, as transformers' DeepSeek reads them."""
    if k_b.ndim != 3 or v_b.ndim != 3 or k_b.shape[:2] != (v_b.shape[0], v_b.shape[2]):
        raise ModelLoadError(f"attn_k_b {k_b.shape} and attn_v_b {v_b.shape} are not one "
                             "kv_b split by heads")
    merged = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)  # [H, nope + v, rank]
    return merged.reshape(-1, merged.shape[-1])


def deepseek_tensors(reader: Any, config: dict[str, Any]
                     ) -> Iterator[tuple[int | None, str, np.ndarray]]:
    """(layer or None, HF name, fp32 array) for every tensor of a ``deepseek2``
    ``gguf.GGUFReader``; ModelLoadError names a tensor with no place. A V3 router the file
    gives no ``exp_probs_b`` gets a zero correction (llama.cpp adds none)."""
    from gguf.quants import dequantize

    split: dict[int, dict[str, np.ndarray]] = {}
    biased: set[int] = set()
    # a file may carry kv_b and its split both (converted for either graph): kv_b is taken,
    # the split is the same weights arranged for absorption
    whole = {int(m.group(1)) for t in reader.tensors
             if (m := _LAYER.fullmatch(t.name)) and m.group(2) == "attn_kv_b.weight"}
    for t in reader.tensors:
        values = dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32, copy=False)
        m = _EXPERT.fullmatch(t.name)
        if m is not None:
            layer, part = int(m.group(1)), m.group(2)
            for e, w in enumerate(values):
                yield layer, f"model.layers.{layer}.mlp.experts.{e}.{part}_proj.weight", w
            continue
        m = _LAYER.fullmatch(t.name)
        layer = int(m.group(1)) if m else None
        if m is not None and m.group(2) in _SPLIT_KV_B and int(m.group(1)) in whole:
            continue
        if m is not None and m.group(2) in _SPLIT_KV_B:
            halves = split.setdefault(int(m.group(1)), {})
            halves[m.group(2)] = np.array(values)  # off the mmap: held until its pair comes
            if len(halves) == 2:
                yield layer, f"model.layers.{layer}.self_attn.kv_b_proj.weight", merge_kv_b(
                    halves.pop("attn_k_b.weight"), halves.pop("attn_v_b.weight"))
            continue
        name = _hf_name(t.name)
        if name is None:
            raise ModelLoadError(f"GGUF tensor {t.name!r} has no place in a "
                                 f"{config['model_type']} model")
        if name.endswith("e_score_correction_bias"):
            biased.add(int(m.group(1)) if m else -1)
        yield layer, name, values
    unpaired = [f"blk.{i}.{n}" for i, h in split.items() for n in h]
    if unpaired:
        raise ModelLoadError(f"GGUF tensor(s) {unpaired} without their attn_k_b/attn_v_b pair")
    if config["model_type"] == "deepseek_v3":
        for layer in range(config["first_k_dense_replace"], config["num_hidden_layers"]):
            if layer not in biased:
                yield layer, f"model.layers.{layer}.mlp.gate.e_score_correction_bias", \
                    np.zeros(config["n_routed_experts"], np.float32)


def save_gguf_tokenizer(gguf_path: Path, out: Path) -> None:
    """Write the tokenizer a GGUF carries (``tokenizer.ggml.*``) to ``out`` as a fast
    tokenizer. transformers' ``AutoTokenizer`` reads a GGUF's tokenizer only for the
    architectures whose config it also converts (not ``deepseek2``); its tokenizer builder
    itself depends on the vocabulary's kind (gpt2 BPE here), not on the architecture."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        convert_gguf_tokenizer,
        get_gguf_tokenizer,
    )

    arch, vocabulary, tokenizer_config = get_gguf_tokenizer(str(gguf_path))
    backend, extra = convert_gguf_tokenizer(arch, vocabulary)
    PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer_config, **extra
                            ).save_pretrained(out)
