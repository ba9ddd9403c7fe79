"""FP8 checkpoints (``quant_method: fp8``) load exactly and strictly: dequantized, or kept in
e4m3 for the native CPU kernels.

Checkpoints are written by tandem/engine/testing/fp8_checkpoint.py from a tiny perturbed
model: e4m3 weights with one ``weight_scale`` per tensor, or block-wise ``weight_scale_inv``
in blocks that do not divide the weights (partial edge blocks). Every loaded linear must equal
the format's reference ``weight.float() * scale`` bit for bit (a kept one: what its bytes and
scales stand for), and the engine's greedy output must equal transformers' ``generate()`` on
a float checkpoint holding those reference weights.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tandem.engine.errors import ModelLoadError
from tandem.engine.models.weights import load_model
from tandem.engine.native import load as native_lib
from tandem.engine.native.packed_linear import KIND_FP8, PackedLinear
from tandem.engine.quant.prequantized import Fp8Format, format_from_config
from tandem.engine.sampling_params import SamplingParams
from tandem.engine.testing import make_tiny_checkpoint
from tandem.engine.testing.fp8_checkpoint import write_dequantized, write_fp8
from tests.unit.engine._reference import engine_token_ids, hf_greedy

CPU = torch.device("cpu")
BLOCKS = {"tensor": None, "block48x32": (48, 32)}
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "self_attn.o_proj": ("self_attn.o_proj",),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
         "mlp.down_proj": ("mlp.down_proj",)}


@pytest.fixture(scope="module")
def fp8_pair(tmp_path_factory: pytest.TempPathFactory):
    """``fp8_pair(kind, arch)``: (fp8 dir, dequantized float dir, reference weights)."""
    made: dict[tuple[str, str], tuple[Path, Path, dict[str, torch.Tensor]]] = {}

    def get(kind: str, arch: str = "llama"):
        if (kind, arch) not in made:
            root = tmp_path_factory.mktemp(f"fp8-{kind}-{arch}")
            dense = make_tiny_checkpoint(root / "dense", arch=arch, hidden_size=128)
            ref = write_fp8(dense, root / "fp8", BLOCKS[kind])
            write_dequantized(dense, root / "ref", ref)
            made[kind, arch] = (root / "fp8", root / "ref", ref)
        return made[kind, arch]

    return get


@pytest.mark.parametrize("kind", list(BLOCKS))
def test_layers_equal_the_reference_dequantization(fp8_pair, kind: str) -> None:
    qdir, _, ref = fp8_pair(kind)
    stored = load_file(str(qdir / "model.safetensors"))
    assert stored["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    model = load_model(qdir, torch.float32, CPU, 256, progress=False)[0]
    assert model.dequantized_from == ("fp8-tensor" if kind == "tensor" else "fp8-block48x32")
    for i, layer in enumerate(model.layers):
        for ours, parts in FUSED.items():
            want = torch.cat([ref[f"model.layers.{i}.{p}"] for p in parts])
            assert torch.equal(layer.get_submodule(ours).weight, want), (i, ours)
    # kept for the native CPU kernels: e4m3 bytes and scales standing for the same weights
    kept = load_model(qdir, torch.float32, CPU, 256, progress=False, native_layout=True)[0]
    assert kept.quant_format == model.dequantized_from and kept.dequantized_from is None
    for i, layer in enumerate(kept.layers):
        for ours, parts in FUSED.items():
            lin = layer.get_submodule(ours)
            assert isinstance(lin, PackedLinear) and lin.kind == KIND_FP8, (i, ours)
            assert lin.q.element_size() == 1
            want = torch.cat([ref[f"model.layers.{i}.{p}"] for p in parts])
            assert torch.equal(lin.dequantize(), want), (i, ours)
    assert type(kept.lm_head) is type(model.lm_head)  # stored in float: loaded as it is


@pytest.mark.parametrize("kind,arch", [("tensor", "llama"), ("block48x32", "llama"),
                                       ("block48x32", "qwen3"), ("tensor", "qwen3_moe"),
                                       ("block48x32", "deepseek_v3")])
def test_engine_greedy_equals_transformers_on_the_dequantized_weights(
        fp8_pair, make_engine, kind: str, arch: str) -> None:
    qdir, refdir, _ = fp8_pair(kind, arch)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    prompts = [[5, 17, 33, 101, 7], list(range(40, 90))]
    label = "fp8-tensor" if kind == "tensor" else "fp8-block48x32"
    for quantization in ("fp8", "auto", "none"):
        engine = make_engine(model=str(qdir), num_blocks=32, quantization=quantization)
        # fp32 on the CPU: kept in e4m3 where the native kernels run (fp8, auto)
        if native_lib() is not None and quantization != "none":
            assert engine.weights_format.startswith(f"{label} x"), engine.weights_format
        else:
            assert engine.weights_format == f"{label} (dequantized at load)"
        got = engine_token_ids(engine, prompts, params)
        assert got == [hf_greedy(refdir, p, 10) for p in prompts]


def test_every_fp8_linear_is_kept_but_mlas_kv_b_proj(fp8_pair, caplog) -> None:
    """Kept for the native kernels whatever its width (DeepSeek-V3's q_b_proj reads
    q_lora_rank = 24 inputs, its o_proj 4 heads x 12 = 48): one byte a weight, the reference
    dequantization bit for bit. kv_b_proj alone is dequantized (MLA absorbs it into float
    matrices), and the load log names both sets and the reason."""
    qdir, _, ref = fp8_pair("block48x32", "deepseek_v3")
    with caplog.at_level(logging.INFO, logger="tandem.engine.models.weights"):
        kept = load_model(qdir, torch.float32, CPU, 256, progress=False, native_layout=True)[0]
    odd = 0
    for i, layer in enumerate(kept.layers):
        attn = layer.self_attn
        for name in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"):
            lin = attn.get_submodule(name)
            assert isinstance(lin, PackedLinear) and lin.kind == KIND_FP8, (i, name)
            assert lin.q.shape == (lin.out_features, lin.in_features)  # no padding
            assert torch.equal(lin.dequantize(), ref[f"model.layers.{i}.self_attn.{name}"])
            odd += lin.in_features % 32 != 0
        kv_b = attn.kv_b_proj
        assert not isinstance(kv_b, PackedLinear)
        assert torch.equal(kv_b.weight, ref[f"model.layers.{i}.self_attn.kv_b_proj"])
    assert odd == 2 * len(kept.layers)  # q_b_proj and o_proj
    said = [r.getMessage() for r in caplog.records if "kept quantized" in r.getMessage()]
    assert len(said) == 1, said
    kept_part, _, dequantized_part = said[0].partition("; dequantized at load: ")
    n = len(kept.layers)
    for name in ("q_b_proj", "o_proj", "kv_a_proj_with_mqa"):
        assert f"layers.*.self_attn.{name} x{n}" in kept_part
    assert "kv_b_proj" not in kept_part
    assert dequantized_part == (f"layers.*.self_attn.kv_b_proj x{n} (multi-head latent "
                                "attention absorbs kv_b_proj into float matrices)")


def test_fp8_quantization_refuses_a_checkpoint_not_in_fp8(tiny_dir, make_engine) -> None:
    with pytest.raises(ModelLoadError, match="loads checkpoints stored in FP8"):
        make_engine(model=str(tiny_dir("llama", 2)), num_blocks=8, quantization="fp8")


def _rewrite(src: Path, dst: Path, edit_tensors=None, edit_qc=None) -> Path:
    dst.mkdir()
    state = load_file(str(src / "model.safetensors"))
    if edit_tensors:
        edit_tensors(state)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    if edit_qc:
        edit_qc(config["quantization_config"])
    (dst / "config.json").write_text(json.dumps(config))
    return dst


Q = "model.layers.0.self_attn.q_proj"


def test_loading_is_strict(fp8_pair, tmp_path: Path) -> None:
    block, _, _ = fp8_pair("block48x32")
    tensor, _, _ = fp8_pair("tensor")

    def load(path: Path) -> None:
        load_model(path, torch.float32, CPU, 256, progress=False)

    # a static activation scale is refused by name, not left unused
    with pytest.raises(ModelLoadError, match="input_scale"):
        load(_rewrite(tensor, tmp_path / "a", lambda s: s.update(
            {Q + ".input_scale": torch.ones(1)})))
    # a scale beside a float weight
    with pytest.raises(ModelLoadError, match="lm_head.weight_scale scales lm_head.weight"):
        load(_rewrite(tensor, tmp_path / "b", lambda s: s.update(
            {"lm_head.weight_scale": torch.ones(1)})))
    # a calibrated KV scale for one layer alone fails the load naming what is missing
    # (complete ones serve an fp8 KV cache: tests/unit/engine/quant/test_kv_fp8_checkpoint_scales.py)
    with pytest.raises(ModelLoadError, match="no k_scale for layer 1"):
        load(_rewrite(tensor, tmp_path / "g", lambda s: s.update(
            {"model.layers.0.self_attn.k_scale": torch.ones(1)})))
    # an fp8 weight without its scale
    with pytest.raises(ModelLoadError, match="no scale"):
        load(_rewrite(block, tmp_path / "c", lambda s: s.pop(Q + ".weight_scale_inv")))
    # block scales of the wrong shape
    with pytest.raises(ModelLoadError, match="expected"):
        load(_rewrite(block, tmp_path / "d", lambda s: s.update(
            {Q + ".weight_scale_inv": torch.ones(1, 1)})))
    # block scales without weight_block_size
    with pytest.raises(ModelLoadError, match="without weight_block_size"):
        load(_rewrite(block, tmp_path / "e", edit_qc=lambda qc: qc.pop("weight_block_size")))
    # a NaN code in an e4m3 weight (the kernels have no NaN); a scale that is not finite
    def nan(state: dict) -> None:
        state[Q + ".weight"].view(torch.uint8)[3, 5] = 0xFF

    for native in (False, True):
        with pytest.raises(ModelLoadError, match="holds NaN"):
            load_model(_rewrite(tensor, tmp_path / f"h{native}", nan), torch.float32, CPU, 256,
                       progress=False, native_layout=native)
        with pytest.raises(ModelLoadError, match="not finite"):
            load_model(_rewrite(block, tmp_path / f"i{native}", lambda s: s[
                Q + ".weight_scale_inv"].__setitem__((0, 0), float("inf"))),
                torch.float32, CPU, 256, progress=False, native_layout=native)
    # a weight stored in another shape than the model's: kept in e4m3 or dequantized, the
    # load fails (the kernels would write its rows past the layer's output)
    down = "model.layers.0.mlp.down_proj.weight"

    def reshape(state: dict) -> None:
        w = state[down]
        state[down] = torch.cat([w] * 4)[:, :32].contiguous()

    for native in (False, True):
        with pytest.raises(ModelLoadError, match="down_proj"):
            load_model(_rewrite(tensor, tmp_path / f"s{native}", reshape), torch.float32, CPU,
                       256, progress=False, native_layout=native)
    # an fp8 tensor outside a linear (no scale applies to it)
    with pytest.raises(ModelLoadError, match="no scale applies"):
        load(_rewrite(tensor, tmp_path / "f", lambda s: s.update(
            {"model.norm.weight": s["model.norm.weight"].to(torch.float8_e4m3fn)})))


@pytest.mark.parametrize("qc,match", [
    ({"activation_scheme": "static"}, "activation_scheme 'static'"),
    ({"fmt": "e5m2"}, "fmt 'e5m2'"),
    ({"weight_block_size": [128]}, "weight_block_size"),
    ({"kv_cache_scheme": {"num_bits": 8}}, "kv_cache_scheme"),
])
def test_unsupported_configs_are_refused_by_name(qc: dict, match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        format_from_config({"quant_method": "fp8", **qc})
    assert format_from_config({"quant_method": "fp8"}) == Fp8Format(None)


def test_blocks_larger_than_the_weight_scale_it_whole(fp8_pair, tmp_path: Path) -> None:
    """A weight_block_size past every weight's edge (a hostile 2^30 included) is one block per
    weight: the same values as per-tensor scales, without sizing anything by the config."""
    tensor, _, _ = fp8_pair("tensor")

    def to_blocks(state: dict) -> None:
        for name in [n for n in state if n.endswith(".weight_scale")]:
            state[name + "_inv"] = state.pop(name).reshape(1, 1)

    huge = _rewrite(tensor, tmp_path / "huge", to_blocks,
                    lambda qc: qc.update(weight_block_size=[2**20, 2**30]))
    for native in (False, True):
        want, _ = load_model(tensor, torch.float32, CPU, 256, progress=False,
                             native_layout=native)
        got, _ = load_model(huge, torch.float32, CPU, 256, progress=False,
                            native_layout=native)
        for (name, a), (_, b) in zip(want.state_dict().items(), got.state_dict().items(),
                                     strict=True):
            assert torch.equal(a, b), name
        layer = lambda m: m.get_submodule("layers.0.self_attn.qkv_proj")  # noqa: E731
        if native:  # kept in e4m3: its dequantization, the same values
            assert torch.equal(layer(want).dequantize(), layer(got).dequantize())
