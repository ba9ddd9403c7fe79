"""The KV codec and striping flags end to end: a prefill and a decode worker started with
--kv-codec int8 --kv-stripes 2 (over TCP: --no-kv-shm) serve SmolLM2 through the router with
the tokens of one engine, their KV crossing the wire as int8 over two connections."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from tandem.engine import SamplingParams
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.integration.served_model import start_all

ENGINE = ["--model", "smollm2", "--dtype", "float32", "--quantization", "none", "--threads", "1",
          "--num-blocks", "64", "--no-kv-shm", "--kv-codec", "int8", "--kv-stripes", "2"]
PROMPT = "The lighthouse keeper climbed the stairs and"


@pytest.fixture(scope="module")
def cluster(smollm2_dir) -> Iterator[dict[str, Proc]]:
    c = Cluster()
    try:
        decode, prefill = start_all(
            c, ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *ENGINE),
            ("tandem.worker.prefill", "--port", "0", *ENGINE))
        router = c.start(
            "tandem.router", "--port", "0", "--tokenizer", str(smollm2_dir), "--model-name",
            "smollm2", "--prefill", prefill.grpc, "--decode", decode.grpc,
            "--placement", "remote")
        yield {"router": router, "prefill": prefill, "decode": decode}
    finally:
        c.stop()


def test_int8_codec_over_two_stripes_serves_the_engines_tokens(cluster, make_engine) -> None:
    ref = make_engine(model="smollm2", dtype="float32", quantization="none", num_blocks=64,
                      kv_cache_dtype="float16")
    rid = ref.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=12,
                                                 ignore_eos=True))
    want: list[int] = []
    while ref.has_unfinished():
        want += [t for o in ref.step() if o.request_id == rid for t in o.new_token_ids]
    ch = grpc.insecure_channel(cluster["router"].grpc)
    try:
        got: list[int] = []
        sampling = tandem_pb2.SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        for msg in tandem_pb2_grpc.TandemStub(ch).Generate(
                tandem_pb2.GenerateRequest(text=PROMPT, sampling=sampling), timeout=300):
            got += list(msg.token_ids)
    finally:
        ch.close()
    assert got == want
    dch = cluster["decode"].channel()
    try:
        st = worker_pb2_grpc.DecodeServiceStub(dch).Stats(worker_pb2.StatsRequest(), timeout=30)
    finally:
        dch.close()
    assert st.kv_transfer_bytes > 0  # it went disaggregated, over the wire
