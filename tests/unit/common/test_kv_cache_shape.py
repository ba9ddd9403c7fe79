"""One token's cache in one layer (tandem/common/kv_cache_shape.py): K and V of each KV head,
or multi-head latent attention's one latent row, and what a tensor-parallel GPU holds."""

from __future__ import annotations

from tandem.common.kv_cache_shape import KvCacheShape, kv_cache_shape


def test_grouped_query_attention_caches_k_and_v_of_each_kv_head() -> None:
    shape = kv_cache_shape(8, 128)
    assert shape == KvCacheShape(planes=2, heads=8, dim=128, latent=False)
    assert shape.values == 2 * 8 * 128
    # split across GPUs; beyond 8 GPUs each holds one whole head
    assert [shape.values_per_gpu(n) for n in (1, 2, 8, 16)] == [2048, 1024, 256, 256]


def test_latent_attention_caches_one_row_whatever_the_heads() -> None:
    # DeepSeek-V3: kv_lora_rank 512, qk_rope_head_dim 64, 128 KV heads in its config
    shape = kv_cache_shape(128, 192, kv_lora_rank=512, qk_rope_head_dim=64)
    assert shape == KvCacheShape(planes=1, heads=1, dim=576, latent=True)
    assert shape.values == 576
    assert shape.values_per_gpu(8) == 576  # every GPU's heads read the whole latent
