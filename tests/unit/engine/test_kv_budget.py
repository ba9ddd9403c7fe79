"""--gpu-memory-utilization: the KV pool a share of the device leaves (tandem/engine/kv_budget.py),
and where the flag is refused (pure: no device needed)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from tandem.engine.cli_args import add_engine_args, engine_config_from_args
from tandem.engine.config import CacheConfig, EngineConfig, ModelConfig
from tandem.engine.kv_budget import MARGIN_BYTES, activation_reserve, blocks_for_utilization

GIB = 2**30
# Llama-3-8B's shape
LLAMA8B = SimpleNamespace(hidden_size=4096, intermediate_size=14336,
                          attention_width=(32 + 2 * 8) * 128, vocab_size=128256)


def test_the_reserve_covers_a_steps_activations_and_a_full_batchs_logits() -> None:
    per_token = 2 * (3 * 4096 + (32 + 16) * 128 + 3 * 14336)
    logits = 2 * 256 * 128256 * 4
    assert activation_reserve(LLAMA8B, 8192, 256, 2) == 8192 * per_token + logits + MARGIN_BYTES


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
    got = pool_blocks(cfg, LLAMA8B, per_block, 2, lambda: (70 * GIB, 80 * GIB))
    assert got == blocks_for_utilization(0.5, 80 * GIB, 70 * GIB, reserve, per_block)
