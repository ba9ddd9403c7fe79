"""The fused native CPU forward (tandem/engine/native) against the torch path on the same weights.

The reference is the torch forward with every quantized layer multiplying by its exact fp32
dequantized weight (``DEQUANT_MIN_ROWS`` forced to 0), so the only difference left is the
native path's int16 activation rounding (~2e-5 relative; none for fp32 weights): logits, the
KV it writes, and greedy tokens must agree. Runs wherever the kernels build (g++ and
AVX2/FMA/F16C).
"""

from __future__ import annotations

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.attention import AttentionMetadata
from tandem.engine.native import NativeLinear, load
from tandem.engine.quant import Int4Linear, Int8Linear
from tandem.engine.quant.kv_int8 import dequantize_heads
from tests.unit.engine._reference import engine_token_ids

pytestmark = pytest.mark.skipif(load() is None, reason="native kernels unavailable here")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("rows", [1, 3, 4, 7])
def test_linear_matches_the_dequantized_matmul(kind: str, rows: int) -> None:
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(37, 96, generator=g)  # N not a multiple of anything, K = 3 groups
    bias = torch.randn(37, generator=g)
    layer = Int4Linear.from_float(w, bias) if kind == "int4" else Int8Linear.from_float(w, bias)
    x = torch.randn(rows, 96, generator=g) * torch.logspace(-2, 1, 96)  # uneven magnitudes
    ref = x @ layer.dequantize().T + bias
    assert _rel(NativeLinear(layer)(x), ref) < 1e-4


def _torch_forward(runner, ids, positions, table, kv) -> torch.Tensor:
    bs, t = runner.block_size, len(ids)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, t], dtype=torch.int32),
        seq_lens=torch.tensor([positions[-1] + 1], dtype=torch.int32),
        block_tables=torch.tensor([table], dtype=torch.int32),
        slot_mapping=torch.tensor([table[p // bs] * bs + p % bs for p in positions]),
        query_lens_cpu=[t], seq_lens_cpu=[positions[-1] + 1], num_decodes=int(t == 1),
        block_size=bs,
    )
    with torch.inference_mode():
        hidden = runner.model(torch.tensor(ids), torch.tensor(positions), kv, meta,
                              runner.backend)
        return runner.model.compute_logits(hidden)


@pytest.mark.parametrize("arch,quant,kv_dtype", [
    ("llama", "none", "auto"),   # fp32 weights read in place, fp32 activations
    ("llama", "int4", "auto"),   # GQA 4:2
    ("qwen2", "int4", "auto"),   # qkv bias
    ("qwen3", "int8", "auto"),   # q/k norm, head_dim 32 decoupled from hidden / heads
    ("llama", "int4", "int8"),   # int8 KV: per-head-vector scales in the slot's last 4 bytes
    ("qwen3", "none", "int8"),
])
def test_fused_forward_matches_torch(make_engine, tiny_dir, exact_torch_path, arch, quant,
                                     kv_dtype):
    engine = make_engine(model=str(tiny_dir(arch)), dtype="float32", quantization=quant,
                         num_blocks=32, block_size=4, kv_cache_dtype=kv_dtype)
    runner = engine.runner
    assert runner.fused is not None
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, 256, (11,), generator=g).tolist()
    table = [9, 2, 30, 5, 17]  # scattered blocks, positions 0..19
    kv_ref, kv_nat = torch.zeros_like(runner.kv_cache), torch.zeros_like(runner.kv_cache)
    ref = _torch_forward(runner, prompt, list(range(11)), table, kv_ref)
    nat = runner.fused(prompt, range(11), [0] * 11, [table], kv_nat, range(11))
    assert _rel(nat, ref) < 1e-3
    # three steps of one row, then one of three rows (a speculative verification)
    steps = [[40], [41], [42], [43, 44, 45]]
    pos = 11
    for ids in steps:
        positions = list(range(pos, pos + len(ids)))
        ref = _torch_forward(runner, ids, positions, table, kv_ref)
        nat = runner.fused(ids, positions, [0] * len(ids), [table], kv_nat, range(len(ids)))
        assert _rel(nat, ref) < 1e-3, (ids, _rel(nat, ref))
        assert torch.equal(nat.argmax(-1), ref.argmax(-1))
        pos += len(ids)
    if kv_dtype == "int8":  # the same rounding of nearly equal K/V: codes equal or off by one
        hd = runner.kv_cache.shape[-1] - 4
        diff = (kv_nat[..., :hd].int() - kv_ref[..., :hd].int()).abs()
        assert diff.max().item() <= 1 and diff.float().mean().item() < 1e-3
        kv_ref, kv_nat = (dequantize_heads(kv, torch.float32) for kv in (kv_ref, kv_nat))
    used = kv_ref.flatten(3).abs().sum(-1) > 0  # [L, 2, blocks, bs]: slots that were written
    assert torch.equal(used, kv_nat.flatten(3).abs().sum(-1) > 0)
    assert _rel(kv_nat, kv_ref) < 1e-3


def test_batched_sequences_match_each_alone(make_engine, tiny_dir) -> None:
    """Two sequences in one call (a decode row and a 3-row segment) equal separate calls.

    The 3-row segment alone runs the same few-row loops as the 4-row call, so its rows match
    to rounding; the decode row alone is a one-row step (dot_rows.h ``dot_1row``: four
    weight rows at a time, another fp32 summation order), so it matches to that order's
    rounding (~2e-5 relative here).
    """
    engine = make_engine(model=str(tiny_dir("llama")), dtype="float32", quantization="int4",
                         num_blocks=32, block_size=4)
    fused, kv = engine.runner.fused, engine.runner.kv_cache
    ta, tb = [3, 4, 5], [10, 11, 12, 13]
    fused(list(range(20, 30)), range(10), [0] * 10, [ta], kv, [9])
    fused(list(range(50, 62)), range(12), [0] * 12, [tb], kv, [11])
    snapshot = kv.clone()
    both = fused([7, 8, 9, 10], [10, 12, 13, 14], [0, 1, 1, 1], [ta, tb], kv, [0, 1, 2, 3])
    kv.copy_(snapshot)
    alone_a = fused([7], [10], [0], [ta], kv, [0])
    alone_b = fused([8, 9, 10], [12, 13, 14], [0, 0, 0], [tb], kv, [0, 1, 2])
    assert _rel(both[1:], alone_b) < 1e-5
    assert _rel(both[:1], alone_a) < 1e-4


def test_out_of_range_steps_are_refused(make_engine, tiny_dir) -> None:
    engine = make_engine(model=str(tiny_dir("llama")), dtype="float32", quantization="int4",
                         num_blocks=8, block_size=4)
    fused, kv = engine.runner.fused, engine.runner.kv_cache
    before = kv.clone()
    with pytest.raises(ValueError, match="out of range"):
        fused([5], [9], [0], [[1, 2]], kv, [0])  # position 9 needs a third block
    with pytest.raises(ValueError, match="out of range"):
        fused([5], [0], [0], [[99]], kv, [0])  # block id outside the cache
    with pytest.raises(ValueError, match="out of range"):
        fused([10_000], [0], [0], [[1]], kv, [0])  # token id outside the vocabulary
    with pytest.raises(ValueError, match="out of range"):  # a short table padded beside a long one
        fused([5, 6], [0, 5], [0, 1], [[1, 2, 3], [4]], kv, [0, 1])
    with pytest.raises(ValueError, match="out of range"):
        fused([5], [0], [1], [[1]], kv, [0])  # sequence index without a table
    with pytest.raises(ValueError, match="out of range"):
        fused([5], [0], [0], [[1]], kv, [1])  # sample row beyond the rows
    with pytest.raises(ValueError, match="does not fit the model"):  # int8 codes, no scales
        fused([5], [0], [0], [[1]], torch.zeros(kv.shape, dtype=torch.int8), [0])
    with pytest.raises(ValueError, match="does not fit the model"):  # another model's layers
        fused([5], [0], [0], [[1]], kv[:1].contiguous(), [0])
    assert torch.equal(kv, before)


@pytest.mark.parametrize("quant,kv_dtype", [("none", "auto"), ("int4", "auto"), ("int4", "int8")])
def test_engine_greedy_native_equals_exact_torch(make_engine, tiny_dir, exact_torch_path, quant,
                                                 kv_dtype):
    """Whole engine runs (prefill through torch, decodes fused) give the same greedy tokens
    as the same engine with the native path off, batched."""
    path = str(tiny_dir("llama"))
    outs = []
    for native in (True, False):
        engine = make_engine(model=path, dtype="float32", quantization=quant, num_blocks=64,
                             use_native_kernels=native, kv_cache_dtype=kv_dtype)
        assert (engine.runner.fused is not None) == native
        g = torch.Generator().manual_seed(3)
        prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 40, 17)]
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        outs.append(engine_token_ids(engine, prompts, params))  # make_engine checks the blocks
    assert outs[0] == outs[1]


def test_q4_1_blocks_use_fp16_scales_exactly() -> None:
    """GGUF Q4_1 blocks (fp16 d and m) take the fp16-scale kernel, bit-exact scales."""
    g = torch.Generator().manual_seed(5)
    n, k = 12, 64
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half()
    m = (torch.randn(n, k // 32, generator=g) * 0.05).half()
    nibbles = torch.randint(0, 256, (n, k // 32, 16), generator=g, dtype=torch.uint8)
    blocks = torch.cat([d.view(torch.uint8).view(n, -1, 2), m.view(torch.uint8).view(n, -1, 2),
                        nibbles], dim=-1).view(n, -1)
    layer = Int4Linear.from_q4_1(blocks.numpy())
    native = NativeLinear(layer)
    assert native.kind == 2
    x = torch.randn(3, k, generator=g)
    assert _rel(native(x), x @ layer.dequantize().T) < 1e-4
    assert NativeLinear(Int4Linear.from_float(torch.randn(n, k, generator=g) * 1e-6)).kind == 0


def test_long_prefill_chunk_matches_torch_and_calls_the_layer_hook(make_engine, tiny_dir,
                                                                  exact_torch_path) -> None:
    """A 70-row chunk (tiled GEMM, several attention segments of 32 rows, two row blocks)
    equals the torch forward; the hook sees every layer in order, each one's K/V already
    written."""
    engine = make_engine(model=str(tiny_dir("llama")), dtype="float32", quantization="int4",
                         num_blocks=40, block_size=4)
    runner = engine.runner
    g = torch.Generator().manual_seed(7)
    prompt = torch.randint(3, 256, (70,), generator=g).tolist()
    table = list(range(39, 39 - 18, -1))  # 18 blocks, descending ids
    kv_ref, kv_nat = torch.zeros_like(runner.kv_cache), torch.zeros_like(runner.kv_cache)
    ref = _torch_forward(runner, prompt, list(range(70)), table, kv_ref)
    seen: list[tuple[int, bool]] = []

    def hook(layer: int) -> None:
        seen.append((layer, bool(kv_nat[layer, :, table[17]].abs().sum() > 0)))

    nat = runner.fused(prompt, range(70), [0] * 70, [table], kv_nat, range(70), layer_hook=hook)
    assert _rel(nat, ref) < 1e-4
    assert _rel(kv_nat, kv_ref) < 1e-4
    layers = runner.kv_cache.shape[0]
    assert seen == [(i, True) for i in range(layers)]


def test_layer_hook_exception_ends_the_step(make_engine, tiny_dir) -> None:
    engine = make_engine(model=str(tiny_dir("llama")), dtype="float32", num_blocks=8,
                         block_size=4)
    calls: list[int] = []

    def hook(layer: int) -> None:
        calls.append(layer)
        raise ConnectionError("peer went away")

    with pytest.raises(ConnectionError, match="peer went away"):
        engine.runner.fused([5, 6], [0, 1], [0, 0], [[1]], engine.runner.kv_cache, [1],
                            layer_hook=hook)
    assert calls == [0]  # the forward stopped at the first layer
