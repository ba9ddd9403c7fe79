"""tandem/engine/loader.py's resolve_model: the spec kinds it takes, and ModelLoadError (never the
torch-free ModelSpecError underneath) for what it cannot use."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.engine.errors import ModelLoadError
from tandem.engine.loader import resolve_model


def test_a_spec_that_is_nothing_is_a_model_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not an alias"):
        resolve_model(str(tmp_path / "nope"), tmp_path)


def test_a_directory_needs_a_config_and_weights(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_model(str(tmp_path), tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="safetensors"):
        resolve_model(str(tmp_path), tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert resolve_model(str(tmp_path), tmp_path) == tmp_path
