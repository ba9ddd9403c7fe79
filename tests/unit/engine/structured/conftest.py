"""A tiny random model that carries SmolLM2's tokenizer: grammars need a real vocabulary, and
what they enforce does not depend on the model's quality, so 100 samples stay cheap."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "chat_template.jinja")


@pytest.fixture(scope="session")
def tiny_vocab_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    from tandem.engine.testing import make_tiny_checkpoint

    path = make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-vocab"), vocab_size=49152)
    for name in _TOKENIZER_FILES:
        if (smollm2_dir / name).exists():
            shutil.copy(smollm2_dir / name, path / name)
    return path
