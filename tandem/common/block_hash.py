"""The prefix-cache hash chain: one definition for the engine's cache and the router's maps.

    tokens:  [b0 ........][b1 ........][b2 ........][tail]
    hashes:   h0 = H(-, b0)  h1 = H(h0, b1)  h2 = H(h1, b2)    (the partial tail: no hash)

A block's hash names its tokens *and* everything before them, so two sequences share a hash
only where they share the whole prefix up to that block. The engine indexes its cached blocks
by these hashes (tandem/engine/core/block_pool.py), a decode worker reports the hashes it holds
(``pack``), and the router computes the same chain from a prompt's token ids to see which
worker already holds how much of it. xxh3-64: stable across processes and machines.

A chain may be salted (``salt``: a request's LoRA adapter identity, hashed): the salt heads
the first block instead of "no parent", so the same tokens under another adapter, or under
the base model, never share a hash and never reuse each other's KV.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Collection, Sequence

import xxhash


def hash_block(parent: int | None, token_ids: Sequence[int], salt: int | None = None) -> int:
    """Hash of a full block, chained to the hash of the block before it (None: the first,
    headed by ``salt`` when the chain has one)."""
    return _chained(parent, array("q", token_ids).tobytes(), salt)


def block_hashes(token_ids: Sequence[int], block_size: int, max_blocks: int | None = None,
                 salt: int | None = None) -> list[int]:
    """The chain over the full blocks of ``token_ids`` (at most ``max_blocks`` of them),
    salted by ``salt`` when given."""
    n_full = len(token_ids) // block_size
    if max_blocks is not None:
        n_full = min(n_full, max_blocks)
    data = array("q", token_ids[: n_full * block_size]).tobytes()  # one conversion for all
    step = 8 * block_size
    hashes: list[int] = []
    parent: int | None = None
    for i in range(n_full):
        parent = _chained(parent, data[i * step : (i + 1) * step], salt)
        hashes.append(parent)
    return hashes


def _chained(parent: int | None, block: bytes, salt: int | None = None) -> int:
    if parent is not None:
        head = parent.to_bytes(8, "little") + b"\x01"
    elif salt is not None:
        head = salt.to_bytes(8, "little") + b"\x02"
    else:
        head = _FIRST
    return xxhash.xxh3_64_intdigest(head + block)


_FIRST = bytes(8) + b"\x00"  # the head of a chain's first block: no parent


def adapter_salt(identity: str) -> int | None:
    """The chain salt of a LoRA adapter identity (``name@digest``; "" : the base model, no
    salt): the engine's prefix cache and the router's affinity use this one function."""
    return xxhash.xxh3_64_intdigest(b"lora\0" + identity.encode()) if identity else None


def pack(hashes: Collection[int]) -> bytes:
    """Hashes as the wire carries them: little-endian uint64s, back to back."""
    return struct.pack(f"<{len(hashes)}Q", *hashes)


def unpack(data: bytes) -> frozenset[int]:
    """The set ``pack`` wrote; trailing bytes short of a whole hash are ignored."""
    return frozenset(struct.unpack_from(f"<{len(data) // 8}Q", data))
