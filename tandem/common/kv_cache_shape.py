"""What one token's KV cache holds in one layer, from a model's attention dimensions.

Grouped-query attention caches a key and a value for each KV head; multi-head latent
attention (DeepSeek-V2/V3) caches one latent row per token, shared by every head::

    GQA   2 planes (K, V) x num_kv_heads x head_dim
    MLA   1 plane         x 1 head       x (kv_lora_rank + qk_rope_head_dim)

The engine's cache tensor (``ModelArch.kv_planes``, ``kv_cache_heads``, ``kv_cache_dim``) and
the planner's bytes per token (tandem/planner/models.py) both read it here, so a `tandem plan`
sizes the cache the engine allocates. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KvCacheShape:
    """One layer's cache for one token: ``planes`` x ``heads`` vectors of ``dim`` values."""

    planes: int  # 2: K and V; 1: MLA's latent plane
    heads: int  # KV heads, or MLA's one shared latent head
    dim: int  # values per head vector
    latent: bool  # MLA: the one head is every query head's; tensor parallelism replicates it

    @property
    def values(self) -> int:
        """Values one token caches in one layer."""
        return self.planes * self.heads * self.dim

    def values_per_gpu(self, gpus: int) -> int:
        """Values one of ``gpus`` tensor-parallel GPUs caches for one token in one layer: its
        share of the KV heads (at least one whole head when ``gpus`` > heads); all of the
        latent, which every GPU's heads read."""
        heads = self.heads if self.latent else math.ceil(self.heads / gpus)
        return self.planes * heads * self.dim


def kv_cache_shape(num_kv_heads: int, head_dim: int, kv_lora_rank: int = 0,
                   qk_rope_head_dim: int = 0) -> KvCacheShape:
    """The cache shape of an attention layer: multi-head latent attention's when
    ``kv_lora_rank`` > 0, grouped-query attention's (K and V of each KV head) otherwise."""
    if kv_lora_rank > 0:
        return KvCacheShape(planes=1, heads=1, dim=kv_lora_rank + qk_rope_head_dim, latent=True)
    return KvCacheShape(planes=2, heads=num_kv_heads, dim=head_dim, latent=False)
