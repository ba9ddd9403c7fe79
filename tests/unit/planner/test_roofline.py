"""Roofline profiles: model shapes, device table, and estimates inside the formulas' bounds."""

from __future__ import annotations

import dataclasses

import pytest

from tandem.planner.devices import DEVICES, get_device
from tandem.planner.models import MODELS, ModelError, ModelShape, from_hf_config, get_model
from tandem.planner.profile import ProfileError
from tandem.planner.roofline import (
    LAUNCH_OVERHEAD_S,
    MAX_GPUS_PER_WORKER,
    activation_reserve_bytes,
    fewest_gpus_per_worker,
    roofline_profile,
)

LLAMA_8B = get_model("Llama-3.1-8B")
LLAMA_70B = get_model("Llama-3.1-70B")
H100 = get_device("H100-SXM")
L40S = get_device("L40S")

# The efficiency bands the roofline module documents: prefill MFU 0.4-0.6, decode MBU 0.6-0.8.
MFU_BAND = (0.4, 0.6)
MBU_BAND = (0.6, 0.8)


# -- model shapes -------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "total", "active"), [
    # Published parameter counts (model cards).
    ("Llama-3.1-8B", 8.03e9, 8.03e9),
    ("Llama-3.1-70B", 70.6e9, 70.6e9),
    ("Qwen2.5-7B", 7.62e9, 7.62e9),
    ("Qwen2.5-72B", 72.7e9, 72.7e9),
    ("Mixtral-8x7B", 46.7e9, 12.9e9),
    ("SmolLM2-135M", 134.5e6, 134.5e6),
])
def test_param_counts_match_published(name: str, total: float, active: float) -> None:
    model = MODELS[name]
    assert model.params == pytest.approx(total, rel=0.005)
    assert model.active_params == pytest.approx(active, rel=0.005)


def test_deepseek_v3_counts_latent_attention_shared_experts_and_dense_layers() -> None:
    model = MODELS["DeepSeek-V3"]
    # model card: 671B parameters (the multi-token-prediction layer aside), 37B activated
    assert model.params == pytest.approx(671e9, rel=0.005)
    assert model.active_params == pytest.approx(37e9, rel=0.02)
    attention = (7168 * 1536 + 1536 + 1536 * 128 * 192  # q-LoRA
                 + 7168 * 576 + 512 + 512 * 128 * 256  # latent, its norm, decompression
                 + 128 * 128 * 7168 + 2 * 7168)  # o, the layer's norms
    moe = (256 + 1) * 3 * 7168 * 2048 + 7168 * 256  # routed + shared experts, router
    dense = 3 * 7168 * 18432
    assert model.params == (61 * attention + 58 * moe + 3 * dense + 2 * 129280 * 7168 + 7168)


def test_qwen3_moe_config_reads_to_its_published_counts() -> None:
    # Qwen/Qwen3-30B-A3B config.json: 30.5B total, 3.3B activated
    model = from_hf_config(QWEN3_MOE_CONFIG)
    assert (model.experts, model.experts_per_token, model.dense_layers) == (128, 8, 0)
    assert model.params == pytest.approx(30.5e9, rel=0.005)
    assert model.active_params == pytest.approx(3.3e9, rel=0.02)


def test_moe_dense_layers_follow_the_config() -> None:
    sparse_step = {**QWEN3_MOE_CONFIG, "decoder_sparse_step": 2, "mlp_only_layers": [1]}
    model = from_hf_config(sparse_step)
    assert model.dense_layers == 25  # the 24 even layers, and layer 1
    assert model.dense_intermediate == 6144
    assert from_hf_config(DEEPSEEK_V3_CONFIG).dense_layers == 3  # first_k_dense_replace


def test_kv_bytes_per_token_are_the_latent_rows_for_mla() -> None:
    model = MODELS["DeepSeek-V3"]
    assert model.kv_bytes_per_token() == 61 * (512 + 64) * 2 == 70_272  # docs/bench/mla.md
    assert model.kv_bytes_per_token("fp8") == 61 * 576
    # not 2 x 128 KV heads x 192 a layer: the latent is whole on each tensor-parallel GPU
    assert model.kv_bytes_per_token(gpus=8) == 70_272


def test_a_deepseek_v3_profile_sizes_and_reads_the_latent_cache() -> None:
    model = MODELS["DeepSeek-V3"]
    h200 = get_device("H200")
    profile = roofline_profile(model, h200, gpus_per_worker=8, weight_dtype="fp8")
    assert profile.kv_bytes_per_token == 70_272
    assert profile.step.per_context_token_s == pytest.approx(
        70_272 / (h200.hbm_bytes_per_s * 0.7))
    weights = model.weight_bytes("fp8") / 8
    reserve = activation_reserve_bytes(model, 8, 2048, 256)
    free = h200.memory_bytes * 0.9 - weights - reserve
    assert profile.kv_capacity_tokens == int(free // 70_272)
    # prefill attention over decompressed keys (192 wide) and values (128)
    assert profile.step.per_prefill_pair_s == pytest.approx(
        2 * 61 * 128 * (192 + 128) / 8 / (h200.fp8_flops * 0.5))


def test_kv_bytes_per_token_is_two_layers_heads_dim_dtype() -> None:
    assert LLAMA_8B.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2
    assert LLAMA_8B.kv_bytes_per_token("fp8") == 2 * 32 * 8 * 128
    with pytest.raises(ModelError):
        LLAMA_8B.kv_bytes_per_token("int3")


def test_quantized_weights_keep_embeddings_bf16() -> None:
    body = LLAMA_8B.params - LLAMA_8B.embedding_params
    assert LLAMA_8B.weight_bytes("fp8") == body + 2 * LLAMA_8B.embedding_params
    assert LLAMA_8B.weight_bytes("int4") == pytest.approx(
        body * (0.5 + 2 / 128) + 2 * LLAMA_8B.embedding_params)


SMOLLM2_CONFIG = {  # HuggingFaceTB/SmolLM2-135M config.json (the keys read)
    "model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576,
    "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536,
    "vocab_size": 49152, "tie_word_embeddings": True, "attention_bias": False,
}
MIXTRAL_CONFIG = {  # mistralai/Mixtral-8x7B-v0.1 config.json
    "model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
    "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
    "vocab_size": 32000, "tie_word_embeddings": False, "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
QWEN3_MOE_CONFIG = {  # Qwen/Qwen3-30B-A3B config.json
    "model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
    "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "vocab_size": 151936, "tie_word_embeddings": False,
}
DEEPSEEK_V3_CONFIG = {  # deepseek-ai/DeepSeek-V3 config.json (no head_dim key)
    "model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
    "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
    "vocab_size": 129280, "tie_word_embeddings": False, "attention_bias": False,
}
QWEN_CONFIG = {  # Qwen/Qwen2.5-7B config.json: qwen2 has q/k/v biases without saying so
    "model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584,
    "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
    "vocab_size": 152064, "tie_word_embeddings": False,
}


@pytest.mark.parametrize(("config", "name"), [
    (SMOLLM2_CONFIG, "SmolLM2-135M"), (MIXTRAL_CONFIG, "Mixtral-8x7B"),
    (QWEN_CONFIG, "Qwen2.5-7B"), (DEEPSEEK_V3_CONFIG, "DeepSeek-V3"),
])
def test_hf_config_reads_into_the_tables_shape(config: dict[str, object], name: str) -> None:
    assert from_hf_config(config, name) == MODELS[name]
    assert from_hf_config({"text_config": config}, name) == MODELS[name]


def test_hf_config_missing_key_is_named() -> None:
    config = dict(SMOLLM2_CONFIG)
    del config["vocab_size"]
    with pytest.raises(ModelError, match="vocab_size"):
        from_hf_config(config)


def test_tables_look_up_case_insensitively() -> None:
    assert get_device("h200") is DEVICES["H200"]
    assert get_model("llama-3.1-8b") is LLAMA_8B
    with pytest.raises(KeyError, match="H100-SXM"):
        get_device("TPU")


# -- roofline figures -----------------------------------------------------------------------

def _streamed_bytes(model: ModelShape = LLAMA_8B) -> float:
    """All weights but the (untied, BF16) input embedding, a lookup: what one step reads."""
    assert not model.tie_embeddings
    return model.weight_bytes() - 2 * model.vocab * model.hidden


def test_llama8b_h100_decode_step_within_the_mbu_band() -> None:
    profile = roofline_profile(LLAMA_8B, H100)
    context = 1024
    step = profile.step.step_s(rows=1, context_tokens=context)
    kv_read = context * LLAMA_8B.kv_bytes_per_token()
    bytes_read = _streamed_bytes() + kv_read
    lower = bytes_read / (H100.hbm_bytes_per_s * MBU_BAND[1])
    upper = (bytes_read / (H100.hbm_bytes_per_s * MBU_BAND[0]) + LAUNCH_OVERHEAD_S
             + 2 * LLAMA_8B.active_params / H100.bf16_flops / 0.2)  # one row at 20% MFU
    assert lower < step < upper
    # and never faster than the HBM peak allows
    assert step > bytes_read / H100.hbm_bytes_per_s


def test_llama8b_h100_prefill_throughput_within_the_mfu_band() -> None:
    profile = roofline_profile(LLAMA_8B, H100)
    chunk = profile.chunk_tokens
    tokens_per_s = chunk / profile.step.step_s(rows=0, prefill_tokens=chunk)
    flops_per_token = 2 * LLAMA_8B.active_params
    upper = H100.bf16_flops * MFU_BAND[1] / flops_per_token
    slowest_step = (chunk * flops_per_token / (H100.bf16_flops * MFU_BAND[0])
                    + _streamed_bytes() / (H100.hbm_bytes_per_s * MBU_BAND[0])
                    + LAUNCH_OVERHEAD_S)
    assert chunk / slowest_step < tokens_per_s < upper


def test_prefill_attention_is_charged_as_compute_per_query_key_pair() -> None:
    profile = roofline_profile(LLAMA_8B, H100)
    flops_per_pair = 4 * LLAMA_8B.layers * LLAMA_8B.heads * LLAMA_8B.head_dim
    assert profile.step.per_prefill_pair_s == pytest.approx(
        flops_per_pair / (H100.bf16_flops * 0.5))
    # compute-bound: far cheaper per pair than a decode row's memory-bound KV read
    assert profile.step.per_prefill_pair_s < profile.step.per_context_token_s / 10


def test_decode_context_cost_is_one_kv_read_per_position() -> None:
    profile = roofline_profile(LLAMA_8B, H100, mbu=0.7)
    assert profile.step.per_context_token_s == pytest.approx(
        LLAMA_8B.kv_bytes_per_token() / (H100.hbm_bytes_per_s * 0.7))


def test_kv_capacity_is_what_weights_and_activations_leave() -> None:
    profile = roofline_profile(LLAMA_8B, H100, memory_utilization=0.9)
    free = (H100.memory_bytes * 0.9 - LLAMA_8B.weight_bytes()
            - activation_reserve_bytes(LLAMA_8B, 1, profile.chunk_tokens, profile.max_num_seqs))
    assert profile.kv_capacity_tokens == int(free // LLAMA_8B.kv_bytes_per_token())
    assert profile.source == "roofline" and "tandem profile" in profile.notes


def test_llama70b_does_not_fit_one_l40s_but_fits_four() -> None:
    with pytest.raises(ProfileError, match="gpus_per_worker=4"):
        roofline_profile(LLAMA_70B, L40S)
    profile = roofline_profile(LLAMA_70B, L40S, gpus_per_worker=4)
    per_gpu = (LLAMA_70B.weight_bytes() / 4
               + activation_reserve_bytes(LLAMA_70B, 4, profile.chunk_tokens,
                                          profile.max_num_seqs)
               + profile.kv_capacity_tokens * LLAMA_70B.kv_bytes_per_token() / 4)
    assert profile.kv_capacity_tokens >= profile.chunk_tokens
    assert per_gpu <= L40S.memory_bytes * 0.9
    assert fewest_gpus_per_worker(LLAMA_70B, L40S) == 4
    assert fewest_gpus_per_worker(LLAMA_70B, H100) == 2


def test_tensor_parallel_divides_reads_and_adds_all_reduce() -> None:
    tp4 = roofline_profile(LLAMA_70B, H100, gpus_per_worker=4)
    tp8 = roofline_profile(LLAMA_70B, H100, gpus_per_worker=8)
    # Weight reads halve; the fixed all-reduce latency (2 per layer) does not.
    assert tp8.step.base_s < tp4.step.base_s
    assert tp8.step.base_s - LAUNCH_OVERHEAD_S > (tp4.step.base_s - LAUNCH_OVERHEAD_S) / 2
    # FLOPs halve; the per-token all-reduce bytes grow (2 (n-1)/n), so less than 2x faster.
    assert tp4.step.per_prefill_token_s / 2 < tp8.step.per_prefill_token_s
    assert tp8.step.per_prefill_token_s < tp4.step.per_prefill_token_s
    # Every GPU has a NIC of its own: the handoff bandwidth scales with the worker.
    assert tp8.transfer.bandwidth_bytes_per_s == 2 * tp4.transfer.bandwidth_bytes_per_s


def test_fp8_weights_read_half_and_use_fp8_tensor_cores_where_present() -> None:
    bf16 = roofline_profile(LLAMA_8B, H100)
    fp8 = roofline_profile(LLAMA_8B, H100, weight_dtype="fp8")
    assert fp8.step.base_s < bf16.step.base_s
    assert fp8.step.per_prefill_token_s == pytest.approx(
        bf16.step.per_prefill_token_s * H100.bf16_flops / H100.fp8_flops)
    a100 = get_device("A100-80GB-SXM")
    assert (roofline_profile(LLAMA_8B, a100, weight_dtype="fp8").step.per_prefill_token_s
            == roofline_profile(LLAMA_8B, a100).step.per_prefill_token_s)


def test_kv_heads_replicate_beyond_their_count() -> None:
    # SmolLM2's 9 heads split 3 ways, not 2.
    with pytest.raises(ProfileError, match="cannot be split"):
        roofline_profile(get_model("SmolLM2-135M"), H100, gpus_per_worker=2)
    model = dataclasses.replace(LLAMA_8B, name="4-kv-heads", kv_heads=4)
    tp8 = roofline_profile(model, H100, gpus_per_worker=8)
    # 8 GPUs, 4 KV heads: each GPU holds one head, the handoff still carries 4.
    assert tp8.kv_bytes_per_token == model.kv_bytes_per_token()
    assert tp8.step.per_context_token_s == pytest.approx(
        model.kv_bytes_per_token(gpus=8) / (H100.hbm_bytes_per_s * 0.7))


@pytest.mark.parametrize("kwargs", [
    {"mfu": 0.0}, {"mbu": 1.5}, {"decode_mfu": -1}, {"memory_utilization": 0},
    {"weight_dtype": "int3"}, {"gpus_per_worker": 0},
    {"gpus_per_worker": MAX_GPUS_PER_WORKER * 2 + 1},
])
def test_bad_arguments_are_profile_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ProfileError):
        roofline_profile(LLAMA_8B, H100, **kwargs)


def test_every_table_model_fits_some_split_of_every_device() -> None:
    for model in MODELS.values():
        for device in DEVICES.values():
            # DeepSeek-V3's 671B fit one server's 8 GPUs only at FP8, and on the larger ones
            dtype = "fp8" if model.name == "DeepSeek-V3" else "bf16"
            n = fewest_gpus_per_worker(model, device, weight_dtype=dtype)
            if n is None:
                assert dtype == "fp8" and model.weight_bytes(dtype) > 8 * device.memory_bytes * 0.8
                continue
            profile = roofline_profile(model, device, gpus_per_worker=n, weight_dtype=dtype)
            assert profile.kv_capacity_tokens > 0


def test_a_moe_models_reserve_counts_its_slots_as_the_engine_does() -> None:
    """The (token, expert) slots' hidden-wide buffers dominate a MoE layer's activations;
    the planner counts a MoE layer with the engine's function (tandem/common/
    ffn_activations.py), its widths split across the tensor-parallel GPUs."""
    model = MODELS["DeepSeek-V3"]
    router = 7168 * 4 + 256 * 4 + 3 * 256 * 4 + 8 * (4 + 8)  # fp32: input, logits, 3 copies
    slots = 8 * (2 * 7168 * 2 + 2 * 7168 * 4 + 3 * 8)
    expert = shared = 2 * (4 * 256 + 7168)  # 2048 / 8 GPUs wide
    moe = router + slots + expert + 7168 * 2 + shared
    per_token = 4 * 7168 * 2 + moe
    logits = 256 * 129280 / 8 * 4
    assert activation_reserve_bytes(model, 8, 2048, 256) == pytest.approx(
        2048 * per_token + logits + 512 * 2**20)
    # a dense model's figure is what it was: 4 x hidden + 3 x intermediate / n, bf16
    assert activation_reserve_bytes(LLAMA_8B, 2, 2048, 256) == pytest.approx(
        2048 * (4 * 4096 + 3 * 14336 / 2) * 2 + 256 * 128256 / 2 * 4 + 512 * 2**20)
