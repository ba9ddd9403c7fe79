"""Router test fixtures: the SmolLM2 tokenizer, loaded once."""

from __future__ import annotations

import pytest

from router.tokenizer import RouterTokenizer


@pytest.fixture(scope="session")
def tokenizer() -> RouterTokenizer:
    """The default model's tokenizer (tests may use the engine to locate it; router/ may not)."""
    from engine.loader import resolve_model

    return RouterTokenizer(resolve_model("smollm2"))
