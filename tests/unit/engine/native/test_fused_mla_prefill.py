"""MLA prefill chunks on the fused native CPU forward: a chunk long enough for it attends over
its context decompressed through kv_b_proj (mla_decompress.h), the rest in latent space
(mla_attention.h's absorbed form), and either way the logits and the latent cache are the torch
path's.

The steps cover both choices (``NativeMla.decompresses`` is asserted for each chunk, so a change
of the rule shows here): a fresh chunk above the threshold, one below it, a chunk after a
prefix-cache hit (its first blocks are another sequence's, written earlier) batched with a
decode of that other sequence, a later chunk of a chunked prompt on each side of the rule,
then decodes. fp32 against the torch path: summation order, 1e-5 relative (as
test_fused_deepseek.py); bf16 and fp16 against the torch path over the same weights upcast, the
latent rows rounded to the model's 16-bit cache as written (test_fused_16bit.py's reference):
1e-4, and the cache's codes equal but for a few an ulp or two apart.
"""

from __future__ import annotations

import copy
import ctypes
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.native import NativeLinear, load
from tandem.engine.native.mla_layer import MlaLayerStruct, NativeMla
from tandem.engine.native.packed_linear import KIND_BF16, KIND_F16, KIND_F32, KIND_FP8
from tests.unit.engine._reference import engine_token_ids, hf_greedy
from tests.unit.engine.native._torch_steps import rel_err, torch_logits
from tests.unit.engine.native.test_fused_16bit import _ulps_at_scale, _UpcastCacheBackend

pytestmark = pytest.mark.skipif(load() is None, reason="native kernels unavailable here")

BLOCK = 4
# test_fused_deepseek.py's tiny shapes (the same checkpoints): layer 0 dense, 1-2 MoE
NATIVE_MLA = {"num_layers": 3, "first_k_dense_replace": 1, "v_head_dim": 24}
CASES = {"v2": ("deepseek_v2", NATIVE_MLA),
         "v3": ("deepseek_v3", {**NATIVE_MLA, "q_lora_rank": 96})}
GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)

# Sequence A: blocks 1..20; B: A's first two blocks (an 8-token prefix hit), then its own.
PREFIX = 2 * BLOCK
TABLES = [list(range(1, 21)), [1, 2, *range(30, 70)]]
# Each step: (A's rows, B's rows) as (first position, count) or None, and whether each of its
# chunks decompresses (None for a decode row).
STEPS = [
    ((0, 40), None, (True, None)),          # A: a fresh 40-row chunk
    ((40, 8), None, (False, None)),         # A: 8 rows after 40: latent by the count of products
    ((48, 1), (PREFIX, 48), (None, True)),  # A decodes; B: 48 rows after its 8-token prefix hit
    ((49, 5), (56, 8), (False, False)),     # A: 5 rows, below the threshold; B: 8 after 56
    (None, (64, 64), (None, True)),         # B: a later chunk of its chunked prompt
    ((54, 1), (128, 1), (None, None)),      # both decode
]


@pytest.fixture(scope="module")
def mla_dir(family_dir: Callable[..., Path]) -> Callable[[str], Path]:
    def get(case: str) -> Path:
        arch, options = CASES[case]
        return family_dir(arch, **options)

    return get


def _rows(span: tuple[int, int] | None, seq: int, g: torch.Generator,
          ) -> tuple[list[int], list[int], list[int]]:
    if span is None:
        return [], [], []
    first, n = span
    return (torch.randint(3, 256, (n,), generator=g).tolist(), list(range(first, first + n)),
            [seq] * n)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("case", list(CASES))
def test_prefill_chunks_match_torch(make_engine, mla_dir, case: str, dtype: str) -> None:
    engine = make_engine(model=str(mla_dir(case)), dtype=dtype, num_blocks=80, block_size=BLOCK,
                         kv_cache_dtype="auto")
    runner = engine.runner
    assert runner.fused is not None
    assert runner.kv_cache.dtype == getattr(torch, dtype)  # the latent cache in the model dtype
    model = runner.model
    native = NativeMla(model.layers[0].self_attn, model.arch.mla, NativeLinear)
    fp32 = dtype == "float32"
    # the reference: the torch path itself (fp32), or over the upcast weights and a bf16 cache
    ref_model, backend = ((model, runner.backend) if fp32
                          else (copy.deepcopy(model).float(), _UpcastCacheBackend()))
    kv_nat, kv_ref = torch.zeros_like(runner.kv_cache), torch.zeros_like(runner.kv_cache)
    g = torch.Generator().manual_seed(7)
    tol = 1e-5 if fp32 else 1e-4
    for i, (a, b, expected) in enumerate(STEPS):
        for span, decompressed in zip((a, b), expected, strict=True):
            if decompressed is not None:
                assert native.decompresses(span[1], span[0]) == decompressed, (i, span)
        ids, pos, seq = (x + y for x, y in zip(_rows(a, 0, g), _rows(b, 1, g), strict=True))
        # 8 threads on odd steps: fewer heads than threads, each head's GEMMs on every thread
        nat = runner.fused(ids, pos, seq, TABLES, kv_nat, range(len(ids)),
                           threads=8 if i % 2 else 1)
        ref = torch_logits(runner, ids, pos, seq, TABLES, kv_ref, ref_model, backend)
        assert rel_err(nat, ref) < tol, (case, dtype, i, rel_err(nat, ref))
        assert torch.equal(nat.argmax(-1), ref.argmax(-1)), (case, dtype, i)
    if fp32:
        assert rel_err(kv_nat, kv_ref) < tol
    else:  # the same rounding of nearly equal latent rows
        written = kv_ref != 0
        mismatched = ((kv_nat != kv_ref) & written).sum() / written.sum()
        assert mismatched.item() < 1e-2
        assert _ulps_at_scale(kv_nat, kv_ref).max().item() <= 2


@pytest.mark.parametrize("threads", [1, 8])
def test_chunks_over_one_query_pass_match_torch(make_engine, mla_dir, threads: int) -> None:
    """Chunks longer than MLA_QUERY_PASS (128 rows) run in several passes over the keys, each
    writing its own rows' outputs: a fresh 150-row chunk, then 150 rows after 40 cached."""
    engine = make_engine(model=str(mla_dir("v2")), num_blocks=120, block_size=BLOCK)
    runner = engine.runner
    native = NativeMla(runner.model.layers[0].self_attn, runner.model.arch.mla, NativeLinear)
    tables = [list(range(1, 41)), list(range(41, 101))]
    kv_nat, kv_ref = torch.zeros_like(runner.kv_cache), torch.zeros_like(runner.kv_cache)
    g = torch.Generator().manual_seed(9)
    for seq, first, n in ((0, 0, 150), (1, 0, 40), (1, 40, 150)):  # B: 40, then 150 after
        assert native.decompresses(n, first)  # 150 rows: two passes of the keys
        ids = torch.randint(3, 256, (n,), generator=g).tolist()
        pos = list(range(first, first + n))
        table = [tables[seq]]
        nat = runner.fused(ids, pos, [0] * n, table, kv_nat, range(n), threads=threads)
        ref = torch_logits(runner, ids, pos, [0] * n, table, kv_ref, runner.model,
                           runner.backend)
        assert rel_err(nat, ref) < 1e-5, (seq, first, n, rel_err(nat, ref))


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_through_decompressed_chunks_equals_transformers(make_engine, mla_dir,
                                                                 case: str) -> None:
    """Chunks of up to 48 rows (decompressed and latent ones) and a prefix-cache hit followed
    by a long tail (its first chunk decompressed over the cached blocks): transformers'
    tokens."""
    path = mla_dir(case)
    engine = make_engine(model=str(path), num_blocks=160, block_size=BLOCK,
                         max_num_batched_tokens=48)
    assert engine.runner.fused is not None
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (20, 70, 110)]
    for prompt, tokens in zip(prompts, engine_token_ids(engine, prompts, GREEDY), strict=True):
        assert tokens == hf_greedy(path, prompt, GREEDY.max_tokens), (case, len(prompt))
    shared, tail = prompts[1][:24], torch.randint(3, 256, (60,), generator=g).tolist()
    model = engine.runner.model
    # the tail's first chunk: 48 rows from position 24
    assert NativeMla(model.layers[0].self_attn, model.arch.mla, NativeLinear).decompresses(48, 24)
    hits = engine.stats().prefix_cache_hits
    tokens = engine_token_ids(engine, [shared + tail], GREEDY)[0]
    assert engine.stats().prefix_cache_hits - hits == 24
    assert tokens == hf_greedy(path, shared + tail, GREEDY.max_tokens)


@pytest.mark.parametrize("case", list(CASES))
def test_bf16_greedy_equals_the_upcast_torch_path(make_engine, mla_dir, case: str) -> None:
    """A bf16 model, whole prompts (decompressed and latent chunks batched) and chunked ones:
    the tokens of the torch path over the same weights upcast and the same bf16 cache."""
    path = str(mla_dir(case))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 60, 33)]
    for budget in (None, 40):
        extra = {} if budget is None else {"max_num_batched_tokens": budget}
        fused = make_engine(model=path, dtype="bfloat16", num_blocks=96, block_size=BLOCK,
                            **extra)
        assert fused.runner.fused is not None
        ref = make_engine(model=path, dtype="bfloat16", num_blocks=96, block_size=BLOCK,
                          use_native_kernels=False, **extra)
        ref.runner.model = copy.deepcopy(ref.runner.model).float()
        ref.runner.backend = _UpcastCacheBackend()
        assert engine_token_ids(fused, prompts, GREEDY) == engine_token_ids(ref, prompts, GREEDY)


def _v2_lite_layer(kv_b_kind: int = KIND_F32) -> MlaLayerStruct:
    """DeepSeek-V2-Lite's attention dims as the kernels' descriptor (no weights: the choice
    reads only the dims and kv_b's kind)."""
    m = MlaLayerStruct(0, 512, 64, 128, 128, 1, 0.1, 1e-6)
    m.kv_b.kind = kv_b_kind
    return m


@pytest.mark.parametrize(("rows", "first", "decompressed"), [
    (1, 0, False), (4, 0, False),  # decodes, short verifications: below the threshold
    (8, 0, True), (16, 0, True), (512, 0, True), (2048, 0, True),  # fresh chunks
    (128, 512, True), (128, 2048, True), (512, 1536, True),  # long chunks after a context
    (8, 64, False), (16, 512, False), (32, 2048, False),  # short chunks after a long one
    (2048, 6144, True), (2048, 6145, False), (9000, 0, False),  # past 8,192: bounded scratch
])
def test_choice_follows_the_measured_costs(rows: int, first: int, decompressed: bool) -> None:
    """At DeepSeek-V2-Lite's shape, the side of each measured case (mla_decompress.h's
    MLA_LATENT_PRODUCT_COST) that ran faster."""
    lib = load()
    got = lib.tnd_mla_decompresses(ctypes.byref(_v2_lite_layer()), rows, first)
    assert bool(got) == decompressed


def test_a_kv_b_outside_the_float_kinds_stays_latent() -> None:
    lib = load()
    for kind in (KIND_F32, KIND_BF16, KIND_F16):
        assert lib.tnd_mla_decompresses(ctypes.byref(_v2_lite_layer(kind)), 512, 0)
    assert not lib.tnd_mla_decompresses(ctypes.byref(_v2_lite_layer(KIND_FP8)), 512, 0)
