"""A KV layout as workers state it to each other through the router, and the check a prefill
worker makes before pushing into a decode worker's blocks.

    decode worker: KvLayout ──LayoutSummary.of──> Reserve's answer, Register ──> router
    router ──Prefill(layout)──> prefill worker: layout_mismatch(own KvLayout, theirs) ──> refuse

kv_transfer's ``KvLayout`` is the one layout type; a summary carries the fields a reader checks
(``dtype`` is the cache's storage dtype: the bytes that travel) and the fingerprint
kv_transfer compares again at HELLO.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.kv_transfer import KvLayout

_CHECKED = ("model", "dtype", "block_size", "num_layers", "num_kv_heads", "head_dim")


@dataclass(frozen=True, slots=True)
class LayoutSummary:
    """A worker's KV layout as stated to others: what is checked, and its fingerprint."""

    model: str
    dtype: str  # the cache's storage dtype (KvLayout.kv_dtype)
    block_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    fingerprint: str
    bytes_per_token: int = 0  # on the wire, every layer (0: not stated)

    @classmethod
    def of(cls, layout: KvLayout) -> LayoutSummary:
        """The summary of a transfer layout."""
        per_block = layout.payload_bytes(layout.num_layers, 1)
        return cls(model=layout.model_id, dtype=layout.kv_dtype, block_size=layout.block_size,
                   num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads,
                   head_dim=layout.head_dim, fingerprint=layout.fingerprint,
                   bytes_per_token=per_block // layout.block_size)


def layout_mismatch(own: KvLayout, theirs: LayoutSummary) -> str | None:
    """None when ``theirs`` (the decode worker's) is ``own``; else which fields differ, for
    the error's reason."""
    if theirs.fingerprint == own.fingerprint:
        return None
    mine = LayoutSummary.of(own)
    diffs = [
        f"{name}: {getattr(theirs, name)!r} (decode) != {getattr(mine, name)!r} (prefill)"
        for name in _CHECKED
        if getattr(theirs, name) != getattr(mine, name)
    ]
    diffs.append(f"fingerprint: {theirs.fingerprint!r} != {own.fingerprint!r}")
    return "KV layout mismatch: " + "; ".join(diffs)
