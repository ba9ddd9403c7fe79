"""Per-layer sliding windows read from transformers' configs (no weights needed)."""

from __future__ import annotations

import pytest

from tandem.engine.errors import ModelLoadError
from tandem.engine.models.arch import ModelArch
from tandem.engine.models.registry import arch_of
from tandem.engine.models.windows import block_free_window, layer_windows


def _arch(model_type: str, **config: object) -> ModelArch:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type, num_hidden_layers=4, hidden_size=64,
                               num_attention_heads=4, intermediate_size=128, **config)
    return arch_of(cfg)


def test_mistral_slides_on_every_layer() -> None:
    arch = _arch("mistral", sliding_window=4096)
    assert layer_windows(arch) == (4096,) * 4
    assert block_free_window(arch) == 4096


def test_mistral_without_a_window_is_full_attention() -> None:
    arch = _arch("mistral", sliding_window=None)
    assert layer_windows(arch) == (None,) * 4
    assert block_free_window(arch) is None


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_slides_from_max_window_layers_on(model_type: str) -> None:
    arch = _arch(model_type, use_sliding_window=True, sliding_window=256, max_window_layers=2)
    assert layer_windows(arch) == (None, None, 256, 256)
    assert block_free_window(arch) is None  # the full layers read every block


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_without_use_sliding_window_is_full_attention(model_type: str) -> None:
    arch = _arch(model_type, use_sliding_window=False, sliding_window=256)
    assert layer_windows(arch) == (None,) * 4


def test_layer_types_alternate_full_and_sliding() -> None:
    kinds = ["sliding_attention", "full_attention"] * 2
    arch = _arch("qwen3", use_sliding_window=True, sliding_window=128, layer_types=kinds)
    assert layer_windows(arch) == (128, None, 128, None)


def test_every_layer_sliding_frees_behind_the_widest() -> None:
    arch = _arch("qwen2", use_sliding_window=True, sliding_window=64, max_window_layers=0)
    assert layer_windows(arch) == (64,) * 4 and block_free_window(arch) == 64


def test_an_unknown_layer_type_is_refused_by_name() -> None:
    with pytest.raises(ModelLoadError, match="chunked_attention"):
        _arch("qwen3", use_sliding_window=True, sliding_window=64,
              layer_types=["chunked_attention", "full_attention"] * 2)
