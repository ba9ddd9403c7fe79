"""A checkpoint's calibrated fp8 KV scales (vLLM's ``k_scale``/``v_scale`` per layer, or
AutoFP8's ``k_proj.output_scale``): under ``--kv-cache-dtype fp8`` the cache stores K and V
by them (folded per tensor: the largest layer's) and its transfer layout names them; under
any other cache they are unused; scales that cannot serve are refused by name at load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tandem.engine import SamplingParams
from tandem.engine.errors import ModelLoadError
from tandem.engine.quant.kv_fp8 import Fp8Scales, dequantize_fp8
from tandem.worker.convert import kv_layout

PROMPT = [3 + (i * 37) % 250 for i in range(40)]
# per layer, exact in float32 (a checkpoint stores them so), far from 1.0 and without
# saturating the tiny model's K and V (|x| < 448 * scale); folded: k 4, v 2
K_SCALES, V_SCALES = (2.0, 4.0), (2.0, 0.5)
FOLDED = Fp8Scales(4.0, 2.0)


def _with_tensors(src: Path, dest: Path, extra: dict[str, torch.Tensor],
                  drop: tuple[str, ...] = ()) -> Path:
    """A copy of the checkpoint ``src`` with ``extra`` tensors added (``drop`` removed)."""
    shutil.copytree(src, dest)
    state = load_file(str(dest / "model.safetensors"))
    state = {k: v for k, v in state.items() if k not in drop} | extra
    save_file(state, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def _scales(spelling: str = "vllm") -> dict[str, torch.Tensor]:
    out = {}
    for layer, (k, v) in enumerate(zip(K_SCALES, V_SCALES, strict=True)):
        for which, value in (("k", k), ("v", v)):
            name = (f"self_attn.{which}_scale" if spelling == "vllm"
                    else f"self_attn.{which}_proj.output_scale")
            out[f"model.layers.{layer}.{name}"] = torch.tensor(value)
    return out


@pytest.fixture(scope="module")
def scaled(tiny_dir, tmp_path_factory) -> Path:
    return _with_tensors(tiny_dir("llama", 2), tmp_path_factory.mktemp("kv") / "scaled",
                         _scales() | {"model.layers.0.self_attn.q_scale": torch.tensor(0.1)})


def _prefill(engine) -> None:
    engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=1))
    while engine.has_unfinished():
        engine.step()


def test_the_cache_stores_by_the_checkpoints_scales(make_engine, scaled: Path) -> None:
    kw = dict(model=str(scaled), num_blocks=16, block_size=16, use_native_kernels=False)
    f8 = make_engine(**kw, kv_cache_dtype="fp8")
    assert f8.runner.fp8_scales == FOLDED
    assert kv_layout(f8.remote.kv_cache_spec()).kv_scales == FOLDED.layout
    f16 = make_engine(**kw, kv_cache_dtype="float16")
    assert f16.runner.fp8_scales is None  # unused by a float cache; the load still succeeds
    _prefill(f8)
    _prefill(f16)
    # layer 0's K and V come straight from the embeddings: the same in both caches but for
    # e4m3's rounding (later layers' inputs went through attention over the fp8 cache)
    want = f16.runner.kv_cache[0].float()  # [2, blocks, bs, Hkv, D]: the same blocks in both
    stored = f8.runner.kv_cache[0]
    assert want.abs().amax() > 1.0
    for plane, scale in ((0, FOLDED.k), (1, FOLDED.v)):
        got = dequantize_fp8(stored[plane], scale, torch.float32)
        assert torch.allclose(got, want[plane], rtol=0.1, atol=2**-8 * scale)
        # read by 1.0 (vLLM's default, the cache without calibrated scales) it is far off
        assert not torch.allclose(dequantize_fp8(stored[plane], 1.0, torch.float32),
                                  want[plane], rtol=0.1, atol=2**-8 * scale)


def test_autofp8_spelling_reads_the_same(make_engine, tiny_dir, tmp_path: Path) -> None:
    model = _with_tensors(tiny_dir("llama", 2), tmp_path / "m", _scales("autofp8"))
    engine = make_engine(model=str(model), num_blocks=8, kv_cache_dtype="fp8")
    assert engine.runner.fp8_scales == FOLDED


def _bad(scales: dict[str, torch.Tensor], drop: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    return {k: v for k, v in (_scales() | scales).items() if k not in drop}


@pytest.mark.parametrize(("tensors", "says"), [
    (_bad({"model.layers.1.self_attn.k_scale": torch.full((2,), 0.1)}),
     "model.layers.1.self_attn.k_scale holds 2 values .*per-channel or per-head"),
    (_bad({"model.layers.0.self_attn.v_scale": torch.tensor(float("nan"))}),
     "model.layers.0.self_attn.v_scale is nan: a KV scale must be finite and > 0"),
    (_bad({"model.layers.0.self_attn.k_scale": torch.tensor(0.0)}), "finite and > 0"),
    (_bad({}, drop=("model.layers.1.self_attn.v_scale",)),
     "no v_scale for layer 1"),
    ({"model.layers.0.self_attn.k_scale": torch.tensor(0.1),
      "model.layers.1.self_attn.k_scale": torch.tensor(0.1)}, "k_scale but no v_scale"),
    (_bad({"model.layers.2.self_attn.k_scale": torch.tensor(0.1)}), "has 2 layers"),
    (_bad({"model.layers.0.self_attn.k_proj.output_scale": torch.tensor(0.1)}),
     "stored twice"),
], ids=["per-channel", "nan", "zero", "missing-layer", "k-without-v", "no-such-layer",
        "two-spellings"])
def test_scales_that_cannot_serve_are_refused_by_name(
    make_engine, tiny_dir, tmp_path: Path, tensors: dict[str, torch.Tensor], says: str,
) -> None:
    model = _with_tensors(tiny_dir("llama", 2), tmp_path / "m", tensors)
    with pytest.raises(ModelLoadError, match=says):
        make_engine(model=str(model), num_blocks=8, kv_cache_dtype="fp8")
