"""The mixture-of-experts families' specs: the weight plan names exactly the tensors of
transformers' checkpoints (per-expert names, as the Hub stores them), loading is strict about
experts too, forward-changing MoE fields are honoured or refused by name, training-only ones
are inert, and DeepSeek's routing fields are read or refused (tandem/engine/models/
moe_config.py)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from tandem.engine.errors import ModelLoadError, UnsupportedConfigError, UnusedTensorsError
from tandem.engine.models import family
from tandem.engine.models.moe_config import deepseek_moe
from tandem.engine.models.weights import load_model, read_arch

OPTIONS = [
    ("mixtral", {}),
    ("qwen2_moe", {"num_layers": 3, "mlp_only_layers": [1]}),
    ("qwen3_moe", {"num_layers": 3, "decoder_sparse_step": 2}),
    # latent attention + MoE from layer 1 (shared experts; V2's biased with mlp_bias)
    ("deepseek_v2", {"num_layers": 3, "first_k_dense_replace": 1}),
    ("deepseek_v2", {"num_layers": 3, "first_k_dense_replace": 1, "mlp_bias": True}),
    ("deepseek_v3", {"num_layers": 3, "first_k_dense_replace": 1}),
]


def _copy(src: Path, dst: Path, **changes: object) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize(("arch", "options"), OPTIONS)
def test_the_plan_names_every_tensor_of_the_checkpoint(family_dir, arch, options) -> None:
    path = family_dir(arch, **options)
    _, model_arch = read_arch(path)
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        stored = set(f.keys())
    assert sorted(family(arch).plan(model_arch).tensor_names()) == sorted(stored)


@pytest.mark.parametrize(("arch", "options"), OPTIONS)
def test_every_parameter_of_a_moe_test_checkpoint_is_perturbed(family_dir, arch,
                                                               options) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(family_dir(arch, **options))
    stored = hf.state_dict().keys()  # with the buffers a checkpoint holds (V3's router bias)
    values = [*hf.named_parameters(),
              *((n, b) for n, b in hf.named_buffers() if n in stored and b.is_floating_point())]
    for name, param in values:
        assert not torch.all(param == 0) and not torch.all(param == 1), name
        assert param.std() > 0.01, name
    if arch == "deepseek_v3":
        assert any(n.endswith("e_score_correction_bias") for n, _ in values)


def test_the_arch_says_which_layers_are_sparse(family_dir) -> None:
    _, arch = read_arch(family_dir("qwen2_moe", num_layers=3, mlp_only_layers=[1]))
    assert arch.moe is not None
    assert arch.moe.sparse_layers == (0, 2)
    assert (arch.moe.num_experts, arch.moe.top_k, arch.moe.shared_expert_gate) == (8, 2, True)
    _, arch = read_arch(family_dir("qwen3_moe", num_layers=3, decoder_sparse_step=2))
    assert arch.moe is not None and arch.moe.sparse_layers == (1,)
    assert arch.moe.shared_intermediate_size == 0


def test_a_missing_expert_tensor_is_named(family_dir, tmp_path) -> None:
    path = _copy(family_dir("qwen3_moe"), tmp_path / "ckpt")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=r"model\.layers\.1\.mlp\.experts\.5\.up_proj"):
        load_model(path, torch.float32, torch.device("cpu"), 64, progress=False)


def test_an_expert_beyond_num_experts_is_left_over(family_dir, tmp_path) -> None:
    """A ninth expert's tensors in an eight-expert checkpoint fail the load, named; a
    config counting fewer experts than the router holds fails on the router's shape."""
    path = _copy(family_dir("mixtral"), tmp_path / "ckpt")
    tensors = load_file(path / "model.safetensors")
    extra = "model.layers.1.block_sparse_moe.experts.8.w2.weight"
    tensors[extra] = tensors["model.layers.1.block_sparse_moe.experts.7.w2.weight"].clone()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnusedTensorsError) as err:
        load_model(path, torch.float32, torch.device("cpu"), 64, progress=False)
    assert err.value.names == [extra]
    fewer = _copy(family_dir("mixtral"), tmp_path / "fewer", num_local_experts=7)
    with pytest.raises(ModelLoadError, match=r"block_sparse_moe\.gate\.weight.*\(8, 64\)"):
        load_model(fewer, torch.float32, torch.device("cpu"), 64, progress=False)


@pytest.mark.parametrize(("arch", "changes", "field"), [
    ("qwen3_moe", {"num_experts_per_tok": 9}, "num_experts_per_tok"),
    ("qwen3_moe", {"decoder_sparse_step": 0}, "decoder_sparse_step"),
    ("qwen2_moe", {"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size"),
    ("mixtral", {"hidden_act": "gelu"}, "hidden_act"),
    ("mixtral", {"attention_bias": True}, "attention_bias"),
    ("qwen3_moe", {"kv_lora_rank": 64}, "kv_lora_rank"),
])
def test_a_moe_config_value_the_forward_does_not_compute_is_refused_by_name(
        family_dir, tmp_path, arch: str, changes: dict, field: str) -> None:
    path = _copy(family_dir(arch), tmp_path / "ckpt", **changes)
    with pytest.raises(UnsupportedConfigError) as err:
        read_arch(path)
    assert err.value.field == field and field in str(err.value)


@pytest.mark.parametrize(("arch", "changes"), [
    ("mixtral", {"router_jitter_noise": 0.1, "output_router_logits": True}),
    ("qwen3_moe", {"router_aux_loss_coef": 0.5, "output_router_logits": True}),
    ("deepseek_v2", {"aux_loss_alpha": 0.01, "seq_aux": True, "ep_size": 8}),
])
def test_training_only_fields_are_inert(family_dir, tmp_path, caplog, arch: str,
                                        changes: dict) -> None:
    moe_layers = {"first_k_dense_replace": 1} if arch.startswith("deepseek") else {}
    path = _copy(family_dir(arch, **moe_layers), tmp_path / "ckpt", **changes)
    with caplog.at_level(logging.WARNING, logger="tandem.engine.models.spec"):
        _, got = read_arch(path)
    assert got.moe is not None
    assert not [r for r in caplog.records if "does not know" in r.getMessage()]


def _deepseek(version: int, **config: object):
    from transformers import AutoConfig

    base = dict(n_routed_experts=16, n_group=4, topk_group=2, num_experts_per_tok=4,
                num_hidden_layers=4, first_k_dense_replace=1)
    return AutoConfig.for_model(f"deepseek_v{version}", **{**base, **config})


def test_deepseek_routing_is_read_per_version() -> None:
    v2 = deepseek_moe(_deepseek(2, topk_method="group_limited_greedy",
                                routed_scaling_factor=16.0), 2)
    assert (v2.routing, v2.topk_method, v2.n_group, v2.topk_group) == (
        "deepseek_v2", "group_limited_greedy", 4, 2)
    assert v2.routed_scaling_factor == 16.0 and v2.sparse_layers == (1, 2, 3)
    greedy = deepseek_moe(_deepseek(2, topk_method="greedy"), 2)
    assert (greedy.n_group, greedy.topk_group) == (1, 1)  # groups only limit grouped methods
    v3 = deepseek_moe(_deepseek(3, n_shared_experts=1, moe_intermediate_size=32), 3)
    assert (v3.routing, v3.topk_method, v3.norm_topk_prob) == ("deepseek_v3", "noaux_tc", True)
    assert v3.shared_intermediate_size == 32 and not v3.shared_expert_gate


@pytest.mark.parametrize(("version", "config", "field"), [
    (2, {"norm_topk_prob": True}, "norm_topk_prob"),
    (2, {"topk_method": "noaux_tc"}, "topk_method"),
    (3, {"topk_method": "greedy"}, "topk_method"),
    (3, {"n_group": 3}, "n_group"),
    (3, {"num_experts_per_tok": 17}, "num_experts_per_tok"),
])
def test_deepseek_routing_the_block_does_not_compute_is_refused(version: int, config: dict,
                                                                field: str) -> None:
    with pytest.raises(UnsupportedConfigError) as err:
        deepseek_moe(_deepseek(version, **config), version)
    assert err.value.field == field
