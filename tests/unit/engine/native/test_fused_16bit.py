"""bf16 and fp16 models on the fused native CPU forward (tandem/engine/native).

The kernels widen 16-bit weights to fp32 in registers and keep activations in fp32, so the
exact reference is the torch path over the same weights upcast to fp32, with the K/V rounded
to the model's 16-bit cache dtype as they are written (``_UpcastCacheBackend``): the cache agrees bit for bit (but for
the rare code that fp32 summation order moves an ulp), logits to that order and those ulps
(< 1e-4 relative), greedy tokens exactly. Against the torch path's own bf16 activations the logits
agree to bf16 rounding only (near-ties may flip there). The runner takes this path for a
bf16 model and holds its weights once, at bf16 size.
"""

from __future__ import annotations

import copy
import ctypes

import pytest
import torch
from torch import nn

import tandem.engine.models.linear as linear_mod
from tandem.engine import SamplingParams
from tandem.engine.attention import AttentionMetadata
from tandem.engine.attention.torch_backend import TorchAttentionBackend
from tandem.engine.models.linear import Linear
from tandem.engine.native import NativeLinear, load
from tandem.engine.native.packed_linear import KIND_BF16, KIND_F16
from tests.unit.engine._reference import engine_token_ids

pytestmark = pytest.mark.skipif(load() is None, reason="native kernels unavailable here")

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


class _UpcastCacheBackend(TorchAttentionBackend):
    """The torch backend over a 16-bit cache for fp32 queries: K/V are rounded to the cache's
    dtype as they are written (torch's rounding) and read back widened."""

    def attend(self, query, k_cache, v_cache, meta, scale, window=None):  # noqa: ANN001, ANN201
        return super().attend(query, k_cache.float(), v_cache.float(), meta, scale, window)


def _forward(model, backend, ids, positions, table, kv, bs) -> torch.Tensor:  # noqa: ANN001
    t = len(ids)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, t], dtype=torch.int32),
        seq_lens=torch.tensor([positions[-1] + 1], dtype=torch.int32),
        block_tables=torch.tensor([table], dtype=torch.int32),
        slot_mapping=torch.tensor([table[p // bs] * bs + p % bs for p in positions]),
        query_lens_cpu=[t], seq_lens_cpu=[positions[-1] + 1], num_decodes=int(t == 1),
        block_size=bs,
    )
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), torch.tensor(positions), kv, meta, backend)
        return model.compute_logits(hidden).float()


def _ulps_at_scale(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """How far apart two 16-bit tensors are, elementwise, in ulps of the largest magnitude of
    each head vector (last dimension): fp32 summation order moves a result by a share of its
    operands' size, so a value near zero that cancellation left (a code of 4e-5 in a vector
    reaching 2.3) may move several of its own ulps while moving a tiny share of the vector's."""
    scale = b.float().abs().amax(-1, keepdim=True).clamp_min(torch.finfo(b.dtype).tiny)
    ulp = torch.finfo(b.dtype).eps * torch.exp2(torch.floor(torch.log2(scale)))
    return (a.float() - b.float()).abs() / ulp


@pytest.mark.parametrize("arch,dtype,kv_heads,tied,kv_dtype", [
    ("llama", "bfloat16", 2, False, "auto"),  # GQA 4:2
    ("llama", "bfloat16", 4, True, "auto"),   # MHA, the embedding table shared with lm_head
    ("qwen2", "bfloat16", 2, False, "auto"),  # qkv bias (held in fp32)
    ("qwen3", "bfloat16", 2, False, "auto"),  # q/k norms, head_dim 32
    ("llama", "float16", 2, False, "auto"),
    ("llama", "bfloat16", 2, False, "int8"),  # bf16 weights over the int8 cache
    ("qwen2_moe", "bfloat16", 2, False, "auto"),  # bf16 router, experts, gated shared expert
])
def test_fused_16bit_matches_the_upcast_torch_path(make_engine, tiny_dir, arch, dtype, kv_heads,
                                                   tied, kv_dtype):
    engine = make_engine(model=str(tiny_dir(arch, kv_heads, tie_word_embeddings=tied)),
                         dtype=dtype, num_blocks=40, block_size=4, kv_cache_dtype=kv_dtype)
    runner = engine.runner
    int8_kv = kv_dtype == "int8"
    assert runner.fused is not None
    assert runner.kv_cache.dtype == (torch.int8 if int8_kv else DTYPES[dtype])
    # the int8 backend quantizes what it is given (fp32 here) and attends in the query's dtype
    backend = runner.backend if int8_kv else _UpcastCacheBackend()
    bs = runner.block_size
    upcast = copy.deepcopy(runner.model).float()  # the same numbers, in fp32
    kv_nat, kv_ref, kv_torch = (torch.zeros_like(runner.kv_cache) for _ in range(3))
    g = torch.Generator().manual_seed(11)
    table = list(range(39, 39 - 18, -1))  # 18 blocks, descending ids: positions 0..71
    # a 40-row prefill chunk (tiled GEMM, two attention segments), a second chunk of 9, three
    # single-row decodes, one 3-row step (a speculative verification)
    steps = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (40, 9, 1, 1, 1, 3)]
    pos = 0
    for i, ids in enumerate(steps):
        positions = list(range(pos, pos + len(ids)))
        nat = runner.fused(ids, positions, [0] * len(ids), [table], kv_nat, range(len(ids)))
        ref = _forward(upcast, backend, ids, positions, table, kv_ref, bs)
        # fp32 summation order, and where it tips a K/V rounding one 16-bit ulp there
        assert _rel(nat, ref) < 1e-4, (i, _rel(nat, ref))
        assert torch.equal(nat.argmax(-1), ref.argmax(-1)), i
        if i == 0:  # the torch path's own bf16/fp16 activations: the same model, rounded
            own = _forward(runner.model, runner.backend, ids, positions, table, kv_torch, bs)
            assert _rel(nat, own) < 3e-2, _rel(nat, own)
        pos += len(ids)
    written = kv_ref.flatten(4).abs().sum(-1) > 0  # [L, 2, blocks, bs]: slots written
    assert written.sum() == 2 * runner.kv_cache.shape[0] * pos  # every row's K and V, each layer
    assert torch.equal(written, kv_nat.flatten(4).abs().sum(-1) > 0)
    if int8_kv:  # the same rounding of nearly equal K/V: codes equal or off by one
        hd = runner.kv_cache.shape[-1] - 4
        diff = (kv_nat[..., :hd].int() - kv_ref[..., :hd].int()).abs()
        assert diff.max().item() <= 1 and diff.float().mean().item() < 1e-3
        return
    # the same rounding: codes equal, but for a few that summation order moved (one in an
    # earlier layer's K/V moves later layers' values a little), by at most two ulps of their
    # head vector's scale
    assert (kv_nat != kv_ref).float().mean().item() < 1e-3
    assert _ulps_at_scale(kv_nat, kv_ref).max().item() <= 2


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_engine_greedy_fused_bf16_equals_the_upcast_torch_path(make_engine, tiny_dir, kv_heads):
    """Whole engine runs, batched (prefill chunks and decodes fused), give the tokens of the
    same engine on the torch path over the upcast weights."""
    path = str(tiny_dir("llama", kv_heads))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 40, 17)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    fused = make_engine(model=path, dtype="bfloat16", num_blocks=64)
    assert fused.runner.fused is not None
    ref = make_engine(model=path, dtype="bfloat16", num_blocks=64, use_native_kernels=False)
    assert ref.runner.fused is None
    ref.runner.model = copy.deepcopy(ref.runner.model).float()
    ref.runner.backend = _UpcastCacheBackend()
    assert engine_token_ids(fused, prompts, params) == engine_token_ids(ref, prompts, params)


@pytest.fixture
def no_cpu_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a CPU without bf16 arithmetic (the 2-core dev box has AVX512-BF16): the torch
    path would give bf16 linears fp32 shadows."""
    monkeypatch.setattr(linear_mod, "cpu_has_native_bf16", lambda: False)


def test_runner_holds_bf16_weights_once(make_engine, tiny_dir, no_cpu_bf16) -> None:
    """The fused path reads the model's own bf16 tensors: no fp32 copy of a linear or the
    embedding (the torch path's fp32 shadows are not made), only the norms (and biases) in
    fp32; what the process holds for weights is the bf16 size."""
    engine = make_engine(model=str(tiny_dir("llama", 2, tie_word_embeddings=True)),
                         dtype="bfloat16", num_blocks=16)
    runner = engine.runner
    model, fused = runner.model, runner.fused
    assert fused is not None
    assert all(m.shadow_weight is None for m in model.modules() if isinstance(m, Linear))
    params = {p.data_ptr(): p for p in model.parameters()}
    assert all(p.dtype == torch.bfloat16 for p in params.values())
    bf16_bytes = sum(p.numel() * 2 for p in params.values())
    lins = [t for t in fused._keep if isinstance(t, NativeLinear)]
    assert {t.kind for t in lins} == {KIND_BF16}
    weights = [t.tensors[0] for t in lins]
    assert all(w.data_ptr() in params for w in weights)  # the model's tensors, in place
    assert model.embed_tokens.weight.data_ptr() == model.lm_head.weight.data_ptr()
    # every distinct tensor the model and the fused forward hold, the RoPE tables aside
    rope = {model.cos_table.data_ptr(), model.sin_table.data_ptr()}
    held: dict[int, int] = {}
    tensors = [*model.parameters(), *model.buffers(),
               *(t for t in fused._keep if isinstance(t, torch.Tensor)),
               *(t for lin in lins for t in lin.tensors)]
    for t in tensors:
        if t.data_ptr() not in rope:
            held[t.data_ptr()] = max(held.get(t.data_ptr(), 0), t.numel() * t.element_size())
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    assert sum(held.values()) == bf16_bytes + 4 * norms  # + the norms' fp32 copies


def test_a_bf16_model_the_kernels_refuse_runs_on_torch_with_its_shadows(make_engine, tiny_dir,
                                                                        no_cpu_bf16):
    """Hidden size 48 (not a multiple of 32): the runner keeps torch ops and gives the bf16
    linears their fp32 shadows for large steps, as a bf16 model without the native path has
    them."""
    engine = make_engine(model=str(tiny_dir("llama", hidden_size=48)), dtype="bfloat16",
                         num_blocks=16)
    assert engine.runner.fused is None
    linears = [m for m in engine.runner.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.shadow_weight is not None for m in linears)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    assert len(engine_token_ids(engine, [[5, 6, 7, 8, 9, 10, 11, 12, 13]], params)[0]) == 3


@pytest.mark.parametrize("dtype,kind", [(torch.bfloat16, KIND_BF16), (torch.float16, KIND_F16)])
def test_16bit_embedding_rows_widen_exactly(dtype: torch.dtype, kind: int) -> None:
    g = torch.Generator().manual_seed(2)
    emb = nn.Embedding(50, 96).to(dtype)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(50, 96, generator=g) * 3)
    table = NativeLinear(emb)
    assert table.kind == kind and table.tensors[0].data_ptr() == emb.weight.data_ptr()
    ids = torch.tensor([0, 49, 7, 7], dtype=torch.int64)
    out = torch.empty(4, 96)
    lib = load()
    rc = lib.tnd_embed(ctypes.byref(table.struct), ctypes.c_void_p(ids.data_ptr()), 4,
                       ctypes.c_void_p(out.data_ptr()))
    assert rc == 0
    assert torch.equal(out, emb.weight.float()[ids])
