"""Prefix affinity: which prefill worker last served a prompt's leading blocks.

A prompt's leading full blocks are hashed as a chain, so prompts sharing a prefix share the
chain's first hashes::

    tokens:  [b0 ........][b1 ........][b2 ........][tail]
    hashes:   h0 = H(b0)   h1 = H(h0,b1) h2 = H(h1,b2)       (the partial tail is not hashed)

(the same chain the engine's prefix cache uses: tandem/common/block_hash.py).

The map from hash to worker is a bounded LRU, so memory stays flat however many prompts pass.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from tandem.common.block_hash import adapter_salt, block_hashes


def prefix_hashes(token_ids: Sequence[int], block_size: int, max_blocks: int = 256,
                  adapter: str = "") -> list[int]:
    """Chained hashes of the first full blocks of ``token_ids`` (at most ``max_blocks``): the
    engine's own prefix-cache chain (tandem/common/block_hash.py), so they match workers' reports;
    salted by the LoRA adapter identity ``adapter`` as the engine salts its chain."""
    return block_hashes(token_ids, block_size, max_blocks, adapter_salt(adapter))


class PrefixAffinity:
    """Bounded LRU map from prefix-chain hash to the endpoint that prefilled that prefix."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._capacity = capacity
        self._owner: OrderedDict[int, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._owner)

    def lookup(self, hashes: Sequence[int]) -> list[tuple[str, int]]:
        """Owners of the prefix, longest match first, as (endpoint, matched blocks)."""
        found: list[tuple[str, int]] = []
        seen: set[str] = set()
        for depth in range(len(hashes), 0, -1):
            endpoint = self._owner.get(hashes[depth - 1])
            if endpoint is not None and endpoint not in seen:
                seen.add(endpoint)
                found.append((endpoint, depth))
        return found

    def record(self, hashes: Sequence[int], endpoint: str) -> None:
        """Remember that ``endpoint`` now holds every prefix in ``hashes``."""
        for h in hashes:
            self._owner[h] = endpoint
            self._owner.move_to_end(h)
        while len(self._owner) > self._capacity:
            self._owner.popitem(last=False)

    def forget(self, endpoint: str) -> None:
        """Drop every entry pointing at ``endpoint`` (it left the pool)."""
        for h in [h for h, e in self._owner.items() if e == endpoint]:
            del self._owner[h]
