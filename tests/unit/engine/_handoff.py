"""Move KV blocks between two engines in one process, as the transfer layer does over a
socket: kv_transfer's own block access over each engine's cache, layouts checked first."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tandem.kv_transfer.blocks import KvBlocks
from tandem.worker.convert import kv_layout


def copy_blocks(
    src: Any, src_ids: Sequence[int], dst: Any, dst_ids: Sequence[int], layer_by_layer: bool = False
) -> None:
    """``dst.remote.kv_cache[:, :, dst_ids] = src.remote.kv_cache[:, :, src_ids]`` (engines),
    all layers at once or one layer per copy (the layer-wise push)."""
    a = KvBlocks(src.remote.kv_cache, kv_layout(src.remote.kv_cache_spec()))
    b = KvBlocks(dst.remote.kv_cache, kv_layout(dst.remote.kv_cache_spec()))
    a.layout.check_compatible(b.layout)
    n = a.layout.num_layers
    for lo, hi in [(i, i + 1) for i in range(n)] if layer_by_layer else [(0, n)]:
        b.scatter(lo, hi, dst_ids, a.gather(lo, hi, src_ids))  # [hi - lo, 2, len(ids), ...]
