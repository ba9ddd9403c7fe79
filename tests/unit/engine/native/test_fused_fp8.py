"""FP8 checkpoints on the fused native CPU forward, their linears kept in e4m3 (PackedLinear
kind 7), against the torch path over the same checkpoint dequantized at load.

The kernels use the dequantized weights bit for bit (tests/unit/engine/native/
test_fp8_kernel.py) with fp32 activations, as the torch path over the dequantized fp32 model
does: only the summation order of the matmuls and the attention differs (~1e-7 relative per
op): logits measured 4e-7 to 8e-7 apart (relative) on these tiny models, bounded here by
1e-5, and greedy tokens equal. The
checkpoints are tandem/engine/testing/fp8_checkpoint.py's: per-tensor scales, and blocks that
divide the layers or leave partial edge blocks (48 x 32, 40 x 96).

A bf16/fp16 model keeps them too: its kept linears are the same fp32 weights, the rest of
the model (embedding, norms, lm_head, biases) its 16-bit weights widened, its KV cache 16-bit.
The exact reference is then test_fused_16bit.py's: the torch path in fp32 over those very
weights (the checkpoint dequantized to fp32, everything but the kept linears' weights rounded
to the model dtype) with the K/V rounded to the 16-bit cache as written: logits within 1e-4,
greedy tokens equal. Against the torch path's own 16-bit model (the checkpoint dequantized at
load into bf16: its linears rounded too, its activations bf16) they agree to bf16 rounding.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.attention.torch_backend import TorchAttentionBackend
from tandem.engine.models.weights import load_model
from tandem.engine.native import load, unsupported_reason
from tandem.engine.native.packed_linear import KIND_FP8, PackedLinear
from tandem.engine.testing import make_tiny_checkpoint
from tandem.engine.testing.fp8_checkpoint import write_fp8
from tests.unit.engine._reference import engine_token_ids
from tests.unit.engine.native.test_fused_16bit import _forward, _ulps_at_scale, _UpcastCacheBackend

pytestmark = pytest.mark.skipif(load() is None, reason="native kernels unavailable here")

CPU = torch.device("cpu")
BLOCKS = {"tensor": None, "block48x32": (48, 32), "block40x96": (40, 96)}


@pytest.fixture(scope="module")
def fp8_dir(tmp_path_factory: pytest.TempPathFactory):
    """``fp8_dir(kind, arch, hidden)``: a tiny checkpoint written in FP8 with ``BLOCKS[kind]``."""
    made: dict[tuple[str, str, int], Path] = {}

    def get(kind: str, arch: str = "llama", hidden: int = 128) -> Path:
        if (kind, arch, hidden) not in made:
            root = tmp_path_factory.mktemp(f"fp8-{kind}-{arch}-{hidden}")
            dense = make_tiny_checkpoint(root / "dense", arch=arch, hidden_size=hidden)
            write_fp8(dense, root / "fp8", BLOCKS[kind])
            made[kind, arch, hidden] = root / "fp8"
        return made[kind, arch, hidden]

    return get


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("kind,arch", [("tensor", "llama"), ("block48x32", "llama"),
                                       ("block40x96", "qwen3"), ("tensor", "qwen2")])
def test_fused_fp8_matches_the_dequantized_torch_path(make_engine, fp8_dir, kind, arch):
    qdir = fp8_dir(kind, arch)
    engine = make_engine(model=str(qdir), num_blocks=40, block_size=4, quantization="fp8")
    runner = engine.runner
    assert runner.fused is not None
    kept = [m for m in runner.model.modules() if isinstance(m, PackedLinear)]
    assert len(kept) == 4 * runner.model.arch.num_layers  # qkv, o, gate_up, down
    assert all(m.kind == KIND_FP8 and m.q.dtype == torch.uint8 for m in kept)
    ref = load_model(qdir, torch.float32, CPU, 256, progress=False)[0]  # dequantized at load
    assert ref.dequantized_from is not None
    bs = runner.block_size
    kv_nat, kv_ref = torch.zeros_like(runner.kv_cache), torch.zeros_like(runner.kv_cache)
    g = torch.Generator().manual_seed(7)
    table = list(range(39, 39 - 18, -1))  # 18 blocks, descending ids: positions 0..71
    # a 40-row prefill chunk (tiled GEMM), a chunk of 9, three one-row decodes, a 3-row step
    steps = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (40, 9, 1, 1, 1, 3)]
    pos = 0
    for i, ids in enumerate(steps):
        positions = list(range(pos, pos + len(ids)))
        nat = runner.fused(ids, positions, [0] * len(ids), [table], kv_nat, range(len(ids)))
        want = _forward(ref, TorchAttentionBackend(), ids, positions, table, kv_ref, bs)
        assert _rel(nat, want) < 1e-5, (i, _rel(nat, want))
        assert torch.equal(nat.argmax(-1), want.argmax(-1)), i
        pos += len(ids)
    assert _rel(kv_nat, kv_ref) < 1e-5


@pytest.mark.parametrize("kind", ["tensor", "block48x32"])
def test_engine_greedy_fp8_kept_equals_dequantized_at_load(make_engine, fp8_dir, kind):
    """Whole engine runs, batched (prefill chunks and decodes fused), give the tokens of the
    torch path over the checkpoint dequantized at load; the kept model holds about a quarter
    of the dequantized linears' bytes."""
    qdir = str(fp8_dir(kind))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 40, 17)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    fp8 = make_engine(model=qdir, num_blocks=64, quantization="fp8")
    assert fp8.runner.fused is not None
    ref = make_engine(model=qdir, num_blocks=64, quantization="fp8", use_native_kernels=False)
    assert ref.runner.fused is None and ref.weights_format.endswith("(dequantized at load)")
    assert engine_token_ids(fp8, prompts, params) == engine_token_ids(ref, prompts, params)
    kept = [m for m in fp8.runner.model.modules() if isinstance(m, PackedLinear)]
    float_bytes = sum(4 * m.out_features * m.in_features for m in kept)
    kept_bytes = sum(m.weight_bytes() for m in kept)
    assert kept_bytes < 0.3 * float_bytes
    assert fp8.weight_bytes == ref.weight_bytes - float_bytes + kept_bytes


def test_a_width_not_a_multiple_of_32_stays_fp8_on_the_fused_forward(make_engine,
                                                                    tmp_path: Path) -> None:
    """intermediate_size 100: down_proj reads 100 inputs, its 40-wide scale blocks straddling
    the last whole 32. It stays e4m3 like every other linear, the fused forward serves it, and
    whole engine runs give the tokens of the torch path over the checkpoint dequantized at
    load."""
    dense = make_tiny_checkpoint(tmp_path / "dense", hidden_size=128, intermediate_size=100)
    qdir = tmp_path / "fp8"
    write_fp8(dense, qdir, (48, 40))
    fp8 = make_engine(model=str(qdir), num_blocks=64, quantization="fp8")
    runner = fp8.runner
    assert runner.fused is not None, unsupported_reason(runner.model, runner.kv_cache.dtype)
    kept = {n: m for n, m in runner.model.named_modules() if isinstance(m, PackedLinear)}
    assert len(kept) == 4 * runner.model.arch.num_layers
    assert all(m.kind == KIND_FP8 for m in kept.values())
    assert [m.in_features for n, m in kept.items() if n.endswith("down_proj")] == [100, 100]
    ref = make_engine(model=str(qdir), num_blocks=64, quantization="fp8",
                      use_native_kernels=False)
    assert ref.weights_format.endswith("(dequantized at load)")
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 40, 17)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    assert engine_token_ids(fp8, prompts, params) == engine_token_ids(ref, prompts, params)


@pytest.mark.parametrize("opts", [{"dtype": "bfloat16", "use_native_kernels": False},
                                  {"quantization": "none"}, {"use_native_kernels": False}])
def test_fp8_is_dequantized_at_load_where_it_is_not_kept(make_engine, fp8_dir, opts):
    """The torch path (fp32 or bf16) and ``--quantization none`` get float linears."""
    engine = make_engine(model=str(fp8_dir("block48x32")), num_blocks=16, **opts)
    assert engine.weights_format == "fp8-block48x32 (dequantized at load)"
    assert not any(isinstance(m, PackedLinear) for m in engine.runner.model.modules())


DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _upcast_reference(qdir: Path, kept: set[str], dtype: torch.dtype) -> torch.nn.Module:
    """The fp32 model a ``dtype`` model keeping ``kept`` in e4m3 computes: the checkpoint
    dequantized to fp32, every weight but the kept linears' rounded to ``dtype``."""
    ref = load_model(qdir, torch.float32, CPU, 256, progress=False)[0]
    assert ref.dequantized_from is not None
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.removesuffix(".weight") not in kept:
                p.copy_(p.to(dtype).float())
    return ref


@pytest.mark.parametrize("kind,arch,dtype", [("block48x32", "llama", "bfloat16"),
                                             ("tensor", "qwen2", "bfloat16"),  # qkv bias
                                             ("block40x96", "qwen3", "float16")])
def test_fused_16bit_model_keeps_fp8_and_matches_the_upcast_torch_path(make_engine, fp8_dir,
                                                                       kind, arch, dtype):
    qdir = fp8_dir(kind, arch)
    engine = make_engine(model=str(qdir), dtype=dtype, num_blocks=40, block_size=4,
                         kv_cache_dtype="auto")  # the model's own 16-bit cache
    runner = engine.runner
    assert runner.fused is not None and runner.kv_cache.dtype == DTYPES[dtype]
    kept = {n for n, m in runner.model.named_modules() if isinstance(m, PackedLinear)}
    n_kept = 4 * runner.model.arch.num_layers  # qkv, o, gate_up, down
    assert len(kept) == n_kept
    assert engine.weights_format == f"fp8-{kind} x{n_kept}"
    assert all(runner.model.get_submodule(n).kind == KIND_FP8 for n in kept)
    assert runner.model.norm.weight.dtype == DTYPES[dtype]
    upcast = _upcast_reference(qdir, kept, DTYPES[dtype])
    own = load_model(qdir, DTYPES[dtype], CPU, 256, progress=False)[0]  # dequantized to bf16
    bs, backend = runner.block_size, _UpcastCacheBackend()
    kv_nat, kv_ref, kv_own = (torch.zeros_like(runner.kv_cache) for _ in range(3))
    g = torch.Generator().manual_seed(5)
    table = list(range(39, 39 - 18, -1))
    steps = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (40, 9, 1, 1, 1, 3)]
    pos = 0
    for i, ids in enumerate(steps):
        positions = list(range(pos, pos + len(ids)))
        nat = runner.fused(ids, positions, [0] * len(ids), [table], kv_nat, range(len(ids)))
        ref = _forward(upcast, backend, ids, positions, table, kv_ref, bs)
        assert _rel(nat, ref) < 1e-4, (i, _rel(nat, ref))
        assert torch.equal(nat.argmax(-1), ref.argmax(-1)), i
        if i == 0:  # the torch path's own 16-bit model: weights and activations rounded
            mine = _forward(own, TorchAttentionBackend(), ids, positions, table, kv_own, bs)
            assert _rel(nat, mine) < 3e-2, _rel(nat, mine)
        pos += len(ids)
    assert (kv_nat != kv_ref).float().mean().item() < 1e-3
    assert _ulps_at_scale(kv_nat, kv_ref).max().item() <= 2


def test_engine_greedy_bf16_fp8_kept_equals_the_upcast_torch_path(make_engine, fp8_dir):
    """Whole engine runs of a bf16 model keeping its FP8 linears give the tokens of the torch
    path over the same weights in fp32 (test_fused_16bit.py's reference); the kept linears
    hold about half the bytes of the bf16 ones dequantized at load."""
    qdir = fp8_dir("block48x32")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 40, 17)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    fp8 = make_engine(model=str(qdir), num_blocks=64, dtype="bfloat16")
    assert fp8.runner.fused is not None
    ref = make_engine(model=str(qdir), num_blocks=64, dtype="bfloat16", use_native_kernels=False)
    assert ref.runner.fused is None and ref.weights_format.endswith("(dequantized at load)")
    kept = [m for m in fp8.runner.model.modules() if isinstance(m, PackedLinear)]
    bf16_bytes = sum(2 * m.out_features * m.in_features for m in kept)
    kept_bytes = sum(m.weight_bytes() for m in kept)
    assert kept_bytes < 0.6 * bf16_bytes
    assert fp8.weight_bytes == ref.weight_bytes - bf16_bytes + kept_bytes
    names = {n for n, m in fp8.runner.model.named_modules() if isinstance(m, PackedLinear)}
    ref.runner.model = _upcast_reference(qdir, names, torch.bfloat16)
    ref.runner.backend = _UpcastCacheBackend()
    assert engine_token_ids(fp8, prompts, params) == engine_token_ids(ref, prompts, params)


def test_a_16bit_model_the_kernels_refuse_runs_its_kept_fp8_linears_on_torch(make_engine,
                                                                             fp8_dir):
    """Hidden size 48 (not a multiple of 32), which the fused forward declines, while every
    linear is kept in e4m3 (48 inputs as 96): the runner keeps torch ops over the kept
    layers, each widening its bf16 input to fp32 for the kernel and rounding the result back
    (one bf16 rounding of the fp32 matmul over the dequantized weights)."""
    qdir = fp8_dir("block48x32", hidden=48)
    engine = make_engine(model=str(qdir), dtype="bfloat16", num_blocks=16)
    assert engine.runner.fused is None
    assert unsupported_reason(engine.runner.model) == "hidden size 48 is not a multiple of 32"
    kept = {n: m for n, m in engine.runner.model.named_modules() if isinstance(m, PackedLinear)}
    assert engine.weights_format == f"fp8-block48x32 x{len(kept)}"
    assert len(kept) == 4 * engine.runner.model.arch.num_layers  # every width kept
    ref = load_model(qdir, torch.float32, CPU, 256, progress=False)[0]  # dequantized in fp32
    g = torch.Generator().manual_seed(9)
    for name, lin in kept.items():
        for rows in (1, 9):
            x = torch.randn(rows, lin.in_features, generator=g).bfloat16()
            y = lin(x)
            assert y.dtype == torch.bfloat16
            want = torch.nn.functional.linear(x.float(), ref.get_submodule(name).weight,
                                              lin.bias)
            torch.testing.assert_close(y.float(), want, rtol=2 ** -8, atol=1e-6)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    assert len(engine_token_ids(engine, [[5, 6, 7, 8, 9, 10, 11, 12, 13]], params)[0]) == 3
