"""Hostile adapters and requests: each refused with a message naming the problem; and the
prefix cache never hands KV computed under one adapter to another (or to the base model)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tandem.engine import InvalidRequestError, SamplingParams
from tandem.engine.lora import LoraConfig, parse_module
from tandem.engine.lora.adapter import LoraError
from tandem.engine.testing.lora import make_tiny_adapter, peft_greedy


@pytest.fixture(scope="module")
def base_and_adapter(tmp_path_factory, tiny_dir):
    base = tiny_dir("llama", 2)
    root = tmp_path_factory.mktemp("lora-checks")
    return base, make_tiny_adapter(base, root / "a", rank=4, seed=7), \
        make_tiny_adapter(base, root / "b", rank=4, seed=8)


def _engine(make_engine, base, **lora):
    return make_engine(model=str(base), num_blocks=64, block_size=16,
                       lora=LoraConfig(enabled=True, **lora))


def _copy(src, dst, edit=None):
    shutil.copytree(src, dst)
    if edit is not None:
        config = json.loads((dst / "adapter_config.json").read_text())
        edit(config)
        (dst / "adapter_config.json").write_text(json.dumps(config))
    return dst


def test_bad_adapter_dirs_are_refused_by_name(make_engine, base_and_adapter, tmp_path) -> None:
    base, good, _ = base_and_adapter
    engine = _engine(make_engine, base, max_lora_rank=8)
    cases = {
        "is not a directory": tmp_path / "missing",
        "no adapter_config.json": tmp_path / "empty",
        "above --max-lora-rank": _copy(good, tmp_path / "rank", lambda c: c.update(r=16)),
        "use_dora is not supported": _copy(good, tmp_path / "dora",
                                           lambda c: c.update(use_dora=True)),
        r"not supported \(only": _copy(good, tmp_path / "emb",
                                     lambda c: c.update(target_modules=["embed_tokens"])),
        "has shape": _copy(good, tmp_path / "r2", lambda c: c.update(r=2)),
    }
    (tmp_path / "empty").mkdir()
    for why, path in cases.items():
        with pytest.raises(LoraError, match=why):
            engine.loras.register("x", str(path))
    garbage = _copy(good, tmp_path / "garbage")
    (garbage / "adapter_model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(LoraError, match="unreadable"):
        engine.loras.register("x", str(garbage))
    assert engine.loras.adapters == {}
    engine.loras.register("x", str(good))
    with pytest.raises(LoraError, match="already loaded"):
        engine.loras.register("x", str(good))


def test_unknown_adapter_and_lora_off_are_refused(make_engine, base_and_adapter) -> None:
    base, good, _ = base_and_adapter
    engine = _engine(make_engine, base, modules=(("a", str(good)),))
    with pytest.raises(InvalidRequestError, match="unknown LoRA adapter 'nope'"):
        engine.add_request([5, 6, 7], SamplingParams(lora="nope"))
    plain = make_engine(model=str(base), num_blocks=64, block_size=16)
    with pytest.raises(InvalidRequestError, match="LoRA is not enabled"):
        plain.add_request([5, 6, 7], SamplingParams(lora="a"))


def test_max_cpu_loras_bounds_registrations(make_engine, base_and_adapter) -> None:
    base, a, b = base_and_adapter
    engine = _engine(make_engine, base, modules=(("a", str(a)),), max_cpu_loras=1)
    with pytest.raises(LoraError, match="--max-cpu-loras"):
        engine.loras.register("b", str(b))
    engine.loras.unregister("a", lambda name: False)
    engine.loras.register("b", str(b))


def test_lora_module_values() -> None:
    assert parse_module("x=/p") == ("x", "/p")
    assert parse_module('{"name": "x", "path": "/p"}') == ("x", "/p")
    for bad in ("x", "=p", "bad name=/p", "{"):
        with pytest.raises(ValueError):
            parse_module(bad)


def test_prefix_cache_is_salted_by_adapter(make_engine, base_and_adapter) -> None:
    base, a, b = base_and_adapter
    engine = _engine(make_engine, base, modules=(("a", str(a)), ("b", str(b))), max_loras=2)
    g = torch.Generator().manual_seed(9)
    prompt = torch.randint(3, 256, (70,), generator=g).tolist()  # four full blocks

    def run(lora: str) -> tuple[list[int], int]:
        rid = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=6,
                                                        ignore_eos=True, lora=lora))
        while engine.has_unfinished():
            for out in engine.step():
                if out.request_id == rid and out.finished:
                    result = (out.token_ids, out.num_cached_tokens)
        return result

    first, hit = run("a")
    assert hit == 0
    again, hit = run("a")  # the same adapter: the prefix is reused
    assert hit == 64 and again == first
    other, hit = run("b")  # another adapter: the conversation's KV is not reused
    assert hit == 0 and other == peft_greedy(base, b, prompt, 6)
    plain, hit = run("")
    assert hit == 0 and plain == peft_greedy(base, None, prompt, 6)
    assert engine.stats().num_stranded_blocks == 0


def test_a_group_refuses_an_adapter_over_its_frame_limit(base_and_adapter, monkeypatch) -> None:
    """A tensor-parallel group sends an adapter's file bytes to its other ranks in one step
    frame: one larger than that is refused by name (LoraError) before any rank holds it."""
    from tandem.engine.lora import manager as lora_manager
    from tandem.engine.models.weights import load_model

    base, good, _ = base_and_adapter
    model, arch = load_model(base, torch.float32, torch.device("cpu"), 64, progress=False)

    class Mirror:
        loads: list[str] = []

        def load_adapter(self, name: str, *_: object) -> None:
            self.loads.append(name)

        def unload_adapter(self, name: str) -> None:
            raise AssertionError("nothing was loaded")

    mirror = Mirror()
    lora = lora_manager.LoraManager(LoraConfig(enabled=True), model, arch, torch.float32,
                                    torch.device("cpu"), mirror=mirror)
    lora.register("a", str(good))  # fits: every rank gets it
    assert mirror.loads == ["a"]
    monkeypatch.setattr(lora_manager, "MIRROR_BYTES", 1000)
    with pytest.raises(LoraError, match="up to 1000 bytes"):
        lora.register("big", str(good))
    assert "big" not in lora.adapters and mirror.loads == ["a"]
