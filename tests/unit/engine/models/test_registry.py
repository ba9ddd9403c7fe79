"""The registry and the family specs: every family's weight plan names exactly the tensors
transformers' own model holds, and every parameter of the test checkpoints is perturbed."""

from __future__ import annotations

import pytest
import torch

from tandem.engine.errors import UnsupportedModelError
from tandem.engine.models import family, gguf_family, supported_model_types
from tandem.engine.models.registry import FAMILIES
from tandem.engine.models.weights import read_arch

OPTIONS = [
    ("llama", {}), ("llama", {"attention_bias": True, "mlp_bias": True}),
    ("llama", {"tie_word_embeddings": True}), ("mistral", {}), ("qwen2", {}),
    ("qwen3", {}), ("qwen3", {"attention_bias": True}),
    ("deepseek_v2", {}), ("deepseek_v2", {"attention_bias": True, "mlp_bias": True}),
    ("deepseek_v3", {}), ("deepseek_v3", {"attention_bias": True}),
]


@pytest.mark.parametrize(("arch", "options"), OPTIONS)
def test_the_plan_names_every_tensor_transformers_holds(family_dir, arch, options) -> None:
    from transformers import AutoModelForCausalLM

    path = family_dir(arch, **options)
    _, model_arch = read_arch(path)
    plan = family(arch).plan(model_arch)
    hf = AutoModelForCausalLM.from_pretrained(path)
    want = set(hf.state_dict())
    if model_arch.tie_word_embeddings:
        want.discard("lm_head.weight")
    assert sorted(plan.tensor_names()) == sorted(want)


@pytest.mark.parametrize(("arch", "options"), OPTIONS)
def test_every_parameter_of_a_test_checkpoint_is_perturbed(family_dir, arch, options) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(family_dir(arch, **options))
    for name, param in hf.named_parameters():
        assert not torch.all(param == 0) and not torch.all(param == 1), name
        assert param.std() > 0.01, name


def test_families_and_gguf_architectures() -> None:
    assert set(supported_model_types()) == {"llama", "mistral", "qwen2", "qwen3",
                                            "mixtral", "qwen2_moe", "qwen3_moe",
                                            "deepseek_v2", "deepseek_v3"}
    assert all(family(t).model_type == t for t in FAMILIES)
    assert gguf_family("llama") is family("llama")
    # llama.cpp writes Mixtral as llama with experts
    assert gguf_family("llama", experts=8) is family("mixtral")
    assert gguf_family("qwen2moe") is family("qwen2_moe")
    assert gguf_family("qwen3moe") is family("qwen3_moe")
    # V2 or V3: the file's router says which (tandem/engine/gguf_deepseek.py)
    assert gguf_family("deepseek2") is family("deepseek_v2")
    with pytest.raises(UnsupportedModelError, match="GGUF architecture 'mamba'.*llama"):
        gguf_family("mamba")


def test_the_native_forward_names_what_it_does_not_compute(family_dir) -> None:
    import dataclasses

    from tandem.engine.models.layers import MLP
    from tandem.engine.models.weights import load_model
    from tandem.engine.native import load, unsupported_reason

    if load() is None:
        pytest.skip("native kernels unavailable here")
    model, _ = load_model(family_dir("llama", attention_bias=True, mlp_bias=True),
                          torch.float32, torch.device("cpu"), 64, progress=False)
    assert unsupported_reason(model) is None  # biases on every linear: the kernels add them
    model.arch = dataclasses.replace(model.arch, hidden_act="gelu")
    assert unsupported_reason(model) == "hidden_act 'gelu'"
    model.arch = dataclasses.replace(model.arch, hidden_act="silu")

    class OtherMLP(MLP):
        pass

    model.layers[1].mlp.__class__ = OtherMLP
    assert "attention + gated MLP" in (unsupported_reason(model) or "")
