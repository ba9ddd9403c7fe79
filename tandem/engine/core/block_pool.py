"""Fixed-size KV blocks: reference counts, an LRU free queue, and the prefix-cache index.

A block with ref_cnt == 0 sits in the free queue; if it carries a hash it is still findable
by the prefix cache until it is handed out again (evicted, least recently freed first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class Block:
    """One physical KV block."""

    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None


class BlockPool:
    """All blocks of one cache, with ref counting and a hash -> block index."""

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[int, Block] = {}

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (cached-but-unused blocks included)."""
        return len(self._free)

    def usage(self) -> float:
        """Fraction of blocks referenced by some request."""
        return 1.0 - len(self._free) / self.num_blocks

    def get_cached(self, block_hash: int) -> Block | None:
        """The block holding this hash, if it is still cached."""
        return self._cached.get(block_hash)

    def cached_hashes(self, limit: int) -> list[int]:
        """Hashes of the cached blocks, at most ``limit`` of them (the most recently cached)."""
        if len(self._cached) <= limit:
            return list(self._cached)
        return list(self._cached)[-limit:]

    def allocate(self, n: int) -> list[Block]:
        """Hand out ``n`` blocks (ref_cnt 1), evicting least recently freed cached ones."""
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks, {len(self._free)} free")
        out = []
        for _ in range(n):
            _, block = self._free.popitem(last=False)
            if block.block_hash is not None:
                if self._cached.get(block.block_hash) is block:
                    del self._cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on prefix-cache hits (pulling idle ones out of the free queue)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: Iterable[Block]) -> None:
        """Drop one reference on each block; unreferenced ones join the free queue's tail."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"double free of block {block.block_id}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block

    def cache(self, block: Block, block_hash: int) -> None:
        """Make a full block findable by its hash (first writer wins on duplicates)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def reset_prefix_cache(self) -> int:
        """Forget every cached hash of unreferenced blocks; returns how many were dropped."""
        dropped = 0
        for block in self._free.values():
            if block.block_hash is not None:
                self._cached.pop(block.block_hash, None)
                block.block_hash = None
                dropped += 1
        return dropped

    def num_referenced(self) -> int:
        """Blocks with ref_cnt > 0 (zero when nothing leaks)."""
        return sum(1 for b in self.blocks if b.ref_cnt > 0)
