"""Sliding-window models against transformers, fp32, greedy, token for token.

Mistral with a window shorter than the prompts (every layer slides: the engine frees the
blocks behind the window as requests run), and Qwen2 with ``use_sliding_window`` on its upper
layers only (full and sliding layers alternate: nothing is freed). Both on the torch path and
the native fused forward, colocated and through a P/D handoff (Mistral's ships only the
blocks inside the window). The checkpoints' every
parameter is non-trivial (tests/unit/engine/_perturbed.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tandem.engine import SamplingParams
from tests.unit.engine._handoff import copy_blocks
from tests.unit.engine._perturbed import perturbed_checkpoint
from tests.unit.engine._reference import engine_token_ids, hf_greedy

WINDOW = 12
BLOCK = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
PATHS = {"torch": {"use_native_kernels": False}, "native": {}}


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return perturbed_checkpoint(tmp_path_factory.mktemp("mistral-swa"), "mistral",
                                sliding_window=WINDOW)


@pytest.fixture(scope="module")
def mistral_full(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same weights without a window: the reference a window must differ from."""
    return perturbed_checkpoint(tmp_path_factory.mktemp("mistral-full"), "mistral",
                                sliding_window=None)


@pytest.fixture(scope="module")
def qwen2_mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Layer 0 full, layers 1 and 2 sliding (``max_window_layers`` = 1)."""
    return perturbed_checkpoint(tmp_path_factory.mktemp("qwen2-swa"), "qwen2",
                                use_sliding_window=True, sliding_window=WINDOW,
                                max_window_layers=1)


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 256, (n,), generator=g).tolist() for n in lengths]


def _engine(make_engine, path: Path, kind: str, **kw):
    engine = make_engine(model=str(path), block_size=BLOCK, **{"num_blocks": 128, **kw},
                         **PATHS[kind])
    assert (engine.runner.fused is not None) == (kind == "native")
    return engine


def _run_watching_blocks(engine, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    """Every request's tokens, and the most blocks any one request held after a step."""
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    got: dict[str, list[int]] = {}
    most = 0
    for _ in range(2000):  # a generous bound on "does not hang"
        if not engine.has_unfinished():
            break
        for out in engine.step():
            if out.finished:
                got[out.request_id] = out.token_ids
        most = max([most, *(engine.kv.num_held_blocks(i) for i in ids if i not in got)])
        assert engine.stats().num_stranded_blocks == 0
    assert not engine.has_unfinished()
    return [got[i] for i in ids], most


def test_the_window_changes_the_reference(mistral: Path, mistral_full: Path) -> None:
    """Past the window transformers' output differs from full attention on the same weights,
    so the equalities below can fail."""
    prompt = _prompts([40], seed=1)[0]
    assert hf_greedy(mistral, prompt, 24) != hf_greedy(mistral_full, prompt, 24)


@pytest.mark.parametrize("kind", list(PATHS))
@pytest.mark.parametrize("budget", [None, 8], ids=["whole", "chunked"])
def test_mistral_window_shorter_than_the_prompt(make_engine, mistral: Path, kind: str,
                                                budget: int | None) -> None:
    """Prompts of 5 to 70 tokens, window 12, blocks of 4: equal to transformers, the context
    not capped at the window, and no request holding more than its window's blocks (+ one
    partly written, + a chunk's) once it runs."""
    extra = {} if budget is None else {"max_num_batched_tokens": budget}
    engine = _engine(make_engine, mistral, kind, **extra)
    assert engine.max_model_len == 1024  # attends through the window, not capped to it
    assert engine.kv.sliding_window == WINDOW
    prompts = _prompts([5, 17, 40, 70], seed=1)
    got, most = _run_watching_blocks(engine, prompts)
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == hf_greedy(mistral, prompt, GREEDY.max_tokens)
    if budget is not None:  # a step never holds more than its window and its chunk
        assert most <= -(-(WINDOW + budget) // BLOCK) + 1
    else:
        assert most < -(-94 // BLOCK)  # the longest request's 94 positions were never all held


def test_mistral_prefix_hits_on_freed_blocks(make_engine, mistral: Path) -> None:
    """A second prompt sharing a first one's freed-but-cached prefix reuses it exactly."""
    engine = _engine(make_engine, mistral, "native")
    shared = _prompts([48], seed=2)[0]
    first = engine_token_ids(engine, [shared + [5, 6]], GREEDY)[0]
    hits_before = engine.stats().prefix_cache_hits
    second = engine_token_ids(engine, [shared + [9, 10, 11]], GREEDY)[0]
    assert engine.stats().prefix_cache_hits - hits_before == 48
    assert first == hf_greedy(mistral, shared + [5, 6], GREEDY.max_tokens)
    assert second == hf_greedy(mistral, shared + [9, 10, 11], GREEDY.max_tokens)


def test_mistral_through_a_pool_smaller_than_one_sequence(make_engine, mistral: Path) -> None:
    """16 blocks (64 positions) serve a 40-token prompt growing to 88: only freeing behind
    the window makes room."""
    engine = _engine(make_engine, mistral, "native", num_blocks=16)
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    prompt = _prompts([40], seed=3)[0]
    assert engine_token_ids(engine, [prompt], params)[0] == hf_greedy(mistral, prompt, 48)
    assert engine.stats().num_preemptions == 0


@pytest.mark.parametrize("kind", list(PATHS))
def test_qwen2_full_and_sliding_layers(make_engine, qwen2_mixed: Path, kind: str) -> None:
    engine = _engine(make_engine, qwen2_mixed, kind)
    assert engine.kv.sliding_window is None  # a full layer reads every block: none is freed
    assert [layer.self_attn.window for layer in engine.runner.model.layers] == [None, 12, 12]
    prompts = _prompts([9, 30, 61], seed=4)
    got = engine_token_ids(engine, prompts, GREEDY)
    for prompt, tokens in zip(prompts, got, strict=True):
        assert tokens == hf_greedy(qwen2_mixed, prompt, GREEDY.max_tokens)


@pytest.mark.parametrize("kind", list(PATHS))
@pytest.mark.parametrize("budget", [None, 8], ids=["whole", "chunked"])
def test_mistral_handoff_equals_colocated(make_engine, mistral: Path, kind: str,
                                          budget: int | None) -> None:
    """Prefill on P (a chunked prefill frees behind its window as it goes, keeping what the
    push reads); D reserves only the blocks its first decoded token's window reads, and only
    those are shipped; decode on D, which frees the blocks behind the window as it goes.
    Every block is back in both pools at the end."""
    extra = {} if budget is None else {"max_num_batched_tokens": budget}
    prefill = _engine(make_engine, mistral, kind, num_blocks=64, **extra)
    decode = _engine(make_engine, mistral, kind, num_blocks=64)
    prompt = _prompts([45], seed=6)[0]
    expected = hf_greedy(mistral, prompt, GREEDY.max_tokens)

    # as the router does: D reserves first, P is told what the push skips
    granted = decode.remote.decode.reserve("r1", prompt, GREEDY)
    # the first decoded token (position 45) reads keys 34 .. 45: blocks 8 .. 11 of the prompt
    assert granted.skip_tokens == (45 - WINDOW + 1) // BLOCK * BLOCK == 32
    assert granted.cached_tokens == 0
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    rid = prefill.remote.prefill.add(prompt, one, request_id="r1",
                                     push_skip_tokens=granted.skip_tokens)
    first = None
    while prefill.has_unfinished():
        for out in prefill.step():
            first = out.token_ids[0]
    src = prefill.remote.prefill.held_block_ids(rid)
    assert len(src) == -(-45 // BLOCK) and -1 not in src[8:]  # what the push reads is held
    if budget is not None:  # the last chunk (from 40) no longer read blocks 0 .. 6
        assert src[:7] == [-1] * 7

    dst = granted.fill_block_ids
    assert len(dst) == len(src) - 8 and decode.kv.num_held_blocks("r1") == len(dst)
    assert decode.kv.block_ids("r1")[:8] == [-1] * 8  # never held, never pushed
    copy_blocks(prefill, src[8:], decode, dst, layer_by_layer=True)  # as the transfer would
    prefill.remote.prefill.release(rid)
    tokens = list(decode.remote.decode.commit("r1", first).new_token_ids)
    held = []
    while decode.has_unfinished():
        for out in decode.step():
            tokens += out.new_token_ids
        if decode.kv.holds("r1"):
            held.append(decode.kv.num_held_blocks("r1"))
    assert tokens == expected
    assert held and max(held) <= -(-WINDOW // BLOCK) + 1
    for engine in (prefill, decode):
        assert engine.kv.pool.num_free == engine.kv.pool.num_blocks


def test_a_window_reservation_reuses_cached_blocks_inside_the_window(make_engine,
                                                                     mistral: Path) -> None:
    """D already caches a prompt's prefix reaching into the window: the reservation takes the
    hits inside the window, skips them and everything before, and the push fills the rest."""
    decode = _engine(make_engine, mistral, "torch", num_blocks=64)
    shared = _prompts([40], seed=7)[0]
    engine_token_ids(decode, [shared + [4]], SamplingParams(temperature=0.0, max_tokens=1))
    prompt = shared + [9, 9, 9]  # 43 tokens: the window of position 43 starts at key 32
    granted = decode.remote.decode.reserve("r2", prompt, GREEDY)
    assert granted.cached_tokens == 40 and granted.skip_tokens == 40
    assert decode.kv.block_ids("r2")[:8] == [-1] * 8  # hits behind the window are not taken
    assert decode.kv.num_held_blocks("r2") == 3 and len(granted.fill_block_ids) == 1
    decode.remote.decode.end("r2")
    assert decode.kv.pool.num_free == decode.kv.pool.num_blocks
