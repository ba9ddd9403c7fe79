"""The fp8 (e4m3) KV cache: its write/read and its per-tensor or per-layer scales, greedy agreement with the
float cache on tiny models, the prefix cache, and the block handoff carrying fp8 blocks under
a layout that names the scales (an fp16 or differently scaled peer refused)."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from bench.quality.perplexity import token_nlls
from tandem.engine import EngineConfig, SamplingParams
from tandem.engine.attention import get_backend
from tandem.engine.attention.base import AttentionMetadata
from tandem.engine.cli_args import add_engine_args, engine_config_from_args
from tandem.engine.model_runner import copy_kv_blocks
from tandem.engine.native import load
from tandem.engine.quant.kv_fp8 import (
    FP8_MAX,
    Fp8KVBackend,
    Fp8Scales,
    dequantize_fp8,
    quantize_fp8,
)
from tandem.kv_transfer.errors import LayoutMismatchError
from tandem.kv_transfer.layout import KvLayout
from tandem.worker.convert import kv_layout
from tests.unit.engine._handoff import copy_blocks, handoff_token_ids

PROMPT = [3 + (i * 37) % 250 for i in range(45)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _run(engine, prompt=PROMPT, params=GREEDY) -> list[int]:
    rid = engine.add_request(prompt, params)
    out: list[int] = []
    while engine.has_unfinished():
        out += [t for o in engine.step() if o.request_id == rid for t in o.new_token_ids]
    return out


def test_round_trip_within_e4m3_precision_and_saturates() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 64, generator=g) * torch.tensor([0.05, 0.5, 2.0, 30.0, 200.0])[:, None, None]
    for scale in (1.0, 0.125, 4.0):
        q = quantize_fp8(x, scale)
        assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
        back = dequantize_fp8(q, scale, torch.float32)
        mag = (x / scale).abs()
        normal = (mag >= 2.0**-6) & (mag <= FP8_MAX)  # e4m3's normal range: 3 mantissa bits
        rel = ((back - x).abs() / x.abs())[normal]
        assert rel.max() <= 2.0**-4 + 1e-6, rel.max()  # half a step of 2^-3
        sub = mag < 2.0**-6  # subnormals: an absolute step of 2^-9 * scale
        assert ((back - x).abs()[sub] <= 2.0**-10 * scale + 1e-9).all()
        over = mag > FP8_MAX  # saturated, never NaN
        assert torch.equal(back[over].abs(), torch.full_like(back[over], FP8_MAX * scale))
    # past 448 * scale it saturates (a plain cast would give NaN)
    big = torch.tensor([1e4, -1e4, 447.0])
    assert dequantize_fp8(quantize_fp8(big, 1.0), 1.0, torch.float32).tolist() == \
        [FP8_MAX, -FP8_MAX, 448.0]
    # with scale 32: 1e4 / 32 = 312.5 lies in [256, 512), steps of 32: nearest 320
    assert dequantize_fp8(quantize_fp8(big, 32.0), 32.0, torch.float32)[0] == 320 * 32


def test_copy_on_write_copies_fp8_blocks_bit_for_bit() -> None:
    kv = quantize_fp8(torch.randn(2, 2, 6, 4, 2, 8, generator=torch.Generator().manual_seed(2)) * 9,
                      1.0)
    before = kv.view(torch.uint8).clone()
    copy_kv_blocks(kv, [(1, 4), (3, 5)])
    raw = kv.view(torch.uint8)
    assert torch.equal(raw[:, :, 4], before[:, :, 1]) and torch.equal(raw[:, :, 5], before[:, :, 3])
    assert torch.equal(raw[:, :, :4], before[:, :, :4])


def test_scales_are_positive_and_named() -> None:
    assert Fp8Scales().layout == "per-tensor k=1.0 v=1.0"
    assert Fp8Scales(0.5, 2.0).layout != Fp8Scales(2.0, 0.5).layout
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite and > 0"):
            Fp8Scales(k=bad)


def test_per_layer_scales_are_canonical_and_named() -> None:
    one = Fp8Scales((0.5, 0.5), (2.0, 2.0))  # every layer alike: per tensor
    assert one == Fp8Scales(0.5, 2.0) and not one.per_layer
    assert one.layout == Fp8Scales(0.5, 2.0).layout == "per-tensor k=0.5 v=2.0"
    mixed = Fp8Scales((0.5, 0.25, 0.5), 2.0)
    assert mixed.per_layer and mixed.v == (2.0,)
    assert [mixed.layer(i) for i in range(3)] == [(0.5, 2.0), (0.25, 2.0), (0.5, 2.0)]
    assert mixed.for_layers(3) == [(0.5, 2.0), (0.25, 2.0), (0.5, 2.0)]
    assert mixed.layout == "per-layer k=[0.5, 0.25, 0.5] v=[2.0]"
    assert mixed.layout != Fp8Scales((0.5, 0.5, 0.25), 2.0).layout
    assert Fp8Scales(0.5, 2.0).for_layers(4) == [(0.5, 2.0)] * 4
    with pytest.raises(ValueError, match="for 3 layers, the model has 2"):
        mixed.for_layers(2)
    with pytest.raises(ValueError, match="3 layers of K and 2 of V"):
        Fp8Scales((0.5, 0.25, 0.5), (1.0, 2.0))
    with pytest.raises(ValueError, match="finite and > 0"):
        Fp8Scales((0.5, float("nan")))
    with pytest.raises(ValueError, match="no values"):
        Fp8Scales(())
    # a deep model's scales: named by a digest of every value, short enough for the HELLO
    k = tuple(0.01 + i / 7919 for i in range(126))
    deep = Fp8Scales(k, 0.5).layout
    assert deep.startswith("per-layer k=[0.01..") and " sha256=" in deep
    assert len(deep) < 200 and deep == Fp8Scales(k, 0.5).layout
    moved = k[:60] + (math.nextafter(k[60], 1.0),) + k[61:]  # one layer, one ulp
    assert Fp8Scales(moved, 0.5).layout != deep


def test_each_layer_writes_and_reads_under_its_own_scales() -> None:
    """``for_layer(l)``: layer l's K and V quantized with its scales, and attended over as
    the torch backend over the cache dequantized with them."""
    g = torch.Generator().manual_seed(4)
    nb, bs, hkv, d, t = 4, 4, 2, 16, 6
    scales = Fp8Scales((0.25, 0.5), (2.0, 0.125))
    backend = Fp8KVBackend(get_backend("torch"), scales)
    slots = torch.tensor([9, 10, 11, 12, 13, 14])
    meta = AttentionMetadata.build([t], [15], [[0, 1, 2, 3]], slots.tolist(), bs,
                                   torch.device("cpu"))
    q = torch.randn(t, 4, d, generator=g)
    for layer, (ks, vs) in enumerate(((0.25, 2.0), (0.5, 0.125))):
        view = backend.for_layer(layer)
        assert view is backend.for_layer(layer) and view.name == "torch+fp8kv"
        key, value = torch.randn(t, hkv, d, generator=g), torch.randn(t, hkv, d, generator=g)
        kc = torch.zeros(nb, bs, hkv, d, dtype=torch.float8_e4m3fn)
        vc = torch.zeros_like(kc)
        view.write_kv(key, value, kc, vc, slots)
        flat_k, flat_v = kc.view(-1, hkv, d), vc.view(-1, hkv, d)
        assert torch.equal(flat_k[slots].view(torch.uint8), quantize_fp8(key, ks).view(torch.uint8))
        assert torch.equal(flat_v[slots].view(torch.uint8),
                           quantize_fp8(value, vs).view(torch.uint8))
        got = view.attend(q, kc, vc, meta, d**-0.5)
        want = get_backend("torch").attend(q, dequantize_fp8(kc, ks, torch.float32),
                                           dequantize_fp8(vc, vs, torch.float32), meta, d**-0.5)
        assert torch.allclose(got, want, atol=1e-6)
    per_tensor = Fp8KVBackend(get_backend("torch"), Fp8Scales(0.5, 2.0))
    assert per_tensor.for_layer(1) is per_tensor


def test_backend_writes_scaled_e4m3_and_attends_as_the_float_cache() -> None:
    """Write K/V through the fp8 backend (scales 0.25 / 2), read the cache bytes back; attend
    over it equals the torch backend over the dequantized cache."""
    g = torch.Generator().manual_seed(1)
    nb, bs, hkv, d, t = 4, 4, 2, 16, 6
    key, value = torch.randn(t, hkv, d, generator=g), torch.randn(t, hkv, d, generator=g) * 9
    scales = Fp8Scales(k=0.25, v=2.0)
    backend = Fp8KVBackend(get_backend("torch"), scales)
    kc = torch.zeros(nb, bs, hkv, d, dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    slots = torch.tensor([9, 10, 11, 12, 13, 14])  # blocks 2 and 3
    backend.write_kv(key, value, kc, vc, slots)
    flat_k, flat_v = kc.view(-1, hkv, d), vc.view(-1, hkv, d)
    assert torch.equal(flat_k[slots].view(torch.uint8), quantize_fp8(key, 0.25).view(torch.uint8))
    assert torch.equal(flat_v[slots].view(torch.uint8), quantize_fp8(value, 2.0).view(torch.uint8))
    assert not flat_k[:9].float().any()  # other slots untouched
    meta = AttentionMetadata.build([t], [15], [[0, 1, 2, 3]], slots.tolist(), bs,
                                   torch.device("cpu"))
    q = torch.randn(t, 4, d, generator=g)
    got = backend.attend(q, kc, vc, meta, d**-0.5)
    want = get_backend("torch").attend(q, dequantize_fp8(kc, 0.25, torch.float32),
                                       dequantize_fp8(vc, 2.0, torch.float32), meta, d**-0.5)
    assert torch.allclose(got, want, atol=1e-6)


def test_config_spellings_and_the_refused_e5m2() -> None:
    for name in ("fp8", "fp8_e4m3"):
        assert EngineConfig.from_kwargs(kv_cache_dtype=name).resolved_kv_cache_dtype() == "fp8"
        assert EngineConfig.from_kwargs(device="cuda", kv_cache_dtype=name).cache.kv_cache_dtype
    with pytest.raises(ValueError, match="fp8_e5m2 is not supported"):
        EngineConfig.from_kwargs(kv_cache_dtype="fp8_e5m2")
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--kv-cache-dtype", "fp8_e4m3"])
    assert engine_config_from_args(args).resolved_kv_cache_dtype() == "fp8"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp8_e5m2"])


def test_fp8_cache_is_half_of_float16_and_tracks_it(make_engine, tiny_dir) -> None:
    model = str(tiny_dir("llama", 2))
    kw = dict(model=model, num_blocks=64, block_size=16, use_native_kernels=False)
    f16 = make_engine(**kw, kv_cache_dtype="float16")
    f8 = make_engine(**kw, kv_cache_dtype="fp8")
    assert f8.runner.kv_cache.dtype == torch.float8_e4m3fn
    assert f8.runner.kv_cache.shape[-1] == f16.runner.kv_cache.shape[-1] == f8.arch.head_dim
    assert f8.runner.kv_cache.nbytes * 2 == f16.runner.kv_cache.nbytes
    ids = PROMPT * 2  # a 3-chunk prefill: close log-likelihoods, not equal
    a, b = token_nlls(f16.runner, ids, chunk=32), token_nlls(f8.runner, ids, chunk=32)
    assert 0 < (a - b).abs().mean() < 0.05, (a - b).abs().mean()
    assert _run(f8)[:4] == _run(f16)[:4]


def test_the_native_path_serves_fp8_where_it_runs(make_engine, tiny_dir) -> None:
    """The fused native CPU forward reads and writes the fp8 cache under the runner's scales
    (tests/unit/engine/native/test_fused_fp8_kv.py compares it with the torch path); without
    the kernels the torch path's fp8 backend serves it."""
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=16, kv_cache_dtype="fp8")
    runner = engine.runner
    assert runner.backend.name == "torch+fp8kv"
    assert (runner.fused is not None) == (load() is not None)
    if runner.fused is not None:
        assert runner.fused.kv_scales == runner.fp8_scales == Fp8Scales()
    assert len(_run(engine)) == GREEDY.max_tokens


def test_prefix_cache_and_batching_with_fp8(make_engine, tiny_dir) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, block_size=16,
                         kv_cache_dtype="fp8")
    alone = _run(engine)
    ids = [engine.add_request(PROMPT, GREEDY), engine.add_request(PROMPT[:20], GREEDY)]
    got: dict[str, list[int]] = {i: [] for i in ids}
    cached = {}
    while engine.has_unfinished():
        for o in engine.step():
            got[o.request_id] += o.new_token_ids
            if o.finished:
                cached[o.request_id] = o.num_cached_tokens
    assert got[ids[0]] == alone and cached[ids[0]] == 32  # 2 of 3 blocks from the fp8 cache
    assert got[ids[1]] == _run(engine, PROMPT[:20])


def test_layout_names_dtype_and_scales(make_engine, tiny_dir) -> None:
    model = str(tiny_dir("llama", 2))
    f16 = make_engine(model=model, num_blocks=8, kv_cache_dtype="float16")
    f8 = make_engine(model=model, num_blocks=8, kv_cache_dtype="fp8")
    a, b = kv_layout(f16.remote.kv_cache_spec()), kv_layout(f8.remote.kv_cache_spec())
    assert (b.kv_dtype, b.kv_scales, b.scale_bytes) == ("float8_e4m3fn", "per-tensor k=1.0 v=1.0", 0)
    assert b.block_bytes * 2 == a.block_bytes
    with pytest.raises(LayoutMismatchError, match="kv_dtype"):
        a.check_compatible(b)
    rescaled = KvLayout(**{**b.to_wire(), "kv_scales": Fp8Scales(k=0.5).layout})
    with pytest.raises(LayoutMismatchError, match="kv_scales"):
        b.check_compatible(rescaled)
    assert KvLayout.from_wire(b.to_wire()) == b
    # a float layout's digest is unchanged by the optional field (older peers still match)
    assert KvLayout.from_wire({k: v for k, v in a.to_wire().items() if k != "kv_scales"}) == a


def test_handoff_of_fp8_blocks_equals_one_engine(make_engine, tiny_dir) -> None:
    """Prefill on one engine, copy its blocks layer by layer into another's reservation (what
    the push does, staged as a CUDA cache is), decode there: one engine's tokens."""
    model = str(tiny_dir("llama", 2))
    kw = dict(model=model, num_blocks=32, block_size=16, kv_cache_dtype="fp8")
    want = _run(make_engine(**kw))
    assert handoff_token_ids(make_engine(**kw), make_engine(**kw), PROMPT, GREEDY) == want


def test_fp16_peer_refused_before_any_copy(make_engine, tiny_dir) -> None:
    model = str(tiny_dir("llama", 2))
    f8 = make_engine(model=model, num_blocks=8, kv_cache_dtype="fp8")
    f16 = make_engine(model=model, num_blocks=8, kv_cache_dtype="float16")
    before = f16.runner.kv_cache.clone()
    with pytest.raises(LayoutMismatchError):
        copy_blocks(f8, [0], f16, [0])
    assert torch.equal(f16.runner.kv_cache, before)
