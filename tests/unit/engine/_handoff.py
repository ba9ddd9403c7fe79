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


def handoff_token_ids(prefill: Any, decode: Any, prompt: list[int], params: Any,
                      request_id: str = "r1") -> list[int]:
    """One request through a P/D handoff between two engines: ``prompt`` prefilled on
    ``prefill`` (its first token), its blocks copied layer by layer into the blocks ``decode``
    reserved after its ``skip_tokens`` (as the push would: a cached prefix, or the blocks
    behind a sliding window, are not shipped), then decoded there to the end; every generated
    token id. The prefill side's blocks are released once copied."""
    from tandem.engine import SamplingParams

    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rid = prefill.remote.prefill.add(prompt, one, request_id=request_id)
    first = None
    while prefill.has_unfinished():
        for out in prefill.step():
            first = out.token_ids[0]
    assert first is not None
    src = prefill.remote.prefill.held_block_ids(rid)
    granted = decode.remote.decode.reserve(request_id, prompt, params)
    skip = granted.skip_tokens // decode.kv.block_size
    dst = granted.fill_block_ids
    assert len(dst) == len(src) - skip
    copy_blocks(prefill, src[skip:], decode, dst, layer_by_layer=True)
    prefill.remote.prefill.release(rid)
    tokens = list(decode.remote.decode.commit(request_id, first).new_token_ids)
    while decode.has_unfinished():
        for out in decode.step():
            tokens += out.new_token_ids
    return tokens
