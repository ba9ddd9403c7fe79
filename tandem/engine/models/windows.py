"""Which layers attend through a sliding window, and how wide it is.

transformers' semantics (``masking_utils.sliding_window_overlay``): a query at position p of a
sliding layer with window W sees the keys at positions p - W + 1 .. p (W keys, itself
included); a full layer sees 0 .. p. The families differ only in which layers slide:

    Mistral                  every layer, when ``sliding_window`` is set
    Qwen2/Qwen3              layers >= ``max_window_layers`` when ``use_sliding_window``
                             (transformers writes that into ``layer_types``)
    newer configs            ``layer_types``: "sliding_attention" / "full_attention" per layer
"""

from __future__ import annotations

from tandem.engine.models.arch import ModelArch


def layer_windows(arch: ModelArch) -> tuple[int | None, ...]:
    """Each layer's window (None: full attention), in layer order."""
    window = arch.sliding_window
    if not window:
        return (None,) * arch.num_layers
    if arch.layer_types:
        return tuple(window if t == "sliding_attention" else None for t in arch.layer_types)
    return (window,) * arch.num_layers


def block_free_window(arch: ModelArch) -> int | None:
    """The window the KV cache manager may free blocks behind: the widest layer window when
    every layer slides, else None (a full layer reads every block of its sequence)."""
    windows = layer_windows(arch)
    if not windows or any(w is None for w in windows):
        return None
    return max(w for w in windows if w is not None)
