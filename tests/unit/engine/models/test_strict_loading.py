"""Strict loading: a checkpoint loads only when every tensor is consumed and every config
field that changes the forward is honoured; otherwise a typed ModelLoadError names the culprit
(tandem/engine/models/weights.py, spec.py, registry.py; tandem/engine/checkpoint.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tandem.engine.checkpoint import context_limit, served_context
from tandem.engine.errors import (
    ContextLengthError,
    ModelLoadError,
    UnsupportedConfigError,
    UnsupportedModelError,
    UnusedTensorsError,
)
from tandem.engine.models import weights
from tandem.engine.models.weights import load_model, read_arch

CPU = torch.device("cpu")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(path: Path, **changes: object) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def _load(path: Path):
    return load_model(path, torch.float32, CPU, 64, progress=False)


def test_a_tensor_the_model_does_not_consume_fails_the_load(family_dir, tmp_path) -> None:
    # a Llama with MLP biases whose config forgot mlp_bias: served as is, the biases would
    # silently drop out of every layer
    path = _copy(family_dir("llama", mlp_bias=True), tmp_path / "ckpt")
    _edit_config(path, mlp_bias=False)
    with pytest.raises(UnusedTensorsError) as err:
        _load(path)
    assert err.value.names == sorted(
        f"model.layers.{i}.mlp.{p}_proj.bias" for i in range(2) for p in ("down", "gate", "up"))
    assert "model.layers.0.mlp.down_proj.bias" in str(err.value)


def test_a_stray_tensor_is_named(family_dir, tmp_path) -> None:
    path = _copy(family_dir("qwen2"), tmp_path / "ckpt")
    state = load_file(str(path / "model.safetensors"))
    state["model.layers.1.self_attn.o_proj.bias"] = torch.ones(64)  # Qwen2 has no o bias
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UnusedTensorsError, match=r"model\.layers\.1\.self_attn\.o_proj\.bias"):
        _load(path)


def test_old_rotary_buffers_are_the_only_ignored_tensors(family_dir, tmp_path) -> None:
    path = _copy(family_dir("llama"), tmp_path / "ckpt")
    state = load_file(str(path / "model.safetensors"))
    state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    model, _ = _load(path)
    assert model.layers[0].self_attn.o_proj.bias is None


def test_a_tied_checkpoint_with_a_different_lm_head_is_refused(family_dir, tmp_path) -> None:
    path = _copy(family_dir("qwen2", tie_word_embeddings=True), tmp_path / "ckpt")
    state = load_file(str(path / "model.safetensors"))
    assert "lm_head.weight" not in state
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    _load(path)  # the embedding itself, stored twice: consumed
    state["lm_head.weight"][0, 0] += 1.0
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UnsupportedConfigError, match="tie_word_embeddings"):
        _load(path)


def test_a_missing_or_misshapen_tensor_is_named(family_dir, tmp_path) -> None:
    path = _copy(family_dir("llama", attention_bias=True), tmp_path / "ckpt")
    state = load_file(str(path / "model.safetensors"))
    norm = state["model.layers.0.post_attention_layernorm.weight"]
    state["model.layers.0.post_attention_layernorm.weight"] = torch.ones(1)  # would broadcast
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="post_attention_layernorm.*shape"):
        _load(path)
    state["model.layers.0.post_attention_layernorm.weight"] = norm
    del state["model.layers.1.self_attn.o_proj.bias"]
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"lacks tensor 'model\.layers\.\d\..*'"):
        _load(path)


@pytest.mark.parametrize("model_type", ["gpt_neox", "no_such_model"])
def test_an_unknown_model_type_is_refused_before_transformers_reads_it(
        family_dir, tmp_path, monkeypatch, model_type: str) -> None:
    path = _copy(family_dir("llama"), tmp_path / "ckpt")
    _edit_config(path, model_type=model_type)
    read: list[Path] = []
    monkeypatch.setattr(weights, "load_hf_config", lambda p: read.append(p))
    with pytest.raises(UnsupportedModelError) as err:
        read_arch(path)
    assert err.value.name == model_type and "llama" in err.value.supported
    assert "qwen3" in str(err.value) and read == []


def test_the_engine_refuses_an_unknown_model_type_with_the_typed_error(
        family_dir, tmp_path, make_engine) -> None:
    path = _copy(family_dir("llama"), tmp_path / "ckpt")
    _edit_config(path, model_type="gpt_neox")
    with pytest.raises(UnsupportedModelError, match="gpt_neox"):
        make_engine(model=str(path), num_blocks=8)


@pytest.mark.parametrize(("arch", "changes", "field"), [
    ("llama", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     "rope_parameters.rope_type"),
    ("llama", {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 8,
                                "long_factor": [1.0] * 8, "original_max_position_embeddings": 512}},
     "rope_parameters.rope_type"),
    ("llama", {"partial_rotary_factor": 0.5}, "rope_parameters.partial_rotary_factor"),
    ("llama", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ("llama", {"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
    ("llama", {"sliding_window": 64}, "sliding_window"),
    ("mistral", {"attention_bias": True}, "attention_bias"),
    ("qwen2", {"mlp_bias": True}, "mlp_bias"),
    ("qwen2", {"num_experts": 8}, "num_experts"),
    ("qwen3", {"layer_types": ["full_attention", "chunked_attention"]}, "layer_types"),
])
def test_a_config_value_the_forward_does_not_compute_is_refused_by_name(
        family_dir, tmp_path, arch: str, changes: dict, field: str) -> None:
    path = _copy(family_dir(arch), tmp_path / "ckpt")
    _edit_config(path, **changes)
    with pytest.raises(UnsupportedConfigError) as err:
        read_arch(path)
    assert err.value.field == field and field in str(err.value)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_every_family_reads_its_own_config(family_dir, arch: str) -> None:
    _, got = read_arch(family_dir(arch))
    assert got.model_type == arch and got.hidden_act == "silu"


def test_max_model_len_above_the_model_is_refused(family_dir, make_engine) -> None:
    path = family_dir("llama", max_position_embeddings=256)
    with pytest.raises(ContextLengthError) as err:
        make_engine(model=str(path), num_blocks=8, max_model_len=257)
    assert (err.value.asked, err.value.limit) == (257, 256)
    assert "max_position_embeddings" in str(err.value)
    assert make_engine(model=str(path), num_blocks=8).max_model_len == 256
    assert make_engine(model=str(path), num_blocks=8, max_model_len=100).max_model_len == 100


def test_a_sliding_window_does_not_limit_the_context(family_dir) -> None:
    # sliding layers attend through their window: the limit is max_position_embeddings
    _, arch = read_arch(family_dir("mistral", sliding_window=64))
    assert arch.sliding_window == 64
    assert context_limit(arch) == (arch.max_position_embeddings, "max_position_embeddings")
    assert served_context(arch, None) == arch.max_position_embeddings
    with pytest.raises(ContextLengthError, match="max_position_embeddings"):
        served_context(arch, arch.max_position_embeddings + 1)


def test_layer_types_of_the_wrong_length_are_refused(family_dir) -> None:
    # transformers validates its own configs; a config read another way (GGUF metadata) is not
    from types import SimpleNamespace

    from tandem.engine.models.registry import family

    config = json.loads((family_dir("qwen2") / "config.json").read_text())
    config["layer_types"] = ["full_attention"] * (config["num_hidden_layers"] + 1)
    with pytest.raises(UnsupportedConfigError, match="layer_types"):
        family("qwen2").arch(SimpleNamespace(**config))


def test_qwen_windows_apply_only_where_a_layer_slides(family_dir) -> None:
    # use_sliding_window with max_window_layers past the last layer: no layer slides
    _, arch = read_arch(family_dir("qwen2", use_sliding_window=True, sliding_window=64,
                                   max_window_layers=2))
    assert arch.sliding_window is None
    _, arch = read_arch(family_dir("qwen2", use_sliding_window=True, sliding_window=64,
                                   max_window_layers=1))
    assert arch.sliding_window == 64
    assert arch.layer_types == ("full_attention", "sliding_attention")


def test_unknown_metadata_keys_load_and_are_logged(family_dir, tmp_path, caplog) -> None:
    path = _copy(family_dir("qwen3"), tmp_path / "ckpt")
    _edit_config(path, exporter_version="1.2", attention_dropout=0.1)
    with caplog.at_level("WARNING", logger="tandem.engine.models.spec"):
        _, arch = read_arch(path)
    assert arch.qk_norm and "exporter_version" in caplog.text
    assert "attention_dropout" not in caplog.text  # inert: dropout is off at inference
