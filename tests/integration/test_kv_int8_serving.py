"""int8 KV end to end: an int8-KV prefill worker and an int8-KV decode worker serve SmolLM2
through the router (same tokens as one int8-KV engine), and a float-KV worker refuses to pair
with an int8-KV one, both where the prefill worker checks the reservation's layout and at the
transfer layer's HELLO."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tandem.engine import SamplingParams
from tandem.kv_transfer import LayoutMismatchError, Receiver, ReceiverConfig, Sender, SenderConfig
from tandem.kv_transfer.transport import TcpTransport
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc
from tandem.worker.convert import kv_layout
from tests.integration.served_model import start_all

# The dequantized fp32 model: these tests compare outputs across paths (transformers,
# colocated, a migrated leg that recomputes the prompt), and the quantized default's
# few-row and many-row kernels round activations differently (docs/native_cpu.md).
ENGINE = ["--model", "smollm2", "--dtype", "float32", "--quantization", "none", "--threads", "1",
          "--num-blocks", "64"]
INT8 = ["--kv-cache-dtype", "int8"]
PROMPT = "The lighthouse keeper climbed the stairs and"
SECRET = b"int8-kv-test-secret-0123456789"


@pytest.fixture(scope="module")
def cluster(smollm2_dir: Path) -> Iterator[dict[str, Proc]]:
    c = Cluster()
    try:
        decode, float_decode, prefill = start_all(
            c, ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *ENGINE, *INT8),
            ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *ENGINE),
            ("tandem.worker.prefill", "--port", "0", *ENGINE, *INT8))
        router = c.start(
            "tandem.router", "--port", "0", "--tokenizer", str(smollm2_dir), "--model-name", "smollm2",
            "--prefill", prefill.grpc, "--decode", decode.grpc,
            "--placement", "remote",  # every prompt's KV crosses the wire, int8
        )
        yield {"router": router, "prefill": prefill, "decode": decode, "float": float_decode}
    finally:
        c.stop()


def _greedy(n: int) -> tandem_pb2.SamplingParams:
    return tandem_pb2.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def _stats(proc: Proc, role: str) -> worker_pb2.WorkerStats:
    ch = proc.channel()
    stub = (worker_pb2_grpc.DecodeServiceStub if role == "decode"
            else worker_pb2_grpc.PrefillServiceStub)(ch)
    try:
        return stub.Stats(worker_pb2.StatsRequest(), timeout=30)
    finally:
        ch.close()


def _wait_idle(proc: Proc, role: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        st = _stats(proc, role)
        if st.num_running == st.num_waiting == st.num_reserved == 0 and (
                st.num_free_blocks == st.num_blocks):
            return
        assert time.monotonic() < deadline, st
        time.sleep(0.05)


def test_int8_workers_serve_through_the_router(cluster, make_engine) -> None:
    ref = make_engine(model="smollm2", dtype="float32", quantization="none", num_blocks=64,
                      kv_cache_dtype="int8")
    rid = ref.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=12,
                                                 ignore_eos=True))
    want: list[int] = []
    while ref.has_unfinished():
        want += [t for o in ref.step() if o.request_id == rid for t in o.new_token_ids]

    ch = grpc.insecure_channel(cluster["router"].grpc)
    try:
        stub = tandem_pb2_grpc.TandemStub(ch)
        got: list[int] = []
        for msg in stub.Generate(tandem_pb2.GenerateRequest(text=PROMPT, sampling=_greedy(12)),
                                 timeout=300):
            got += list(msg.token_ids)
    finally:
        ch.close()
    assert got == want
    pre, dec = _stats(cluster["prefill"], "prefill"), _stats(cluster["decode"], "decode")
    assert dec.kv_transfer_bytes > 0 or pre.kv_transfer_bytes > 0  # it went disaggregated
    _wait_idle(cluster["prefill"], "prefill")
    _wait_idle(cluster["decode"], "decode")


def test_float_kv_decode_refuses_int8_prefill(cluster) -> None:
    dch = cluster["float"].channel()
    pch = cluster["prefill"].channel()
    try:
        decode = worker_pb2_grpc.DecodeServiceStub(dch)
        prefill = worker_pb2_grpc.PrefillServiceStub(pch)
        tokens = list(range(100, 120))
        res = decode.Reserve(worker_pb2.ReserveRequest(
            request_id="mix", token_ids=tokens, sampling=_greedy(4), lease_s=30), timeout=30)
        assert res.layout.dtype == "float16"  # a float32 model's default cache on the CPU
        with pytest.raises(grpc.RpcError) as err:
            prefill.Prefill(worker_pb2.PrefillRequest(
                request_id="mix", token_ids=tokens, sampling=_greedy(4),
                transfer_id=res.transfer_id, block_ids=res.block_ids, skip_tokens=res.skip_tokens,
                kv_endpoint=res.kv_endpoint, layout=res.layout), timeout=60)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "int8" in err.value.details() and "float16" in err.value.details()
        decode.Abort(worker_pb2.AbortRequest(request_id="mix"), timeout=30)
    finally:
        dch.close()
        pch.close()
    _wait_idle(cluster["float"], "decode")


def test_hello_refuses_float_kv_sender(make_engine, tiny_dir) -> None:
    """The transfer layer's own check: real engine layouts, real TCP, a typed error."""
    model = str(tiny_dir("llama", 2))
    e8 = make_engine(model=model, num_blocks=8, kv_cache_dtype="int8")
    e32 = make_engine(model=model, num_blocks=8)
    l8, l32 = kv_layout(e8.remote.kv_cache_spec()), kv_layout(e32.remote.kv_cache_spec())
    assert l8.kv_dtype == "int8" and l8.scale_bytes == 4 and l32.scale_bytes == 0
    assert l8.block_bytes * 2 < l32.block_bytes  # int8 + scales vs fp32

    async def body() -> None:
        rx = Receiver(e8.remote.kv_cache, l8, ReceiverConfig(SECRET))
        endpoint = await rx.start()
        cfg = SenderConfig(SECRET)
        tx = Sender(e32.remote.kv_cache, l32, cfg, [TcpTransport(cfg.limits)])
        try:
            with pytest.raises(LayoutMismatchError, match="kv_dtype"):
                await tx.open("t", endpoint, [0], [1], time.monotonic() + 20)
        finally:
            await tx.close()
            await rx.close()

    asyncio.run(asyncio.wait_for(body(), 30))
