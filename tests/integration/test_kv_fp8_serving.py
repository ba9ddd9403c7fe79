"""fp8 KV end to end on real processes: an fp8 prefill worker pushes to an fp8 decode worker
through the router (every prompt's KV crosses the wire: ``--placement remote``) with the
tokens of one colocated fp8 engine, pushing half the bytes a float16 pair pushes for the same
prompt; a float16 decode worker's reservation is refused by the fp8 prefill worker (a typed
FAILED_PRECONDITION naming both dtypes), and no worker holds a KV block afterwards.

    router R8  --> P8 (fp8)  --push-->  D8 (fp8)
    router R16 --> P16 (f16) --push-->  D16 (f16)        D16 + P8: refused
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tandem.engine import SamplingParams
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc
from tandem.worker.convert import kv_layout
from tests.integration.sdk_cluster import wait_until, worker_idle, worker_stats
from tests.integration.served_model import engine_flags, start_all, tiny_served_model

BS = 16  # the workers' block size (the engine default)
OUT = 8
PROMPT = [5 + (i * 41) % 3000 for i in range(40)]  # three blocks of KV
FP8 = ("--kv-cache-dtype", "fp8")
F16 = ("--kv-cache-dtype", "float16")


@pytest.fixture(scope="module")
def model(tiny_dir: Callable[..., Path], smollm2_dir: Path) -> Path:
    return tiny_served_model(tiny_dir, smollm2_dir)


@pytest.fixture(scope="module")
def cluster(model: Path) -> Iterator[dict[str, Proc]]:
    c = Cluster()
    try:
        flags = engine_flags(model)
        d8, p8, d16, p16 = start_all(
            c, ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *flags, *FP8),
            ("tandem.worker.prefill", "--port", "0", *flags, *FP8),
            ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *flags, *F16),
            ("tandem.worker.prefill", "--port", "0", *flags, *F16))
        common = ["--port", "0", "--tokenizer", str(model), "--model-name", "tiny",
                  "--placement", "remote"]
        r8, r16 = start_all(
            c, ("tandem.router", *common, "--decode", d8.grpc, "--prefill", p8.grpc),
            ("tandem.router", *common, "--decode", d16.grpc, "--prefill", p16.grpc))
        yield {"r8": r8, "r16": r16, "d8": d8, "p8": p8, "d16": d16, "p16": p16}
    finally:
        c.stop()


def _greedy(n: int = OUT) -> tandem_pb2.SamplingParams:
    return tandem_pb2.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def _generate(router: Proc, prompt: list[int]) -> list[int]:
    request = tandem_pb2.GenerateRequest(token_ids=tandem_pb2.TokenIds(ids=prompt),
                                         sampling=_greedy())
    with grpc.insecure_channel(router.grpc) as channel:
        stub = tandem_pb2_grpc.TandemStub(channel)
        return [t for msg in stub.Generate(request, timeout=120) for t in msg.token_ids]


def _pushed(proc: Proc) -> int:
    return worker_stats(proc, "prefill").kv_transfer_bytes


def _all_idle(cluster: dict[str, Proc]) -> bool:
    return all(worker_idle(cluster[name], "decode" if name[0] == "d" else "prefill")
               for name in ("d8", "p8", "d16", "p16"))


def test_fp8_handoff_equals_colocated_fp8_at_half_the_bytes(cluster, model, make_engine) -> None:
    ref = make_engine(model=str(model), dtype="float32", num_blocks=128, kv_cache_dtype="fp8")
    rid = ref.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=OUT,
                                                 ignore_eos=True))
    want: list[int] = []
    while ref.has_unfinished():
        want += [t for o in ref.step() if o.request_id == rid for t in o.new_token_ids]

    before8, before16 = _pushed(cluster["p8"]), _pushed(cluster["p16"])
    assert _generate(cluster["r8"], PROMPT) == want
    _generate(cluster["r16"], PROMPT)
    pushed8 = _pushed(cluster["p8"]) - before8
    pushed16 = _pushed(cluster["p16"]) - before16
    layout = kv_layout(ref.remote.kv_cache_spec())  # the fp8 workers' layout
    blocks = -(-len(PROMPT) // BS)
    assert pushed8 == layout.num_layers * 2 * blocks * layout.block_bytes > 0
    assert pushed8 * 2 == pushed16
    wait_until(lambda: _all_idle(cluster))


def test_fp16_decode_refuses_fp8_prefill(cluster) -> None:
    dch, pch = cluster["d16"].channel(), cluster["p8"].channel()
    try:
        decode = worker_pb2_grpc.DecodeServiceStub(dch)
        prefill = worker_pb2_grpc.PrefillServiceStub(pch)
        tokens = list(range(100, 120))
        res = decode.Reserve(worker_pb2.ReserveRequest(
            request_id="mix", token_ids=tokens, sampling=_greedy(4), lease_s=30), timeout=30)
        assert res.layout.dtype == "float16"
        with pytest.raises(grpc.RpcError) as err:
            prefill.Prefill(worker_pb2.PrefillRequest(
                request_id="mix", token_ids=tokens, sampling=_greedy(4),
                transfer_id=res.transfer_id, block_ids=res.block_ids,
                skip_tokens=res.skip_tokens, kv_endpoint=res.kv_endpoint, layout=res.layout),
                timeout=60)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "float8_e4m3fn" in err.value.details() and "float16" in err.value.details()
        decode.Abort(worker_pb2.AbortRequest(request_id="mix"), timeout=30)
    finally:
        dch.close()
        pch.close()
    wait_until(lambda: _all_idle(cluster))
