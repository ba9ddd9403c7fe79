"""tandem/common/gguf_metadata.py reads what the ``gguf`` package (llama.cpp's own writer) writes:
every value type, string and numeric arrays; a file that is not a GGUF or is cut short is a
typed error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tandem.common.gguf_metadata import GgufMetadataError, read_gguf_metadata


def _write(path: Path) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.context_length", 4096)
    w.add_int64("x.i64", -(2**40))
    w.add_float32("x.f32", 0.5)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.chat_template", "{{ messages[0]['content'] }} ünï 🎉")
    w.add_array("tokenizer.ggml.tokens", ["<s>", "Ġthe", "日本", ""])
    w.add_array("tokenizer.ggml.token_type", [3, 1, 1, 1])
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_every_kind_of_value_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    _write(path)
    md = read_gguf_metadata(path)
    assert md["general.architecture"] == "llama"
    assert (md["llama.context_length"], md["x.i64"], md["x.f32"]) == (4096, -(2**40), 0.5)
    assert md["tokenizer.ggml.add_bos_token"] is False
    assert md["tokenizer.chat_template"] == "{{ messages[0]['content'] }} ünï 🎉"
    assert md["tokenizer.ggml.tokens"] == ["<s>", "Ġthe", "日本", ""]
    assert md["tokenizer.ggml.token_type"] == [3, 1, 1, 1]


def test_not_a_gguf_and_a_cut_file_are_typed_errors(tmp_path: Path) -> None:
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(GgufMetadataError, match="not a GGUF"):
        read_gguf_metadata(other)
    path = tmp_path / "m.gguf"
    _write(path)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:120])
    with pytest.raises(GgufMetadataError, match="malformed|past the end"):
        read_gguf_metadata(cut)
