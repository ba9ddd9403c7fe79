"""The fp8 (e4m3) KV cache on the fused native CPU forward, against the torch path's
(tandem/engine/quant/kv_fp8.py's Fp8KVBackend over the torch attention) on the same cache layout
and a checkpoint's per-layer K and V scales (each layer's cache under its own).

The write is the same function of the same floats: ``store_head<KV_FP8>`` (kv_head.h,
e4m3.h) gives quantize_fp8's bytes for every float, ties, e4m3 subnormals, saturation and NaN
included, under scales that are powers of two and scales that are not (checked on the
function itself, compiled for each ISA). The read widens each byte exactly (checked for all
256 codes) and applies the scales to the scores and the weighted V (test_paged_attention.py
checks that against a double-precision softmax over the stored values).

Through a whole forward (fp32 models, and a bf16 one against its weights upcast, whose
checkpoints carry K and V scales far from 1 and not powers of two, so a path that dropped them
on write or read would differ by far more than the bounds here: measured 1.1-1.3 relative on
the logits of a decode): the K/V both paths quantize differ only by fp32 summation order
(~1e-7 relative). The cache bytes came out identical in every case here, under both ISA
variants; the bound allows what that order may still do on another CPU's matmuls, a value
moved across an e4m3 rounding boundary (the neighbouring code, for at most 1e-3 of the
bytes). Logits: within 1e-5 (relative norm; measured <= 6.3e-7, summation order only) where
the caches agree byte for byte, 2e-4 where such a code moved (6% of one element, moving later
layers a little). Greedy tokens are equal at every step and through whole engine runs.
"""

from __future__ import annotations

import copy
import struct
import subprocess
from pathlib import Path

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.native import FusedForward, load, unsupported_reason
from tandem.engine.quant.kv_fp8 import FP8_DTYPE, Fp8Scales, quantize_fp8
from tests.unit.engine.native.header_program import compile_program, variants
from tests.unit.engine.native.test_fused_16bit import _forward
from tests.unit.engine.quant.test_kv_fp8_checkpoint_scales import _with_tensors

pytestmark = pytest.mark.skipif(load() is None, reason="native kernels unavailable here")

# A checkpoint's per-layer K and V scales (exact in float32, as a checkpoint stores them; not
# powers of two, so the division rounds), each layer's cache written and read under its own.
K_SCALES, V_SCALES = (0.037109375 * 3, 0.0703125), (0.0546875, 0.01953125 * 5)
SCALES = Fp8Scales(K_SCALES, V_SCALES)

PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "kv_head.h"

using namespace tnd;

// store <in> <scale bits> <out>: the floats of <in> stored as an fp8 head vector.
// widen <out>: each of the 256 codes widened by the scalar, 8-lane and (AVX-512) 16-lane loads.
int main(int argc, char** argv) {
  if (argc == 5 && std::strcmp(argv[1], "store") == 0) {
    FILE* f = std::fopen(argv[2], "rb");
    std::vector<float> x;
    float v;
    while (std::fread(&v, sizeof(v), 1, f) == 1) x.push_back(v);
    std::fclose(f);
    const uint32_t bits = static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10));
    float scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    std::vector<uint8_t> out(x.size());
    store_head<KV_FP8>(x.data(), static_cast<int>(x.size()), out.data(), scale);
    FILE* o = std::fopen(argv[4], "wb");
    std::fwrite(out.data(), 1, out.size(), o);
    std::fclose(o);
    return 0;
  }
  if (argc == 3 && std::strcmp(argv[1], "widen") == 0) {
    e4m3 codes[256];
    for (int c = 0; c < 256; ++c) codes[c].bits = static_cast<uint8_t>(c);
    float got[3][256];
    for (int c = 0; c < 256; ++c) got[0][c] = static_cast<float>(codes[c]);
    for (int c = 0; c < 256; c += 8) _mm256_storeu_ps(&got[1][c], load8(codes + c));
#if TND_ATTN_512
    for (int c = 0; c < 256; c += 16) _mm512_storeu_ps(&got[2][c], load16(codes + c));
#else
    std::memcpy(got[2], got[1], sizeof(got[1]));
#endif
    FILE* o = std::fopen(argv[2], "wb");
    std::fwrite(got, sizeof(got), 1, o);
    std::fclose(o);
    return 0;
  }
  return 2;
}
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    isas = variants()
    if not isas:
        pytest.skip("this CPU lacks AVX2/FMA/F16C")
    work = tmp_path_factory.mktemp("fp8_kv")
    return {isa: compile_program(work, f"fp8_kv_{isa}", PROGRAM, isa) for isa in isas}


def _edge_values() -> torch.Tensor:
    """Every e4m3 value and every midpoint between neighbours (ties), both signs; around the
    largest (448, the tie 464 and past it) and beyond (inf, NaN); fp32 subnormals; zeros."""
    finite = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).float()
    finite = finite[finite.isfinite() & (finite >= 0)].sort().values
    mids = (finite[1:] + finite[:-1]) / 2
    specials = torch.tensor([0.0, 448.0, 450.0, 463.9, 464.0, 464.1, 479.9, 480.0, 1e30,
                             float("inf"), float("nan"), 1e-40, 2.0**-10, 3 * 2.0**-10])
    pos = torch.cat([finite, mids, specials])
    return torch.cat([pos, -pos])


def _store(exe: Path, x: torch.Tensor, scale: float, work: Path) -> torch.Tensor:
    src, out = work / "x.f32", work / "q.u8"
    src.write_bytes(x.float().contiguous().numpy().tobytes())
    bits = struct.unpack("<I", struct.pack("<f", scale))[0]
    subprocess.run([str(exe), "store", str(src), str(bits), str(out)], check=True, timeout=60)
    return torch.frombuffer(bytearray(out.read_bytes()), dtype=torch.uint8)


@pytest.mark.parametrize("scale", [1.0, 0.25, 0.1, 3.7, 0.037109375 * 3])
def test_the_kernels_store_torchs_bytes(programs, tmp_path, scale: float) -> None:
    g = torch.Generator().manual_seed(5)
    n = 40_000  # magnitudes from under e4m3's subnormals (times the scale) to past 448 times it
    noise = torch.randn(n, generator=g) * torch.logspace(-5, 3.2, n) * scale
    exact = scale in (1.0, 0.25)  # the edge values land on their ties only under these
    x = torch.cat([noise, _edge_values() * scale]) if exact else noise
    want = quantize_fp8(x, scale).view(torch.uint8)
    for isa, exe in programs.items():
        got = _store(exe, x, scale, tmp_path)
        bad = (got != want).nonzero().flatten()[:5].tolist()
        assert not bad, (isa, [(x[i].item(), got[i].item(), want[i].item()) for i in bad])
    special = torch.tensor([float("nan"), float("inf"), 470.0, -float("inf"), 1e30, -0.0])
    for exe in programs.values():  # NaN stays NaN; inf and what rounds past 448 saturate
        assert _store(exe, special * scale, scale, tmp_path).tolist() == \
            [0x7F, 0x7E, 0x7E, 0xFE, 0x7E, 0x80]


def test_every_code_widens_exactly(programs, tmp_path) -> None:
    """Each byte reads as its value times 2^-8 (the kernels' scales carry the 2^8), through
    the scalar, 8-lane and 16-lane widenings; the two NaN codes read as +-480."""
    codes = torch.arange(256, dtype=torch.uint8)
    want = codes.view(FP8_DTYPE).float()
    nan = want.isnan()
    assert codes[nan].tolist() == [0x7F, 0xFF]
    want[nan] = torch.tensor([480.0, -480.0])
    for isa, exe in programs.items():
        out = tmp_path / f"widen_{isa}"
        subprocess.run([str(exe), "widen", str(out)], check=True, timeout=60)
        got = torch.frombuffer(bytearray(out.read_bytes()), dtype=torch.float32).view(3, 256)
        for way in range(3):
            assert torch.equal(got[way] * 256, want), (isa, way)
            assert torch.equal(got[way].signbit(), want.signbit()), (isa, way)  # -0 too


@pytest.fixture(scope="module")
def scaled_dir(tiny_dir, tmp_path_factory):
    """``scaled_dir(arch)``: the tiny checkpoint with per-layer ``k_scale``/``v_scale``."""
    made: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in made:
            extra = {}
            for layer, (k, v) in enumerate(zip(K_SCALES, V_SCALES, strict=True)):
                extra[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(k)
                extra[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(v)
            made[arch] = _with_tensors(tiny_dir(arch, 2), tmp_path_factory.mktemp(arch) / "kv",
                                       extra)
        return made[arch]

    return get


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _magnitude_order(codes: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes as integers ordered like their values (sign-magnitude to two's complement),
    so neighbouring values are 1 apart."""
    c = codes.int()
    return torch.where(c >= 128, -(c - 128), c)


BLOCK, TABLE = 4, list(range(39, 39 - 18, -1))  # 18 scattered blocks of 4: positions 0..71


def _steps(model, fused: FusedForward, backend, kv_nat, kv_ref) -> float:
    """A 40-row prefill chunk (tiled GEMM and attention tiles), a 9-row chunk, three decodes,
    a 3-row step (55 positions), native and torch (``model`` over ``backend``) each on its own
    cache; returns the worst relative logit difference, asserting greedy tokens equal at every
    step."""
    g = torch.Generator().manual_seed(11)
    steps = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (40, 9, 1, 1, 1, 3)]
    pos, worst = 0, 0.0
    for i, ids in enumerate(steps):
        positions = list(range(pos, pos + len(ids)))
        nat = fused(ids, positions, [0] * len(ids), [TABLE], kv_nat, range(len(ids)))
        ref = _forward(model, backend, ids, positions, TABLE, kv_ref, BLOCK)
        worst = max(worst, _rel(nat, ref))
        assert torch.equal(nat.argmax(-1), ref.argmax(-1)), i
        pos += len(ids)
    return worst


@pytest.mark.parametrize("arch,dtype", [
    ("llama", "float32"),   # GQA 4:2
    ("qwen2", "float32"),   # qkv bias
    ("qwen3", "float32"),   # q/k norms, head_dim 32
    ("llama", "bfloat16"),  # against the torch path over the same weights upcast to fp32
])
def test_fused_fp8_kv_matches_the_torch_fp8_path(make_engine, scaled_dir, arch, dtype) -> None:
    engine = make_engine(model=str(scaled_dir(arch)), dtype=dtype, num_blocks=40,
                         block_size=BLOCK, kv_cache_dtype="fp8")
    runner = engine.runner
    # the kernels compute in fp32 (a bf16 model's weights widened): so does the reference
    model = runner.model if dtype == "float32" else copy.deepcopy(runner.model).float()
    assert runner.kv_cache.dtype == FP8_DTYPE and runner.fp8_scales == SCALES
    assert runner.fused is not None and runner.fused.kv_scales == SCALES
    assert runner.backend.name == "torch+fp8kv"  # the torch path's fp8 backend, same scales
    kv_nat, kv_ref = torch.zeros_like(runner.kv_cache), torch.zeros_like(runner.kv_cache)
    worst = _steps(model, runner.fused, runner.backend, kv_nat, kv_ref)
    nat, ref = kv_nat.view(torch.uint8), kv_ref.view(torch.uint8)
    written = (ref != 0).flatten(4).any(-1)  # [L, 2, blocks, bs]: slots either path wrote
    assert torch.equal(written, (nat != 0).flatten(4).any(-1))
    assert written.sum() == 2 * runner.kv_cache.shape[0] * 55  # every row's K and V, each layer
    assert (nat != ref)[written].float().mean().item() < 1e-3  # of the bytes written
    steps = (_magnitude_order(nat) - _magnitude_order(ref)).abs()
    assert steps.max().item() <= 1  # where they differ, neighbouring codes
    assert worst < (1e-5 if torch.equal(nat, ref) else 2e-4), worst

    # The scales matter: under 1.0 the kernels write other bytes for the same prompt, and a
    # decode reading the torch path's cache under 1.0 sees other K and V.
    dropped = FusedForward(runner.model, kv_scales=Fp8Scales())
    g = torch.Generator().manual_seed(11)
    prompt = torch.randint(3, 256, (40,), generator=g).tolist()  # _steps' first chunk
    kv_one = torch.zeros_like(runner.kv_cache)
    dropped(prompt, range(40), [0] * 40, [TABLE], kv_one, [39])
    first = torch.zeros_like(written)  # the prompt's slots
    for p in range(40):
        first[:, :, TABLE[p // 4], p % 4] = True
    one = kv_one.view(torch.uint8)
    assert (one != ref)[first].float().mean().item() > 0.5
    want = runner.fused([7], [55], [0], [TABLE], kv_ref.clone(), [0])
    got = dropped([7], [55], [0], [TABLE], kv_ref.clone(), [0])
    assert _rel(got, want) > 0.5, _rel(got, want)


class _Recorder:
    """The torch path's fp8 backend, recording the K and V each layer writes: (layer, k, v,
    slots) in ``writes`` (the model asks ``for_layer(l)`` for layer l's backend)."""

    def __init__(self, backend) -> None:  # noqa: ANN001
        self.backend, self.name, self.writes = backend, backend.name, []

    def for_layer(self, layer: int) -> _LayerRecorder:
        return _LayerRecorder(self, layer)


class _LayerRecorder:
    """Layer ``layer``'s backend of a :class:`_Recorder`."""

    def __init__(self, recorder: _Recorder, layer: int) -> None:
        self.recorder, self.layer = recorder, layer
        self.inner = recorder.backend.for_layer(layer)
        self.name = self.inner.name

    def for_layer(self, layer: int) -> _LayerRecorder:
        return self.recorder.for_layer(layer)

    def write_kv(self, key, value, k_cache, v_cache, slots) -> None:  # noqa: ANN001
        self.recorder.writes.append((self.layer, key.clone(), value.clone(), slots.clone()))
        self.inner.write_kv(key, value, k_cache, v_cache, slots)

    def attend(self, *args, **kwargs) -> torch.Tensor:  # noqa: ANN002, ANN003
        return self.inner.attend(*args, **kwargs)


def test_each_layers_cache_holds_quantize_fp8_under_its_own_scales(make_engine,
                                                                   scaled_dir) -> None:
    """The bytes of layer l's K and V, on the torch path and natively, are quantize_fp8 of the
    K/V the torch path computed with layer l's checkpoint scales (not another layer's, not
    their largest)."""
    engine = make_engine(model=str(scaled_dir("llama")), dtype="float32", num_blocks=40,
                         block_size=BLOCK, kv_cache_dtype="fp8")
    runner = engine.runner
    assert runner.fp8_scales.per_layer and runner.fused.kv_scales == SCALES
    recorder = _Recorder(runner.backend)
    kv_nat, kv_ref = torch.zeros_like(runner.kv_cache), torch.zeros_like(runner.kv_cache)
    ids = torch.randint(3, 256, (40,), generator=torch.Generator().manual_seed(11)).tolist()
    _forward(runner.model, recorder, ids, list(range(40)), TABLE, kv_ref, BLOCK)
    runner.fused(ids, list(range(40)), [0] * 40, [TABLE], kv_nat, [39])
    assert [w[0] for w in recorder.writes] == list(range(runner.kv_cache.shape[0]))
    for layer, key, value, slots in recorder.writes:
        for plane, x, scale, others in ((0, key, K_SCALES[layer], K_SCALES),
                                        (1, value, V_SCALES[layer], V_SCALES)):
            want = quantize_fp8(x, scale).view(torch.uint8)
            stored = kv_ref[layer, plane].view(torch.uint8).flatten(0, 1)[slots]
            assert torch.equal(stored, want), (layer, plane)
            native = kv_nat[layer, plane].view(torch.uint8).flatten(0, 1)[slots]
            assert (native != want).float().mean().item() < 1e-3, (layer, plane)
            wrong = quantize_fp8(x, max(others)).view(torch.uint8)  # what folding wrote
            if scale != max(others):
                assert (wrong != want).float().mean().item() > 0.5, (layer, plane)


def test_engine_greedy_native_fp8_equals_torch_fp8(make_engine, scaled_dir) -> None:
    """Whole engine runs (prefill chunks, batched decodes of several sequences, a prompt whose
    first 24 tokens, 6 blocks, come from the prefix cache) on both paths: the same tokens."""
    path = str(scaled_dir("llama"))
    kw = dict(model=path, dtype="float32", num_blocks=96, block_size=4, kv_cache_dtype="fp8",
              max_num_batched_tokens=32)
    native, torch_path = make_engine(**kw), make_engine(**kw, use_native_kernels=False)
    assert native.runner.fused is not None and torch_path.runner.fused is None
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(3, 256, (24,), generator=g).tolist()
    first = [shared + torch.randint(3, 256, (9,), generator=g).tolist()]
    then = [shared + torch.randint(3, 256, (5,), generator=g).tolist()] + \
        [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 40, 17)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    out = {}
    for name, engine in (("native", native), ("torch", torch_path)):
        tokens, cached = _run(engine, first, params)
        more, more_cached = _run(engine, then, params)
        assert more_cached[0] == 24, (name, more_cached)  # the shared prefix's 6 blocks
        out[name] = tokens + more
    assert out["native"] == out["torch"]


def _run(engine, prompts, params) -> tuple[list[list[int]], list[int]]:
    """Each prompt's greedy tokens and cached prompt tokens, all submitted at once."""
    ids = [engine.add_request(p, params) for p in prompts]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    cached: dict[str, int] = {}
    while engine.has_unfinished():
        for o in engine.step():
            tokens[o.request_id] += o.new_token_ids
            if o.finished:
                cached[o.request_id] = o.num_cached_tokens
    return [tokens[i] for i in ids], [cached[i] for i in ids]


def test_fp8_cache_needs_usable_scales(make_engine, scaled_dir) -> None:
    engine = make_engine(model=str(scaled_dir("llama")), num_blocks=8, block_size=4,
                         kv_cache_dtype="fp8")
    model, kv = engine.runner.model, engine.runner.kv_cache
    before = kv.view(torch.uint8).clone()
    with pytest.raises(ValueError, match="fp8 KV cache needs its scales"):
        FusedForward(model)([5], [0], [0], [[1]], kv, [0])
    with pytest.raises(ValueError, match="not a positive float32 below 2"):
        FusedForward(model, kv_scales=Fp8Scales(k=1e39))  # finite in Python, inf in float32
    with pytest.raises(ValueError, match="not a positive float32 below 2"):
        FusedForward(model, kv_scales=Fp8Scales(k=1e37))  # finite, but inf times the reads' 2^8
    with pytest.raises(ValueError, match="not a positive float32 below 2"):
        FusedForward(model, kv_scales=Fp8Scales(v=1e-50))  # 0 in float32
    assert torch.equal(kv.view(torch.uint8), before)


def test_e5m2_cache_is_declined_by_name(make_engine, tiny_dir) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=8)
    model = engine.runner.model
    assert unsupported_reason(model, FP8_DTYPE) is None
    assert unsupported_reason(model, torch.float8_e5m2) == "a torch.float8_e5m2 KV cache"
