"""A GGUF of an architecture no family computes is refused from its header, before the file
is hashed or converted (tandem/engine/loader.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tandem.engine.errors import UnsupportedModelError
from tandem.engine.loader import gguf_architecture, resolve_model

gguf = pytest.importorskip("gguf")


def _write_gguf(path: Path, arch: str) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_tensor("token_embd.weight", np.ones((8, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_unsupported_architecture_is_refused_before_conversion(tmp_path: Path) -> None:
    model = _write_gguf(tmp_path / "m.gguf", "mamba")
    cache = tmp_path / "cache"
    with pytest.raises(UnsupportedModelError) as err:
        resolve_model(str(model), cache)
    assert err.value.name == "mamba" and "llama" in err.value.supported
    assert not cache.exists()  # nothing converted, nothing cached


def test_the_architecture_is_read_from_the_header(tmp_path: Path) -> None:
    assert gguf_architecture(_write_gguf(tmp_path / "q.gguf", "qwen3")) == "qwen3"
