"""A checkpoint's calibrated fp8 KV scales (vLLM's ``k_scale``/``v_scale`` per layer, or
AutoFP8's ``k_proj.output_scale``): under ``--kv-cache-dtype fp8`` each layer's cache stores
its K and V by that layer's scales and the transfer layout names them all; under any other
cache they are unused; scales that cannot serve are refused by name at load."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tandem.engine import SamplingParams
from tandem.engine.errors import ModelLoadError
from tandem.engine.quant.kv_fp8 import Fp8Scales, dequantize_fp8
from tandem.kv_transfer import LayoutMismatchError
from tandem.kv_transfer.layout import KvLayout
from tandem.worker.convert import kv_layout

PROMPT = [3 + (i * 37) % 250 for i in range(40)]
# per layer, exact in float32 (a checkpoint stores them so), far from 1.0 and without
# saturating the tiny model's K and V (|x| < 448 * scale)
K_SCALES, V_SCALES = (2.0, 4.0), (2.0, 0.5)
PER_LAYER = Fp8Scales(K_SCALES, V_SCALES)


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
    assert f8.runner.fp8_scales == PER_LAYER
    assert f8.runner.fp8_scales.layout == "per-layer k=[2.0, 4.0] v=[2.0, 0.5]"
    layout = kv_layout(f8.remote.kv_cache_spec())
    assert layout.kv_scales == PER_LAYER.layout
    # a peer whose scales differ in one layer (or that folded them per tensor) is refused
    for other in (Fp8Scales((2.0, 4.0), (2.0, 0.25)), Fp8Scales(4.0, 2.0)):
        with pytest.raises(LayoutMismatchError, match="kv_scales"):
            layout.check_compatible(KvLayout(**{**layout.to_wire(), "kv_scales": other.layout}))
    f16 = make_engine(**kw, kv_cache_dtype="float16")
    assert f16.runner.fp8_scales is None  # unused by a float cache; the load still succeeds
    _prefill(f8)
    _prefill(f16)
    # layer 0's K and V come straight from the embeddings: the same in both caches but for
    # e4m3's rounding (later layers' inputs went through attention over the fp8 cache)
    want = f16.runner.kv_cache[0].float()  # [2, blocks, bs, Hkv, D]: the same blocks in both
    stored = f8.runner.kv_cache[0]
    assert want.abs().amax() > 1.0
    for plane, scale in zip((0, 1), PER_LAYER.layer(0), strict=True):
        got = dequantize_fp8(stored[plane], scale, torch.float32)
        assert torch.allclose(got, want[plane], rtol=0.1, atol=2**-8 * scale)
        # read by 1.0 (vLLM's default, the cache without calibrated scales) it is far off
        assert not torch.allclose(dequantize_fp8(stored[plane], 1.0, torch.float32),
                                  want[plane], rtol=0.1, atol=2**-8 * scale)


def test_autofp8_spelling_reads_the_same(make_engine, tiny_dir, tmp_path: Path) -> None:
    model = _with_tensors(tiny_dir("llama", 2), tmp_path / "m", _scales("autofp8"))
    engine = make_engine(model=str(model), num_blocks=8, kv_cache_dtype="fp8")
    assert engine.runner.fp8_scales == PER_LAYER


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


@pytest.mark.parametrize("native", [(True, False), (False, True), (False, False)],
                         ids=["native-to-torch", "torch-to-native", "torch-to-torch"])
def test_handoff_carries_per_layer_scales(make_engine, scaled: Path, tmp_path: Path,
                                          native: tuple[bool, bool]) -> None:
    """Prefill on one engine, its fp8 blocks copied layer by layer into another's under the
    same per-layer scales (the native step and the torch path each side), decode there: one
    engine's tokens. A decode peer whose scales differ in one layer is refused before any
    byte is copied."""
    from tandem.engine.native import load as native_lib
    from tests.unit.engine._handoff import copy_blocks, handoff_token_ids

    if any(native) and native_lib() is None:
        pytest.skip("native kernels unavailable here")
    kw = dict(model=str(scaled), num_blocks=32, block_size=16, kv_cache_dtype="fp8")
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = make_engine(**kw, use_native_kernels=False)
    rid = alone.add_request(PROMPT, params)
    want: list[int] = []
    while alone.has_unfinished():
        want += [t for o in alone.step() if o.request_id == rid for t in o.new_token_ids]
    prefill, decode = (make_engine(**kw, use_native_kernels=n) for n in native)
    assert [e.runner.fused is not None for e in (prefill, decode)] == list(native)
    assert handoff_token_ids(prefill, decode, PROMPT, params) == want
    other = _with_tensors(scaled, tmp_path / "other",
                          {"model.layers.1.self_attn.v_scale": torch.tensor(0.25)})
    peer = make_engine(**{**kw, "model": str(other)})
    before = peer.runner.kv_cache.view(torch.uint8).clone()
    with pytest.raises(LayoutMismatchError, match="kv_scales"):
        copy_blocks(decode, [0], peer, [0])
    assert torch.equal(peer.runner.kv_cache.view(torch.uint8), before)
