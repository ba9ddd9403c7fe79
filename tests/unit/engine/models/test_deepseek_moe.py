"""DeepSeek-V2/V3 as released: multi-head latent attention in every layer and a mixture of
experts from ``first_k_dense_replace`` on, against transformers, fp32, greedy, token for token,
on tiny checkpoints whose every parameter (routers, experts, shared experts, V3's
``e_score_correction_bias``, biases, norms) is perturbed; colocated and through a P/D handoff
of the latent blocks. Also the refusals of the routing the block does not compute, and V3's
multi-token-prediction layers, which the strict loader skips (they are not used for plain
decoding) while failing on any other leftover."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tandem.engine import SamplingParams
from tandem.engine.errors import UnsupportedConfigError, UnusedTensorsError
from tandem.engine.models.layers import MLP, SparseMoE
from tandem.engine.models.layers.mla import MlaAttention
from tandem.engine.models.weights import load_model, read_arch
from tests.unit.engine._handoff import handoff_token_ids
from tests.unit.engine._reference import engine_token_ids, hf_greedy

BLOCK = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
# three layers, layer 0 dense and layers 1, 2 MoE (8 routed experts, 2 per token, shared ones)
MOE = {"num_layers": 3, "first_k_dense_replace": 1}
# name -> (arch, make_tiny_checkpoint options)
CASES = {
    # V2: q from the hidden state, softmax greedy top-k, two shared experts
    "v2": ("deepseek_v2", MOE),
    # V2: group-limited greedy (2 of 4 groups), routed scaling, biased latent/o/MLP projections
    # (the shared experts too, as transformers builds them)
    "v2-grouped-biases": ("deepseek_v2", {**MOE, "topk_method": "group_limited_greedy",
                                          "n_group": 4, "topk_group": 2,
                                          "routed_scaling_factor": 1.5, "attention_bias": True,
                                          "mlp_bias": True}),
    # V3: q-LoRA, sigmoid scores, bias-corrected choice within 2 of 4 groups, renormalised,
    # routed_scaling_factor 2.5
    "v3": ("deepseek_v3", MOE),
    # V3 unnormalised, another scaling, RoPE on halves
    "v3-unnormalised": ("deepseek_v3", {**MOE, "norm_topk_prob": False,
                                        "routed_scaling_factor": 0.7,
                                        "rope_interleave": False}),
}


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in lengths]


def _engine(make_engine, path: Path, **kw):
    """The torch path's engine (the fused native one: tests/unit/engine/native/
    test_fused_deepseek.py)."""
    return make_engine(model=str(path), block_size=BLOCK,
                       **{"num_blocks": 128, "use_native_kernels": False, **kw})


def _copy(src: Path, dst: Path, **changes: object) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **changes}))
    return dst


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_equals_transformers(family_dir, make_engine, case: str) -> None:
    arch, options = CASES[case]
    path = family_dir(arch, **options)
    engine = _engine(make_engine, path)
    layers = engine.runner.model.layers
    assert all(isinstance(layer.self_attn, MlaAttention) for layer in layers)
    assert [type(layer.mlp) for layer in layers] == [MLP, SparseMoE, SparseMoE]
    assert all(layer.mlp.shared_expert is not None for layer in layers[1:])
    assert engine.runner.kv_cache.shape[1:] == (1, 128, BLOCK, 1, 32 + 8)  # the latent cache
    if arch == "deepseek_v3":  # the checkpoint's correction bias, not transformers' zeros
        assert layers[1].mlp.gate.e_score_correction_bias.abs().min() > 0
    prompts = _prompts([3, 9, 30, 75], seed=1)
    got = engine_token_ids(engine, prompts, GREEDY)
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens), case


@pytest.mark.parametrize("case", ["v2-grouped-biases", "v3"])
def test_handoff_equals_colocated(family_dir, make_engine, case: str) -> None:
    """Prefill on P, the latent blocks copied layer by layer as the push would, decode on D
    (MoE layers on both sides): transformers' tokens."""
    arch, options = CASES[case]
    path = family_dir(arch, **options)
    prefill = _engine(make_engine, path, num_blocks=64)
    decode = _engine(make_engine, path, num_blocks=64)
    prompt = _prompts([41], seed=4)[0]
    tokens = handoff_token_ids(prefill, decode, prompt, GREEDY)
    assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens)


@pytest.mark.parametrize(("arch", "changes", "field"), [
    # transformers' V2 router never renormalises, DeepSeek's own code does
    ("deepseek_v2", {"norm_topk_prob": True}, "norm_topk_prob"),
    ("deepseek_v2", {"moe_layer_freq": 2}, "moe_layer_freq"),
    ("deepseek_v3", {"moe_layer_freq": 2}, "moe_layer_freq"),
    ("deepseek_v3", {"topk_method": "greedy"}, "topk_method"),
    ("deepseek_v3", {"n_group": 3}, "n_group"),  # groups must divide the 8 experts
    ("deepseek_v3", {"num_nextn_predict_layers": -1}, "num_nextn_predict_layers"),
])
def test_routing_the_block_does_not_compute_is_refused_by_name(
        family_dir, tmp_path, arch: str, changes: dict, field: str) -> None:
    path = _copy(family_dir(arch, **MOE), tmp_path / "ckpt", **changes)
    with pytest.raises(UnsupportedConfigError) as err:
        read_arch(path)
    assert err.value.field == field and field in str(err.value)


def test_every_layer_dense_has_no_moe(family_dir) -> None:
    """first_k_dense_replace >= num_hidden_layers: no MoE block anywhere (the arch says so,
    so nothing downstream treats the model as MoE)."""
    _, arch = read_arch(family_dir("deepseek_v3"))
    assert arch.mla is not None and arch.moe is None
    _, arch = read_arch(family_dir("deepseek_v3", **MOE))
    assert arch.moe is not None and arch.moe.sparse_layers == (1, 2)


# --- V3's multi-token-prediction layers -------------------------------------------------------

def _mtp_tensors(tensors: dict[str, torch.Tensor], layer: int) -> dict[str, torch.Tensor]:
    """A multi-token-prediction layer at ``layer`` as DeepSeek-V3's checkpoints store one: a
    decoder layer (layer 1's tensors here) plus its own norms, projection, embedding and
    head."""
    out = {name.replace("model.layers.1.", f"model.layers.{layer}.", 1): t.clone()
           for name, t in tensors.items() if name.startswith("model.layers.1.")}
    hidden = tensors["model.norm.weight"].shape[0]
    p = f"model.layers.{layer}."
    out.update({p + "enorm.weight": torch.ones(hidden), p + "hnorm.weight": torch.ones(hidden),
                p + "eh_proj.weight": torch.zeros(hidden, 2 * hidden),
                p + "shared_head.norm.weight": torch.ones(hidden),
                p + "shared_head.head.weight": tensors["lm_head.weight"].clone(),
                p + "embed_tokens.weight": tensors["model.embed_tokens.weight"].clone()})
    return out


def _with_mtp(src: Path, dst: Path, layers: list[int], **changes: object) -> Path:
    path = _copy(src, dst, **changes)
    tensors = load_file(path / "model.safetensors")
    for layer in layers:
        tensors.update(_mtp_tensors(tensors, layer))
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def test_mtp_layers_are_skipped_with_a_log_line(family_dir, make_engine, tmp_path,
                                                caplog) -> None:
    """A V3 checkpoint with its multi-token-prediction layer (model.layers.3.* after three
    decoder layers, num_nextn_predict_layers 1) loads; those tensors are skipped, said once,
    and the output is the checkpoint's without them."""
    src = family_dir("deepseek_v3", **MOE)
    path = _with_mtp(src, tmp_path / "mtp", [3], num_nextn_predict_layers=1)
    n_mtp = sum(1 for name in load_file(path / "model.safetensors")
                if name.startswith("model.layers.3."))
    with caplog.at_level(logging.INFO, logger="tandem.engine.models.weights"):
        engine = _engine(make_engine, path)
    said = [r.getMessage() for r in caplog.records if "multi-token-prediction" in r.getMessage()]
    assert said == [f"skipped {n_mtp} checkpoint tensors of layers 3: multi-token-prediction "
                    "layers (num_nextn_predict_layers=1), not used for plain decoding"]
    assert len(engine.runner.model.layers) == 3
    prompt = _prompts([19], seed=5)[0]
    assert engine_token_ids(engine, [prompt], GREEDY)[0] == hf_greedy(src, prompt,
                                                                      GREEDY.max_tokens)


@pytest.mark.parametrize(("count", "layers", "left_over"), [
    (0, [3], 3),  # the config declares none: layer 3 is a leftover
    (1, [3, 4], 4),  # one declared, two stored: the second is
])
def test_tensors_past_the_mtp_layers_are_left_over(family_dir, tmp_path, count: int,
                                                   layers: list[int], left_over: int) -> None:
    path = _with_mtp(family_dir("deepseek_v3", **MOE), tmp_path / "mtp", layers,
                     num_nextn_predict_layers=count)
    stored = load_file(path / "model.safetensors")
    with pytest.raises(UnusedTensorsError) as err:
        load_model(path, torch.float32, torch.device("cpu"), 64, progress=False)
    assert err.value.names == sorted(n for n in stored
                                     if n.startswith(f"model.layers.{left_over}."))


def test_v2_has_no_mtp_layers(family_dir, tmp_path) -> None:
    """Only V3 declares multi-token-prediction layers: a V2 checkpoint with tensors past its
    layers fails the load naming them."""
    src = family_dir("deepseek_v2", **MOE)
    path = _copy(src, tmp_path / "v2")
    tensors = load_file(path / "model.safetensors")
    extra = "model.layers.3.enorm.weight"
    tensors[extra] = torch.ones(tensors["model.norm.weight"].shape)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnusedTensorsError) as err:
        load_model(path, torch.float32, torch.device("cpu"), 64, progress=False)
    assert err.value.names == [extra]
