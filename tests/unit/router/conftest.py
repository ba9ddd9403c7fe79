"""Router test fixtures: the SmolLM2 tokenizer, loaded once."""

from __future__ import annotations

import pytest

from tandem.router.tokenizer import RouterTokenizer


@pytest.fixture(scope="session")
def tokenizer() -> RouterTokenizer:
    """The default model's tokenizer (tests may use the engine to locate it; tandem/router/ may not)."""
    from tandem.engine.loader import resolve_model

    return RouterTokenizer(resolve_model("smollm2"))
