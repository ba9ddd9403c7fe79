"""The int8 KV cache on tiny models: close to the float cache, half the bytes, blocks freed,
prefix caching and the block handoff (the disaggregated path) carry int8 + scales."""

from __future__ import annotations

import pytest
import torch

from bench.quality.perplexity import token_nlls
from tandem.engine import SamplingParams
from tandem.engine.quant.kv_int8 import dequantize_heads, quantize_heads
from tandem.worker.convert import kv_layout
from tests.unit.engine._handoff import copy_blocks

PROMPT = [3 + (i * 37) % 250 for i in range(45)]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _run(engine, prompt=PROMPT, params=GREEDY) -> list[int]:
    rid = engine.add_request(prompt, params)
    out: list[int] = []
    while engine.has_unfinished():
        out += [t for o in engine.step() if o.request_id == rid for t in o.new_token_ids]
    return out


def _all_free(engine) -> None:
    st = engine.stats()
    assert st.num_free_blocks == st.num_blocks and st.num_running == st.num_waiting == 0


def test_quantize_round_trip_is_within_half_a_step() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 3, 64, generator=g) * torch.logspace(-3, 2, 7)[:, None, None]
    packed = quantize_heads(x)
    assert packed.dtype == torch.int8 and packed.shape == (7, 3, 68)
    back = dequantize_heads(packed, torch.float32)
    step = x.abs().amax(-1, keepdim=True) / 127
    assert ((back - x).abs() <= step * (0.5 + 1e-4)).all()  # + fp32 rounding of x / step
    zeros = dequantize_heads(quantize_heads(torch.zeros(2, 64)), torch.float32)
    assert not zeros.isnan().any() and not zeros.any()


@pytest.mark.parametrize("arch,kv_heads", [("llama", 2), ("qwen2", 1)])
def test_int8_kv_tracks_the_float_cache(make_engine, tiny_dir, arch: str, kv_heads: int) -> None:
    model = str(tiny_dir(arch, kv_heads))
    ref = make_engine(model=model, num_blocks=64, block_size=16)
    q8 = make_engine(model=model, num_blocks=64, block_size=16, kv_cache_dtype="int8")
    hd = ref.arch.head_dim
    assert q8.runner.kv_cache.dtype == torch.int8 and q8.runner.kv_cache.shape[-1] == hd + 4
    per_token = {e: e.runner.kv_cache[:, :, 0, 0].numel() * e.runner.kv_cache.element_size() for e in (ref, q8)}
    assert per_token[q8] / per_token[ref] == (hd + 4) / (4 * hd)  # fp32 -> int8 + scale
    # Token by token log-likelihoods over a 3-chunk prefill: close, not equal.
    ids = PROMPT * 2
    a, b = token_nlls(ref.runner, ids, chunk=32), token_nlls(q8.runner, ids, chunk=32)
    assert 0 < (a - b).abs().mean() < 0.02, (a - b).abs().mean()
    got, want = _run(q8), _run(ref)
    assert got[:4] == want[:4]
    _all_free(q8)


def test_layout_names_the_kv_dtype(make_engine, tiny_dir) -> None:
    model = str(tiny_dir("llama", 2))
    ref = make_engine(model=model, num_blocks=8)
    q8 = make_engine(model=model, num_blocks=8, kv_cache_dtype="int8")
    assert ref.remote.kv_cache_spec().kv_dtype == "float32" and q8.remote.kv_cache_spec().kv_dtype == "int8"
    assert q8.remote.kv_cache_spec().scale_bytes == 4 and ref.remote.kv_cache_spec().scale_bytes == 0
    assert kv_layout(ref.remote.kv_cache_spec()).fingerprint != kv_layout(q8.remote.kv_cache_spec()).fingerprint


def test_prefix_cache_and_batching_with_int8(make_engine, tiny_dir) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, block_size=16,
                         kv_cache_dtype="int8")
    alone = _run(engine)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ids = [engine.add_request(PROMPT, params), engine.add_request(PROMPT[:20], params),
           engine.add_request(PROMPT + [7, 8, 9], params)]
    got: dict[str, list[int]] = {i: [] for i in ids}
    cached = {}
    while engine.has_unfinished():
        for o in engine.step():
            got[o.request_id] += o.new_token_ids
            if o.finished:
                cached[o.request_id] = o.num_cached_tokens
    assert got[ids[0]] == alone  # 32 of 45 prompt tokens came from the (int8) prefix cache
    assert cached[ids[0]] == 32
    assert got[ids[1]] == _run(engine, PROMPT[:20])
    _all_free(engine)


def test_handoff_ships_int8_blocks_with_their_scales(make_engine, tiny_dir) -> None:
    """Prefill on one engine, copy its blocks into another (what the transfer layer does),
    continue there: the same tokens as one engine, at half a float16 block's bytes."""
    model = str(tiny_dir("llama", 2))
    one = make_engine(model=model, num_blocks=32, block_size=16, kv_cache_dtype="int8")
    want = _run(one)
    pre = make_engine(model=model, num_blocks=32, block_size=16, kv_cache_dtype="int8")
    dec = make_engine(model=model, num_blocks=32, block_size=16, kv_cache_dtype="int8")
    rid = pre.remote.prefill.add(PROMPT, SamplingParams(temperature=0.0, max_tokens=1))
    first = [t for o in pre.step() for t in o.new_token_ids]
    while pre.has_unfinished():
        first += [t for o in pre.step() for t in o.new_token_ids]
    assert pre.runner.kv_cache.dtype == torch.int8 and pre.runner.kv_cache.shape[-1] == pre.arch.head_dim + 4
    dst = dec.remote.decode.reserve("r", PROMPT, GREEDY).fill_block_ids
    copy_blocks(pre, pre.remote.prefill.held_block_ids(rid), dec, dst)
    pre.remote.prefill.release(rid)
    out = dec.remote.decode.commit("r", first[0])
    got = list(out.new_token_ids)
    while dec.has_unfinished():
        got += [t for o in dec.step() for t in o.new_token_ids]
    assert got == want
    for e in (one, pre, dec):
        _all_free(e)
