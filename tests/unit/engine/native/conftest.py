"""Fixtures shared by the native kernel tests."""

from __future__ import annotations

import pytest

import tandem.engine.quant.int4 as int4_mod
import tandem.engine.quant.int8 as int8_mod


@pytest.fixture
def exact_torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quantized layers multiply by their fp32 dequantized weights at every row count (the
    torch reference the native kernels are compared with)."""
    monkeypatch.setattr(int4_mod, "DEQUANT_MIN_ROWS", 0)
    monkeypatch.setattr(int8_mod, "DEQUANT_MIN_ROWS", 0)
