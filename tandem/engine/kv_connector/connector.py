"""The engine's disaggregation seam as one owned object: the two roles and what they share.

    LLMEngine ──owns──> KVConnector ──.decode──> DecodeSide   (decode worker)
                                    ──.prefill─> PrefillSide  (prefill worker)
                                    ──.migrate─> MigrateSide  (decode worker: a live move out)
                                    ──.ledger──> RemoteKV     (reserved and held requests)
                                    ──.kv_cache, kv_cache_spec()──> the transfer layer

Each role gets its collaborators in the constructor (the ledger, the scheduler, the KV cache
manager, the output processor) and reaches the engine only through ``LiveRequestHost``.
"""

from __future__ import annotations

import torch

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.output_processor import OutputProcessor
from tandem.engine.core.remote_kv import RemoteKV
from tandem.engine.core.scheduler import Scheduler
from tandem.engine.kv_connector.decode_side import DecodeSide
from tandem.engine.kv_connector.host import LiveRequestHost
from tandem.engine.kv_connector.layer_ready import layer_ready_for
from tandem.engine.kv_connector.migrate_side import MigrateSide
from tandem.engine.kv_connector.prefill_side import PrefillSide
from tandem.engine.models.arch import ModelArch
from tandem.engine.outputs import KVCacheSpec


class KVConnector:
    """Both roles of the disaggregation seam over one engine's cache (module docstring)."""

    def __init__(
        self,
        requests: LiveRequestHost,
        kv: KVCacheManager,
        scheduler: Scheduler,
        outputs: OutputProcessor,
        vocab_size: int,
        kv_cache: torch.Tensor,
        spec: KVCacheSpec,
    ) -> None:
        """``kv_cache``: the engine's cache tensor, described by ``spec`` (``describe_cache``)."""
        self.ledger = RemoteKV(kv)
        self.decode = DecodeSide(requests, self.ledger, scheduler, outputs, vocab_size)
        self.prefill = PrefillSide(requests, self.ledger, scheduler, kv,
                                   layer_ready_for(kv_cache.device))
        self.migrate = MigrateSide(requests, self.ledger, scheduler, kv)
        self._kv_cache = kv_cache
        self._spec = spec

    @property
    def kv_cache(self) -> torch.Tensor:
        """The cache tensor ``[layers, planes, num_blocks, block_size, kv_heads, row_width]`` the
        transfer layer reads (prefill) or writes (decode); opaque to the workers."""
        return self._kv_cache

    def kv_cache_spec(self) -> KVCacheSpec:
        """What the cache tensor holds (the workers build kv_transfer's layout from it)."""
        return self._spec


def describe_cache(kv_cache: torch.Tensor, arch: ModelArch, model: str, dtype: torch.dtype,
                   block_size: int, tensor_parallel_size: int = 1,
                   kv_scales: str = "",
                   kv_head_ranges: tuple[tuple[int, int], ...] = ()) -> KVCacheSpec:
    """The ``KVCacheSpec`` of an engine's cache tensor (``arch``: what this process's cache
    holds, one rank's KV heads in a tensor-parallel group of ``tensor_parallel_size``;
    ``kv_scales``: how its per-tensor or per-layer scales are named, an fp8 cache's ``Fp8Scales.layout``)."""
    return KVCacheSpec(
        model=model,
        dtype=str(dtype).removeprefix("torch."),
        kv_dtype=str(kv_cache.dtype).removeprefix("torch."),
        block_size=block_size,
        num_layers=arch.num_layers,
        num_kv_heads=arch.kv_cache_heads,
        head_dim=arch.kv_cache_dim,
        # an int8 cache carries a scale after each head vector (tandem/engine/quant/kv_int8.py)
        scale_bytes=(kv_cache.shape[-1] - arch.kv_cache_dim) * kv_cache.element_size(),
        kv_lora_rank=arch.mla.kv_lora_rank if arch.mla is not None else 0,
        tensor_parallel_size=tensor_parallel_size,
        kv_scales=kv_scales,
        kv_head_ranges=kv_head_ranges,
    )
