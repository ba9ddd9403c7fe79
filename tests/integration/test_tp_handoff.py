"""Heterogeneous handoffs through real workers: a prefill worker of tensor-parallel size a
pushes to a decode worker of size b (each rank's KV heads straight to the decode ranks that
hold them, tandem/kv_transfer/reshard.py) and the greedy output equals the colocated
engine's, for TP 1->3, 3->1 and 2->1 (a KV head replicated on the prefill side: sent once);
a second request with the same prompt reuses the decode worker's cached prefix (only the
rest is pushed); a forked request (n = 2) shares the one re-sharded push, every decode rank's
COMMIT carrying both first tokens; with an fp8 KV cache on both sides (TP 3->1) each
rank's e4m3 heads move as bytes under the same scales and the output equals the colocated
fp8 engine's, and a float32 decode worker's reservation is refused by an fp8 prefill group
(a typed FAILED_PRECONDITION naming both dtypes) before anything is pushed. A LoRA adapter
loaded at runtime through the workers' LoraAdapters service reaches every rank of a TP 2
prefill and a TP 2 decode group, and a handoff under it equals the colocated engine's; one a
follower cannot hold (its adapter slots full) fails the Load naming that rank, no rank keeps
it, and the group serves on. Both workers end with every block free, and every rank exits
with its worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tandem.engine.lora import LoraConfig
from tandem.engine.parallel import rank_slots
from tandem.engine.sampling_params import SamplingParams
from tandem.engine.testing.lora import greedy_under_adapters, write_random_adapter
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tests.integration.test_workers_handoff import (  # noqa: F401
    PROMPT,
    Cluster,
    Worker,
    _greedy,
    _member,
    router,
)

MAX_NEW = 10


def _colocated(make_engine, model: str, prompt: list[int], kv: str = "auto") -> list[int]:
    engine = make_engine(model=model, num_blocks=64, block_size=16, kv_cache_dtype=kv)
    rid = engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=MAX_NEW,
                                                    ignore_eos=True))
    out: list[int] = []
    while engine.has_unfinished():
        out += [t for o in engine.step() if o.request_id == rid for t in o.new_token_ids]
    return out


def _start(model: Path, router_address: str, logs: Path, a: int, b: int,
           kv: str = "float32", decode_kv: str | None = None, extra: tuple[str, ...] = ()
           ) -> Iterator[Cluster]:
    engine = ["--model", str(model), "--block-size", "16", "--threads", "1", "--num-blocks",
              "64", "--router", router_address, *extra]
    decode = Worker("tandem.worker.decode", ["--port", "0", "--kv-port", "0", *engine,
                                             f"--tensor-parallel-size={b}",
                                             f"--kv-cache-dtype={decode_kv or kv}"],
                    logs / f"decode-{a}-{b}.log")
    prefill = Worker("tandem.worker.prefill", ["--port", "0", *engine,
                                               f"--tensor-parallel-size={a}",
                                               f"--kv-cache-dtype={kv}"],
                     logs / f"prefill-{a}-{b}.log")
    c = None
    try:
        d_info, p_info = decode.wait_ready(), prefill.wait_ready()
        c = Cluster(decode, d_info, prefill, p_info, str(model))
        yield c
    finally:
        if c is not None:
            c.close()
        codes = (decode.stop(), prefill.stop())
    assert codes == (0, 0), f"exit codes {codes}; logs in {logs}"


def _handoff(c: Cluster, rid: str, prompt: list[int]
             ) -> tuple[worker_pb2.ReserveResponse, list[int]]:
    res = c.reserve(rid, prompt, MAX_NEW)
    first = c.prefill.Prefill(c.prefill_request(rid, prompt, MAX_NEW, res), timeout=120)
    msgs = list(c.decode.Decode(worker_pb2.DecodeRequest(request_id=rid), timeout=120))
    assert msgs[-1].finished
    return res, [first.first_token] + [t for m in msgs for t in m.token_ids]


@pytest.mark.parametrize(("nkv", "a", "b", "kv"), [
    (3, 1, 3, "float32"), (3, 3, 1, "float32"), (1, 2, 1, "float32"), (3, 3, 1, "fp8")],
    ids=["tp1-to-tp3", "tp3-to-tp1", "tp2-to-tp1-replicated", "tp3-to-tp1-fp8"])
def test_a_handoff_between_groups_of_different_sizes_equals_colocated(
        tiny_dir, tmp_path, router, make_engine, nkv: int, a: int, b: int,  # noqa: F811
        kv: str) -> None:
    model = tiny_dir("llama", nkv, num_heads=6, hidden_size=96)
    colocated_kv = "fp8" if kv == "fp8" else "auto"
    want = _colocated(make_engine, str(model), PROMPT, colocated_kv)
    for c in _start(model, router[1], tmp_path, a, b, kv):
        res, got = _handoff(c, "r1", PROMPT)
        assert res.cached_tokens == 0 and got == want
        # the same prompt again: the decode worker holds its prefix; only the rest is pushed
        res, again = _handoff(c, "r2", PROMPT)
        assert res.cached_tokens > 0 and again == want
        forked = PROMPT[:20] + [7, 8, 9]  # a new tail: pushed again, under two sequences
        res = c.decode.Reserve(worker_pb2.ReserveRequest(
            request_id="f", token_ids=forked, sampling=_greedy(MAX_NEW), lease_s=60.0, n=2))
        req = c.prefill_request("f", forked, MAX_NEW, res)
        req.n = 2
        first = c.prefill.Prefill(req, timeout=120)
        seqs = []
        for j, tok in enumerate(t.token_id for t in first.first_tokens):
            msgs = list(c.decode.Decode(worker_pb2.DecodeRequest(request_id="f", index=j),
                                        timeout=120))
            seqs.append([tok] + [t for m in msgs for t in m.token_ids])
        assert seqs == [_colocated(make_engine, str(model), forked, colocated_kv)] * 2
        c.both_idle()  # every block free on both workers (one manager decides for all ranks)


def test_a_float_decode_refuses_an_fp8_prefill_group(tiny_dir, tmp_path, router  # noqa: F811
                                                     ) -> None:
    model = tiny_dir("llama", 1, num_heads=6, hidden_size=96)
    for c in _start(model, router[1], tmp_path, 2, 1, "fp8", "float32"):
        res = c.reserve("mix", PROMPT, 4)
        assert res.layout.dtype == "float32"
        with pytest.raises(grpc.RpcError) as err:
            c.prefill.Prefill(c.prefill_request("mix", PROMPT, 4, res), timeout=60)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "float8_e4m3fn" in err.value.details() and "float32" in err.value.details()
        c.decode.Abort(worker_pb2.AbortRequest(request_id="mix"), timeout=30)
        c.both_idle()


def test_a_runtime_adapter_reaches_every_rank_of_both_groups(
        tiny_dir, tmp_path, router, make_engine) -> None:  # noqa: F811
    # two KV heads over two prefill ranks: rank 1 pushes its own head, under the adapter too
    model = tiny_dir("llama", 2, num_heads=6, hidden_size=96)
    adapter = str(write_random_adapter(model, tmp_path / "x", rank=4, seed=5))
    one = make_engine(model=str(model), num_blocks=64, block_size=16, kv_cache_dtype="float32",
                      lora=LoraConfig(enabled=True, modules=(("x", adapter),)))
    want = greedy_under_adapters(one, [(PROMPT, "x", MAX_NEW)])[0]
    assert want != _colocated(make_engine, str(model), PROMPT)  # the adapter moves the output
    lora = ("--enable-lora", "--allow-runtime-lora-updates")
    for c in _start(model, router[1], tmp_path, 2, 2, extra=lora):
        load = worker_pb2.LoraAdapterRequest(name="x", path=adapter)
        for address in (c.decode_address, c.prefill_address):
            with _member(address) as channel:
                worker_pb2_grpc.LoraAdaptersStub(channel).Load(load, timeout=60)
        sampling = _greedy(MAX_NEW)
        res = c.decode.Reserve(worker_pb2.ReserveRequest(
            request_id="x1", token_ids=PROMPT, sampling=sampling, lease_s=60.0, lora="x"))
        req = c.prefill_request("x1", PROMPT, MAX_NEW, res)
        req.lora, req.lora_identity = "x", res.lora_identity
        first = c.prefill.Prefill(req, timeout=120)
        msgs = list(c.decode.Decode(worker_pb2.DecodeRequest(request_id="x1"), timeout=120))
        assert [first.first_token] + [t for m in msgs for t in m.token_ids] == want
        with _member(c.prefill_address) as channel:
            worker_pb2_grpc.LoraAdaptersStub(channel).Unload(
                worker_pb2.LoraAdapterRequest(name="x"), timeout=60)
        c.both_idle()


def _handoff_under(c: Cluster, rid: str, lora: str) -> list[int]:
    """A handoff of PROMPT under adapter ``lora`` ("": the base model)."""
    res = c.decode.Reserve(worker_pb2.ReserveRequest(
        request_id=rid, token_ids=PROMPT, sampling=_greedy(MAX_NEW), lease_s=60.0, lora=lora))
    req = c.prefill_request(rid, PROMPT, MAX_NEW, res)
    req.lora, req.lora_identity = lora, res.lora_identity
    first = c.prefill.Prefill(req, timeout=120)
    msgs = list(c.decode.Decode(worker_pb2.DecodeRequest(request_id=rid), timeout=120))
    return [first.first_token] + [t for m in msgs for t in m.token_ids]


def test_an_adapter_one_rank_cannot_hold_is_refused_and_the_group_serves_on(
        tiny_dir, tmp_path, router, make_engine, monkeypatch) -> None:  # noqa: F811
    """Rank 1 of a TP 2 decode group holds at most one adapter (tandem/engine/parallel/
    rank_slots.py, a test-only bound on that rank alone), and holds a from start. Loading b
    there: rank 0 accepts it, rank 1 refuses it, so the Load RPC fails naming rank 1 and its
    reason, and no rank keeps b; the group still serves a and the base model exactly, and once
    a is unloaded (on every rank) b loads and serves exactly."""
    model = tiny_dir("llama", 2, num_heads=6, hidden_size=96)
    a = str(write_random_adapter(model, tmp_path / "a", rank=4, seed=5))
    b = str(write_random_adapter(model, tmp_path / "b", rank=4, seed=6))
    one = make_engine(model=str(model), num_blocks=64, block_size=16, kv_cache_dtype="float32",
                      lora=LoraConfig(enabled=True, modules=(("a", a), ("b", b))))
    want = dict(zip("ab", greedy_under_adapters(one, [(PROMPT, "a", MAX_NEW),
                                                      (PROMPT, "b", MAX_NEW)]), strict=True))
    want[""] = _colocated(make_engine, str(model), PROMPT, "float32")
    assert len({tuple(t) for t in want.values()}) == 3  # each adapter moves the output
    monkeypatch.setenv(rank_slots.ENV, "1:1")  # the workers' environment: rank 1's bound
    lora = ("--enable-lora", "--allow-runtime-lora-updates", "--lora-modules", f"a={a}")
    for c in _start(model, router[1], tmp_path, 1, 2, extra=lora):
        with _member(c.prefill_address) as channel:
            worker_pb2_grpc.LoraAdaptersStub(channel).Load(
                worker_pb2.LoraAdapterRequest(name="b", path=b), timeout=60)
        with _member(c.decode_address) as channel:
            admin = worker_pb2_grpc.LoraAdaptersStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                admin.Load(worker_pb2.LoraAdapterRequest(name="b", path=b), timeout=60)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = err.value.details()
            assert "tensor-parallel rank 1 could not load LoRA adapter 'b'" in details
            assert "its limit is 1" in details, details
            with pytest.raises(grpc.RpcError) as err:  # rank 0 did not keep it either
                c.decode.Reserve(worker_pb2.ReserveRequest(
                    request_id="b0", token_ids=PROMPT, sampling=_greedy(MAX_NEW), lease_s=60.0,
                    lora="b"))
            assert "unknown LoRA adapter 'b'" in err.value.details()
            assert _handoff_under(c, "a1", "a") == want["a"]
            assert _handoff_under(c, "base1", "") == want[""]
            admin.Unload(worker_pb2.LoraAdapterRequest(name="a"), timeout=60)
            admin.Load(worker_pb2.LoraAdapterRequest(name="b", path=b), timeout=60)
        assert _handoff_under(c, "b1", "b") == want["b"]
        c.both_idle()


@pytest.mark.parametrize(("a", "b"), [(2, 1), (1, 2)], ids=["tp2-to-tp1", "tp1-to-tp2"])
def test_a_latent_cache_handoff_between_group_sizes_equals_colocated(
        tiny_dir, tmp_path, router, make_engine, a: int, b: int) -> None:  # noqa: F811
    """DeepSeek-V2 (MLA, layers 1 and 2 MoE): every rank of a group holds the whole latent
    cache (one KV head, replicated), so a TP 2 prefill group's rank 0 alone sends it, and each
    rank of a TP 2 decode group receives its own copy; the output equals colocated, the
    prefix is reused, every block is free afterwards."""
    model = tiny_dir("deepseek_v2", 4, num_layers=3, first_k_dense_replace=1)
    want = _colocated(make_engine, str(model), PROMPT)
    for c in _start(model, router[1], tmp_path, a, b):
        res, got = _handoff(c, "r1", PROMPT)
        assert res.cached_tokens == 0 and got == want
        res, again = _handoff(c, "r2", PROMPT)
        assert res.cached_tokens > 0 and again == want
        c.both_idle()
