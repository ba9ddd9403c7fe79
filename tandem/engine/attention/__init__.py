"""Attention backends over the paged KV cache.

Two backends share one interface (``AttentionBackend``): ``torch`` (the reference, runs
anywhere) and ``triton`` (paged kernels for GPUs; tested on CPU under ``TRITON_INTERPRET=1``).
Backends are imported lazily so that a machine without Triton still runs the torch one.
``mla.py`` attends over multi-head latent attention's latent cache through either backend.
"""

from __future__ import annotations

from tandem.engine.attention.base import AttentionBackend, AttentionMetadata


def get_backend(name: str) -> AttentionBackend:
    """Return the backend called ``name`` ("torch" or "triton")."""
    if name == "torch":
        from tandem.engine.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        from tandem.engine.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r} (expected 'torch' or 'triton')")


__all__ = ["AttentionBackend", "AttentionMetadata", "get_backend"]
