"""--gpu-memory-utilization: the KV pool a share of the device leaves (tandem/engine/kv_budget.py),
and where the flag is refused (pure: no device needed); the activation reserve against
hand-computed figures for dense, Mixtral-like and DeepSeek-V3-like shapes, and against the
peak a tiny mixture-of-experts model measures on the CPU (torch's memory profiler)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from tandem.engine.cli_args import add_engine_args, engine_config_from_args
from tandem.engine.config import CacheConfig, EngineConfig, ModelConfig
from tandem.engine.kv_budget import (
    MARGIN_BYTES,
    activation_reserve,
    blocks_for_utilization,
    group_blocks,
)
from tandem.engine.models.arch import MoeArch

GIB = 2**30
# Llama-3-8B's shape
LLAMA8B = SimpleNamespace(hidden_size=4096, intermediate_size=14336,
                          attention_width=(32 + 2 * 8) * 128, vocab_size=128256, moe=None)
# Mixtral-8x7B: 8 experts of 14336, 2 a token, softmax router, no shared expert
MIXTRAL = SimpleNamespace(hidden_size=4096, intermediate_size=14336,
                          attention_width=(32 + 2 * 8) * 128, vocab_size=32000,
                          moe=MoeArch(8, 2, 14336, tuple(range(32))))
# DeepSeek-V3: MLA (128 heads, q/k 192 wide, v 128, latent 512 + 64), dense MLP 18432 on the
# first 3 layers, then 256 experts of 2048, 8 a token, sigmoid grouped router, one shared
DEEPSEEK_V3 = SimpleNamespace(
    hidden_size=7168, intermediate_size=18432, attention_width=128 * (2 * 192 + 128) + 576,
    vocab_size=129280, moe=MoeArch(256, 8, 2048, tuple(range(3, 61)), routing="deepseek_v3",
                                   n_group=8, topk_group=4, routed_scaling_factor=2.5,
                                   shared_intermediate_size=2048))


def test_the_reserve_covers_a_steps_activations_and_a_full_batchs_logits() -> None:
    # hidden, residual, normed; q/k/v; gate and up, act(gate), product; the MLP's output
    per_token = 2 * (3 * 4096 + (32 + 16) * 128 + 4 * 14336 + 4096)
    logits = 2 * 256 * 128256 * 4
    assert activation_reserve(LLAMA8B, 8192, 256, 2) == 8192 * per_token + logits + MARGIN_BYTES


def test_a_mixtral_like_reserve_counts_router_slots_and_the_experts_intermediate() -> None:
    attention = 2 * (3 * 4096 + 48 * 128)
    router = 8 * 2 + 3 * 8 * 4 + 2 * (4 + 8)  # bf16 logits, 3 fp32 copies, top-2 weights+ids
    slots = 2 * (2 * 4096 * 2 + 2 * 4096 * 4 + 3 * 8)  # 2 slots a token
    expert = 2 * (4 * 14336 + 4096)  # one expert at a time, every token at worst
    summed = 4096 * 2
    per_token = attention + router + slots + expert + summed  # 266,424 bytes
    assert per_token == 266_424
    logits = 2 * 256 * 32000 * 4
    assert activation_reserve(MIXTRAL, 8192, 256, 2) == 8192 * per_token + logits + MARGIN_BYTES
    # what the dense-only count gave: the slots' 98 KB a token were missing
    assert activation_reserve(MIXTRAL, 8192, 256, 2) - activation_reserve(
        SimpleNamespace(**{**vars(MIXTRAL), "moe": None}), 8192, 256, 2) == 8192 * (
        router + slots + summed)


def test_a_deepseek_v3_like_reserve_takes_its_moe_layers_over_its_dense_ones() -> None:
    attention = 2 * (3 * 7168 + 128 * 512 + 576)
    # fp32 router: the input in fp32, 256 fp32 logits and 3 working copies; top-8
    router = 7168 * 4 + 256 * 4 + 3 * 256 * 4 + 8 * (4 + 8)
    slots = 8 * (2 * 7168 * 2 + 2 * 7168 * 4 + 3 * 8)  # 688 KB a token: 8 slots of 7168
    expert = shared = 2 * (4 * 2048 + 7168)
    summed = 7168 * 2
    moe = router + slots + expert + summed + shared
    dense = 2 * (4 * 18432 + 7168)  # the first 3 layers' MLP: 1/5 of the MoE layer
    assert moe == 796_960 and dense == 161_792
    logits = 2 * 64 * 129280 * 4
    assert activation_reserve(DEEPSEEK_V3, 4096, 64, 2) == (
        4096 * (attention + moe) + logits + MARGIN_BYTES)


def test_blocks_are_what_the_share_leaves_after_everything_in_use_and_the_reserve() -> None:
    # An 80 GiB device holding 16 GiB (weights, context), 0.9 of it: 72 - 16 - 2 = 54 GiB.
    per_block = 2 * 32 * 16 * 8 * 128 * 2  # K and V, 32 layers, 16 tokens, 8 heads x 128, bf16
    blocks = blocks_for_utilization(0.9, 80 * GIB, 64 * GIB, 2 * GIB, per_block)
    assert blocks == (54 * GIB) // per_block


def test_a_share_that_leaves_no_block_is_refused_with_the_figures() -> None:
    with pytest.raises(ValueError) as err:
        blocks_for_utilization(0.2, 80 * GIB, 64 * GIB, 2 * GIB, 2 * 2**20)
    text = str(err.value)
    assert "--gpu-memory-utilization 0.2 leaves no room" in text
    assert "16.00 GiB already in use" in text and "2.00 GiB reserved" in text


MIB = 2**20


def test_a_group_gets_the_fewest_blocks_any_rank_fits_rank_0_paying_for_its_draft() -> None:
    """Two 80 GiB devices at 0.9 (72 GiB each), 2 GiB of activation reserve, 1 MiB of the
    target's KV per block on every rank. Rank 0 holds its 30 GiB shard and a 6 GiB draft
    model (36 GiB in use): 72 - 36 - 2 = 34 GiB, at 1 MiB + 0.25 MiB of draft KV a block,
    27852 blocks. Rank 1 holds its 30 GiB shard only: 72 - 30 - 2 = 40 GiB, 40960 blocks.
    The group's one pool is rank 0's 27852."""
    ranks = [(44 * GIB, 80 * GIB), (50 * GIB, 80 * GIB)]
    assert group_blocks(0.9, ranks, 2 * GIB, MIB, MIB // 4) == 27852
    assert (34 * GIB) // (MIB + MIB // 4) == 27852
    # without the draft's KV, rank 0's 34 GiB would take 34816 blocks: 6963 more than fit
    assert group_blocks(0.9, ranks, 2 * GIB, MIB) == 34816
    # a follower with less room (another process holds 20 GiB of its device) decides:
    # 72 - 50 - 2 = 20 GiB, 20480 blocks; the draft's KV costs rank 0 only
    crowded = [(44 * GIB, 80 * GIB), (30 * GIB, 80 * GIB)]
    assert group_blocks(0.9, crowded, 2 * GIB, MIB, MIB // 4) == 20480
    # one process: its own figures, the draft's KV included
    assert group_blocks(0.9, ranks[:1], 2 * GIB, MIB, MIB // 4) == 27852


def test_a_rank_with_no_room_is_refused_by_rank() -> None:
    ranks = [(44 * GIB, 80 * GIB), (GIB, 80 * GIB)]  # rank 1: 79 GiB in use, over 72
    with pytest.raises(ValueError, match="tensor-parallel rank 1: --gpu-memory-utilization"):
        group_blocks(0.9, ranks, 2 * GIB, MIB)


@pytest.mark.parametrize("u", [0.0, -0.5, 1.5])
def test_the_share_must_be_a_fraction(u: float) -> None:
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        CacheConfig(gpu_memory_utilization=u)


def test_the_flag_is_for_cuda_devices_only() -> None:
    cache = CacheConfig(gpu_memory_utilization=0.9)
    with pytest.raises(ValueError, match="on 'cpu' use kv_cache_memory_gb or num_blocks"):
        EngineConfig(model=ModelConfig(device="cpu"), cache=cache)
    assert EngineConfig(model=ModelConfig(device="cuda:1"), cache=cache).cache == cache


def test_the_vllm_flag_reaches_the_engine_config() -> None:
    parser = add_engine_args(argparse.ArgumentParser())
    args = parser.parse_args(["--device", "cuda", "--gpu-memory-utilization", "0.85"])
    assert engine_config_from_args(args).cache.gpu_memory_utilization == 0.85
    default = engine_config_from_args(parser.parse_args([]))
    assert default.cache.gpu_memory_utilization is None  # the pool: --kv-cache-memory-gb


def test_the_pool_asks_the_device_only_when_the_share_is_set() -> None:
    from tandem.engine.kv_budget import pool_blocks

    per_block = 2**20

    def no_device() -> tuple[int, int]:
        raise AssertionError("the device's memory was read without --gpu-memory-utilization")

    assert pool_blocks(EngineConfig(), LLAMA8B, per_block, 2, no_device) == 1024  # 1 GiB
    cfg = EngineConfig(model=ModelConfig(device="cuda"),
                       cache=CacheConfig(gpu_memory_utilization=0.5))
    reserve = activation_reserve(LLAMA8B, cfg.scheduler.max_num_batched_tokens,
                                 cfg.scheduler.max_num_seqs, 2)
    got = pool_blocks(cfg, LLAMA8B, per_block, 2, lambda: [(70 * GIB, 80 * GIB)])
    assert got == blocks_for_utilization(0.5, 80 * GIB, 70 * GIB, reserve, per_block)
    group = [(70 * GIB, 80 * GIB), (72 * GIB, 80 * GIB)]  # a group: rank 0 first, its draft
    got = pool_blocks(cfg, LLAMA8B, per_block, 2, lambda: group, per_block // 2)
    assert got == group_blocks(0.5, group, reserve, per_block, per_block // 2)
    assert got == blocks_for_utilization(0.5, 80 * GIB, 70 * GIB, reserve, per_block * 3 // 2)
