"""LoRA adapters on the fused native CPU forward (tandem/engine/native/lora_step.py,
lora_delta.h) against the torch reference: the torch forward with the adapters' hooks
(tandem/engine/lora/manager.py), which PEFT checks (tests/unit/engine/lora/).

One step carries rows under adapter ``a`` (rank 4, every target), adapter ``b`` (rank 8,
rsLoRA, only q/v/down: sub-projections and projections it leaves alone) and the base model,
as prefill chunks (the tiled GEMM), decodes (the few-row loops) and mixed steps. A bf16 model's
reference is the torch path over the same numbers in fp32 (its weights and its adapters'
bf16 weights upcast), as for the base model (test_fused_16bit.py).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tandem.engine import SamplingParams
from tandem.engine.attention import AttentionMetadata
from tandem.engine.lora import LoraConfig
from tandem.engine.lora.manager import LoraManager
from tandem.engine.native import load
from tandem.engine.testing.lora import make_tiny_adapter
from tests.unit.engine._reference import engine_token_ids

pytestmark = pytest.mark.skipif(load() is None, reason="native kernels unavailable here")

BS = 4


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, tiny_dir):
    base = tiny_dir("llama", 2)
    root = tmp_path_factory.mktemp("native-lora")
    return base, {
        "a": make_tiny_adapter(base, root / "a", rank=4, seed=1),
        "b": make_tiny_adapter(base, root / "b", rank=8, alpha=4.0, seed=2, use_rslora=True,
                               targets=("q_proj", "v_proj", "down_proj")),
    }


def _engine(make_engine, adapters, **kw):
    base, dirs = adapters
    return make_engine(model=str(base), block_size=BS, lora=LoraConfig(
        enabled=True, modules=tuple((n, str(p)) for n, p in dirs.items()), max_loras=2,
        max_lora_rank=8), **kw)


def _reference(runner) -> tuple[torch.nn.Module, LoraManager]:
    """The torch model and adapters the native path must match: the runner's own for an fp32
    model; for a 16-bit one, copies upcast to fp32 (the same numbers), with a manager of its
    own (the copy keeps the original's hooks, idle outside that manager's steps)."""
    lora = runner.lora
    if runner.model.norm.weight.dtype == torch.float32:
        return runner.model, lora
    model = copy.deepcopy(runner.model).float()
    ref = LoraManager(LoraConfig(enabled=True, max_loras=2, max_lora_rank=8), model,
                      runner.arch, torch.float32, runner.device)
    for name, a in lora.adapters.items():
        ref.adapters[name] = dataclasses.replace(a, weights={
            k: (x.float(), y.float()) for k, (x, y) in a.weights.items()})
    return model, ref


def _torch_logits(runner, model, lora, kv, step) -> torch.Tensor:
    """The torch forward of one step (``step``: (adapter, table, start, ids) per sequence,
    decodes first) with the adapters' hooks; logits of every row."""
    ids, positions, slots, qlens, slens, tables, rows = [], [], [], [], [], [], []
    for name, table, start, seq_ids in step:
        n = len(seq_ids)
        ids += seq_ids
        positions += range(start, start + n)
        slots += [table[p // BS] * BS + p % BS for p in range(start, start + n)]
        qlens.append(n)
        slens.append(start + n)
        tables.append(table)
        rows += [name] * n
    meta = AttentionMetadata.build(qlens, slens, tables, slots, BS, runner.device)
    with torch.inference_mode(), lora.step(rows, runner.device):
        hidden = model(torch.tensor(ids), torch.tensor(positions), kv, meta, runner.backend)
        return model.compute_logits(hidden).float()


def _native_logits(runner, kv, step) -> torch.Tensor:
    ids, positions, seq, tables, rows = [], [], [], [], []
    for i, (name, table, start, seq_ids) in enumerate(step):
        ids += seq_ids
        positions += range(start, start + len(seq_ids))
        seq += [i] * len(seq_ids)
        tables.append(table)
        rows += [name] * len(seq_ids)
    lora = runner._native_lora(rows)
    return runner.fused(ids, positions, seq, tables, kv, range(len(ids)), lora=lora)


@pytest.mark.parametrize("dtype,quant", [
    ("float32", "none"),      # fp32 weights read in place
    ("float32", "int4"),      # quantized base: the delta is added to the packed linear's output
    ("bfloat16", "none"),     # 16-bit weights and adapters widened to fp32
])
def test_native_lora_matches_the_torch_reference(make_engine, adapters, exact_torch_path,
                                                 dtype, quant) -> None:
    engine = _engine(make_engine, adapters, dtype=dtype, quantization=quant, num_blocks=40,
                     kv_cache_dtype="float32")
    runner = engine.runner
    assert runner.fused is not None
    model, ref_lora = _reference(runner)
    kv_nat, kv_ref, kv_base = (torch.zeros_like(runner.kv_cache) for _ in range(3))
    g = torch.Generator().manual_seed(7)

    def toks(n: int) -> list[int]:
        return torch.randint(3, 256, (n,), generator=g).tolist()

    ta, tb, tc = [3, 17, 9, 30, 1], [12, 5, 33, 20, 8], [39, 2, 25, 14, 6, 11]
    # (adapter, table, start, ids) per sequence, decodes first
    steps = [
        [("a", ta, 0, toks(9)), ("b", tb, 0, toks(7)), ("", tc, 0, toks(5))],  # 21-row chunks
        [("a", ta, 9, toks(1)), ("b", tb, 7, toks(1)), ("", tc, 5, toks(1))],    # decodes
        [("b", tb, 8, toks(1)), ("a", ta, 10, toks(3)), ("", tc, 6, toks(10))],  # mixed
        [("", tc, 16, toks(1)), ("a", ta, 13, toks(1))],                         # 2 rows
    ]
    for i, step in enumerate(steps):
        nat = _native_logits(runner, kv_nat, step)
        ref = _torch_logits(runner, model, ref_lora, kv_ref, step)
        assert _rel(nat, ref) < 1e-3, (i, _rel(nat, ref))
        assert torch.equal(nat.argmax(-1), ref.argmax(-1)), i
        # the adapters moved their rows, and only those: the same step without them
        base = runner.fused(*_unpack(step), kv_base, range(nat.shape[0]))
        at = 0
        for name, _, _, seq_ids in step:
            rows = slice(at, at + len(seq_ids))
            moved = _rel(nat[rows], base[rows])
            if name:
                assert moved > 1e-3, (i, name, moved)
            else:  # the same computation: its sequence's K/V are the same in both caches
                assert moved < 1e-6, (i, moved)
            at += len(seq_ids)
        kv_base.copy_(kv_nat)  # the next step attends to the adapted K/V
    assert _rel(kv_nat, kv_ref) < 1e-3


def _unpack(step) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    ids, positions, seq, tables = [], [], [], []
    for i, (_, table, start, seq_ids) in enumerate(step):
        ids += seq_ids
        positions += range(start, start + len(seq_ids))
        seq += [i] * len(seq_ids)
        tables.append(table)
    return ids, positions, seq, tables


def test_a_bad_row_slot_is_refused(make_engine, adapters) -> None:
    engine = _engine(make_engine, adapters, dtype="float32", num_blocks=8)
    runner = engine.runner
    kv = runner.kv_cache
    before = kv.clone()
    lora = runner._native_lora(["a", ""])
    adapter = runner.lora.adapters["a"]
    loaded = runner.lora.adapters.values()
    bad = runner._native_loras.step([adapter], [0, 1], loaded)  # slot 1 of a one-slot step
    with pytest.raises(ValueError, match="out of range"):
        runner.fused([5, 6], [0, 1], [0, 0], [[1]], kv, [1], lora=bad)
    with pytest.raises(ValueError, match="LoRA row slots"):
        runner.fused([5], [0], [0], [[1]], kv, [0], lora=lora)
    assert torch.equal(kv, before)


def test_a_reloaded_adapter_gets_a_new_table(make_engine, adapters) -> None:
    """An adapter unloaded and loaded again under its name with other weights (runtime
    updates) runs with the new weights: its old table is dropped, never reused."""
    base, dirs = adapters
    engine = _engine(make_engine, adapters, dtype="float32", num_blocks=16)
    runner = engine.runner
    step = [("a", [1, 2], 0, list(range(10, 17)))]
    first = _native_logits(runner, torch.zeros_like(runner.kv_cache), step)
    runner.lora.unregister("a", lambda _name: False)
    runner.lora.register("a", str(dirs["b"]))  # b's weights under a's name
    kv_nat, kv_ref = (torch.zeros_like(runner.kv_cache) for _ in range(2))
    nat = _native_logits(runner, kv_nat, step)
    ref = _torch_logits(runner, runner.model, runner.lora, kv_ref, step)
    assert _rel(nat, ref) < 1e-3
    assert _rel(nat, first) > 1e-2
    assert list(runner._native_loras._tables) == [runner.lora.adapters["a"].identity]


def _greedy(engine, prompts: list[list[int]], loras: list[str]) -> tuple[list[list[int]], int]:
    """Each request's tokens, and how many steps the fused forward ran with adapter rows."""
    fused, adapted = engine.runner.fused, []

    def spy(*a, **k):  # noqa: ANN002, ANN003, ANN202
        adapted.append(k.get("lora") is not None)
        return fused(*a, **k)

    if fused is not None:
        engine.runner.fused = spy
    ids = [engine.add_request(p, SamplingParams(temperature=0.0, max_tokens=16,
                                                ignore_eos=True, lora=lora))
           for p, lora in zip(prompts, loras, strict=True)]
    done: dict[str, list[int]] = {}
    while engine.has_unfinished():
        done.update({o.request_id: o.token_ids for o in engine.step() if o.finished})
    engine.runner.fused = fused
    return [done[i] for i in ids], sum(adapted)


@pytest.mark.parametrize("quant", ["none", "int4"])
def test_engine_greedy_native_lora_equals_torch(make_engine, adapters, exact_torch_path,
                                                quant) -> None:
    """Whole engine runs, adapters and base rows mixed in its batches, give the tokens of the
    same engine on the torch path; every adapter step ran on the fused forward."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (5, 40, 17, 9)]
    loras = ["a", "b", "", "a"]
    native = _engine(make_engine, adapters, dtype="float32", quantization=quant,
                     num_blocks=64)
    ref = _engine(make_engine, adapters, dtype="float32", quantization=quant, num_blocks=64,
                  use_native_kernels=False)
    assert native.runner.fused is not None and ref.runner.fused is None
    got, fused_steps = _greedy(native, prompts, loras)
    want, _ = _greedy(ref, prompts, loras)
    assert got == want
    assert fused_steps >= 16  # prefills and decodes with adapter rows, all fused
    assert got[0] != engine_token_ids(ref, [prompts[0]], SamplingParams(
        temperature=0.0, max_tokens=16, ignore_eos=True))[0]  # adapter a moved its output


def test_native_lora_on_an_fp8_layer_of_odd_width_matches_the_torch_reference(
        make_engine, exact_torch_path, tmp_path) -> None:
    """An FP8 down_proj reads 100 inputs (the kernels take FP8 rows of any width): its
    adapter's shrink sums the last 100 % 8 inputs too, reading nothing past a row."""
    from tandem.engine.testing import make_tiny_checkpoint
    from tandem.engine.testing.fp8_checkpoint import write_fp8

    dense = make_tiny_checkpoint(tmp_path / "dense", hidden_size=128, intermediate_size=100)
    write_fp8(dense, tmp_path / "fp8", (48, 40))
    adapter = make_tiny_adapter(dense, tmp_path / "a", rank=4, seed=3, targets=("down_proj",))
    engine = make_engine(model=str(tmp_path / "fp8"), block_size=BS, quantization="fp8",
                         num_blocks=40, kv_cache_dtype="float32", lora=LoraConfig(
                             enabled=True, modules=(("a", str(adapter)),), max_loras=1,
                             max_lora_rank=8))
    runner = engine.runner
    assert runner.fused is not None
    kv_nat, kv_ref = torch.zeros_like(runner.kv_cache), torch.zeros_like(runner.kv_cache)
    g = torch.Generator().manual_seed(5)
    ta, tc = [3, 17, 9, 30, 1], [12, 5, 33, 20, 8]
    for step in ([("a", ta, 0, torch.randint(3, 256, (9,), generator=g).tolist()),
                  ("", tc, 0, torch.randint(3, 256, (5,), generator=g).tolist())],
                 [("a", ta, 9, [7]), ("", tc, 5, [11])]):
        nat = _native_logits(runner, kv_nat, step)
        ref = _torch_logits(runner, runner.model, runner.lora, kv_ref, step)
        assert _rel(nat, ref) < 1e-3, _rel(nat, ref)
