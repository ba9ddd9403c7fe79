"""Qwen2 / Qwen2.5: biases on q, k and v (never on o or the MLP), and a sliding window on
the layers ``layer_types`` marks ``sliding_attention`` (from ``max_window_layers`` on, when
``use_sliding_window`` is set)."""

from __future__ import annotations

from typing import Any

from tandem.engine.models.arch import Features
from tandem.engine.models.spec import COMMON_FIELDS, ConfigField, FamilySpec

LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


def window(config: Any) -> int | None:
    """The window of the layers that slide, None when none does (the Qwen config rule)."""
    if "sliding_attention" not in (getattr(config, "layer_types", None) or ()):
        return None
    return getattr(config, "sliding_window", None) or None


def layer_types(config: Any) -> tuple[str, ...]:
    """Each layer's attention kind, as transformers derives it (empty: the config has none)."""
    return tuple(getattr(config, "layer_types", None) or ())


# honoured through ``layer_types``, which transformers derives from them
SLIDING_FIELDS = (
    ConfigField("use_sliding_window", default=False),
    ConfigField("sliding_window"),
    ConfigField("layer_types", lambda v: set(v or ()) <= LAYER_TYPES,
                f"layer types {sorted(LAYER_TYPES)}"),
)


def _features(config: Any) -> Features:
    return Features(qkv_bias=True, sliding_window=window(config),
                    layer_types=layer_types(config))


SPEC = FamilySpec(
    model_type="qwen2",
    fields=COMMON_FIELDS + SLIDING_FIELDS,
    features=_features,
    gguf_architectures=("qwen2",),
)
