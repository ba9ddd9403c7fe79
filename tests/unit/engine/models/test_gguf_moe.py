"""GGUFs of the mixture-of-experts families (tandem/engine/gguf_moe.py, and the quantized
blocks of tandem/engine/quant/gguf_blocks.py): tiny perturbed checkpoints written as llama.cpp
writes them (tandem/engine/testing/gguf_writer.py: Mixtral as ``llama`` with stacked experts,
Qwen2-MoE with its shared expert, Qwen3-MoE), served greedy, fp32, token for token as
transformers serves the same weights: the checkpoint itself for an F32 file, the gguf
package's dequantization of the file for Q8_0/Q4_0/Q4_1, whose blocks the engine keeps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.errors import ModelLoadError, UnsupportedConfigError
from tandem.engine.loader import gguf_metadata, gguf_spec, resolve_model
from tandem.engine.models.layers import SparseMoE
from tandem.engine.models.linear import Linear
from tandem.engine.native import load
from tandem.engine.quant import Int4Linear
from tests.unit.engine._reference import engine_token_ids, hf_greedy

gguf_py = pytest.importorskip("gguf")
from tandem.engine.testing.gguf_writer import write_gguf  # noqa: E402  (needs gguf)

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
# arch -> make_tiny_checkpoint options (Qwen3-MoE renormalises its top-k, as llama.cpp does)
FAMILIES = {"mixtral": {}, "qwen2_moe": {}, "qwen3_moe": {"norm_topk_prob": True}}


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in (9, 60, 130)]


def _gguf(family_dir, tmp_path: Path, arch: str, qtype: str, **kw) -> tuple[Path, Path]:
    """(the HF checkpoint, its GGUF of ``qtype``)."""
    checkpoint = family_dir(arch, **FAMILIES[arch])
    return checkpoint, write_gguf(checkpoint, tmp_path / f"{arch}-{qtype}.gguf", qtype, **kw)


def _engine(make_engine, gguf: Path, cache: Path, **kw):
    return make_engine(model=str(gguf), cache_dir=str(cache), num_blocks=64, block_size=16,
                       dtype="float32", **kw)


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_a_float_gguf_serves_the_checkpoints_tokens(family_dir, make_engine, tmp_path,
                                                    arch: str) -> None:
    checkpoint, gguf = _gguf(family_dir, tmp_path, arch, "F32")
    assert gguf_spec(gguf_metadata(gguf)).model_type == arch  # Mixtral's file says "llama"
    engine = _engine(make_engine, gguf, tmp_path / "cache")
    assert all(isinstance(layer.mlp, SparseMoE) for layer in engine.runner.model.layers)
    prompts = _prompts()
    for prompt, tokens in zip(prompts, engine_token_ids(engine, prompts, GREEDY), strict=True):
        assert tokens == hf_greedy(checkpoint, prompt, GREEDY.max_tokens), arch


QUANTIZED = [("mixtral", "Q8_0"), ("qwen2_moe", "Q4_0"), ("qwen3_moe", "Q4_1")]


@pytest.mark.parametrize(("arch", "qtype"), QUANTIZED)
@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
def test_quantized_experts_are_served_from_their_blocks(family_dir, make_engine, tmp_path,
                                                        arch: str, qtype: str,
                                                        native: bool) -> None:
    """The fused native CPU forward runs every expert's Q4_0/Q4_1/Q8_0 blocks as stored; the torch
    path keeps Q4_1 (Int4Linear) and dequantizes the others. Either way each expert holds,
    bit for bit, the gguf package's dequantization of its rows of the stacked tensor, and
    the tokens are transformers' on that dequantization (but where torch's int4 kernel
    decodes in bf16)."""
    if native and load() is None:
        pytest.skip("native kernels unavailable here")
    _, gguf = _gguf(family_dir, tmp_path, arch, qtype)
    cache = tmp_path / "cache"
    engine = _engine(make_engine, gguf, cache, use_native_kernels=native)
    assert (engine.runner.fused is not None) == native  # the fused forward runs the experts
    dequantized = resolve_model(str(gguf), cache)  # what the engine converted it to
    reference = _reference_experts(dequantized, arch)
    layers = engine.runner.model.layers
    for i, layer in enumerate(layers):
        for e, expert in enumerate(layer.mlp.experts):
            for name in ("gate_up_proj", "down_proj"):
                module = getattr(expert, name)
                if native:
                    assert module.format == qtype
                elif qtype == "Q4_1":
                    assert isinstance(module, Int4Linear)
                else:
                    assert type(module) is Linear
                weight = module.weight if type(module) is Linear else module.dequantize()
                assert torch.equal(weight, reference[(i, e, name)]), (i, e, name)
    assert engine.weights_format.startswith(qtype if native or qtype == "Q4_1" else "unq")
    # torch's int4 kernel takes a decode step's few rows in bf16 (tandem/engine/quant/int4.py):
    # then only the prompt's token, computed over the fp32 dequantization, is exact
    exact = GREEDY.max_tokens if native or qtype != "Q4_1" else 1
    prompts = _prompts()
    for prompt, tokens in zip(prompts, engine_token_ids(engine, prompts, GREEDY), strict=True):
        want = hf_greedy(dequantized, prompt, GREEDY.max_tokens)
        assert tokens[:exact] == want[:exact], (arch, qtype)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_a_mixtral_gguf_with_one_tensor_per_expert_loads(family_dir, make_engine, tmp_path,
                                                        qtype: str) -> None:
    """llama.cpp's Mixtral GGUFs of before the stacked tensors (``blk.i.ffn_gate.e``): the
    same model, the same tokens; their Q8_0 blocks kept as stored where the kernels run."""
    checkpoint, gguf = _gguf(family_dir, tmp_path, "mixtral", qtype, stacked=False)
    names = {t.name for t in gguf_py.GGUFReader(str(gguf)).tensors}
    assert "blk.1.ffn_down.7.weight" in names and "blk.1.ffn_down_exps.weight" not in names
    cache = tmp_path / "cache"
    engine = _engine(make_engine, gguf, cache)
    reference = checkpoint if qtype == "F32" else resolve_model(str(gguf), cache)
    if qtype == "Q8_0" and load() is not None:
        assert all(expert.down_proj.format == "Q8_0" and expert.gate_up_proj.format == "Q8_0"
                   for layer in engine.runner.model.layers for expert in layer.mlp.experts)
    prompts = _prompts()
    for prompt, tokens in zip(prompts, engine_token_ids(engine, prompts, GREEDY), strict=True):
        assert tokens == hf_greedy(reference, prompt, GREEDY.max_tokens)


def _reference_experts(path: Path, arch: str) -> dict[tuple[int, int, str], torch.Tensor]:
    """(layer, expert, our module) -> the converted directory's weights, gate rows then up."""
    from safetensors import safe_open

    names = {"gate": "w1", "up": "w3", "down": "w2"} if arch == "mixtral" else {
        p: f"{p}_proj" for p in ("gate", "up", "down")}
    block = "block_sparse_moe" if arch == "mixtral" else "mlp"
    tensors: dict[str, torch.Tensor] = {}
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), "pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
    out = {}
    for key, value in tensors.items():
        parts = key.split(".")
        if parts[3:5] == [block, "experts"] and parts[6] == names["gate"]:
            layer, e = int(parts[2]), int(parts[5])
            prefix = f"model.layers.{layer}.{block}.experts.{e}"
            out[(layer, e, "gate_up_proj")] = torch.cat(
                [value, tensors[f"{prefix}.{names['up']}.weight"]])
            out[(layer, e, "down_proj")] = tensors[f"{prefix}.{names['down']}.weight"]
    return out


# -- refusals ------------------------------------------------------------------------------

def test_a_forward_changing_key_is_refused_by_name(family_dir, tmp_path) -> None:
    _, gguf = _gguf(family_dir, tmp_path, "mixtral", "F32",
                    metadata={"llama.rope.scaling.type": "yarn"})
    with pytest.raises(UnsupportedConfigError) as err:
        resolve_model(str(gguf), tmp_path / "cache")
    assert err.value.field == "llama.rope.scaling.type" and err.value.value == "yarn"
    assert not any((tmp_path / "cache" / "models").iterdir())  # nothing half-converted kept


def test_a_tensor_with_no_place_is_refused_by_name(family_dir, tmp_path) -> None:
    _, gguf = _gguf(family_dir, tmp_path, "qwen3_moe", "F32",
                    extra_tensors={"blk.0.ffn_gate.weight": np.ones((32, 64), np.float32)})
    with pytest.raises(ModelLoadError, match="'blk.0.ffn_gate.weight' has no place"):
        resolve_model(str(gguf), tmp_path / "cache")
