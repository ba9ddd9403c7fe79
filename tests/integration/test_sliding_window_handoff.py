"""A sliding-window model through real prefill and decode worker processes: the decode
worker reserves only the blocks its first decoded token's window reads, the prefill worker
(whose chunked prefill frees the blocks behind its window) pushes only those (its byte count
says so), the streamed output equals one engine's, and every block is back in both pools
afterwards.

Mistral with a window of 12 over every layer, blocks of 4, weights away from transformers'
initialisation (tests/unit/engine/_perturbed.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tandem.engine.sampling_params import SamplingParams
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc
from tests.integration.sdk_cluster import wait_until, worker_idle, worker_stats
from tests.integration.served_model import start_workers
from tests.unit.engine._perturbed import perturbed_checkpoint
from tests.unit.engine._reference import engine_token_ids

WINDOW, BLOCK, NEW = 12, 4, 12


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return perturbed_checkpoint(tmp_path_factory.mktemp("mistral-swa"), "mistral",
                                sliding_window=WINDOW)


@pytest.fixture(scope="module")
def workers(mistral: Path) -> Iterator[tuple[Proc, Proc]]:
    cluster = Cluster()
    try:
        # chunks of 8: the prefill worker frees behind its window while it computes a prompt
        yield start_workers(cluster, mistral, "--block-size", str(BLOCK),
                            "--kv-cache-dtype", "float32", "--max-num-batched-tokens", "8")
    finally:
        cluster.stop()


def _greedy() -> tandem_pb2.SamplingParams:
    return tandem_pb2.SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("length", [10, 45])
def test_the_push_ships_only_the_window(workers: tuple[Proc, Proc], mistral: Path,
                                        make_engine, length: int) -> None:
    decode, prefill = workers
    prompt = [3 + (i * 37 + length) % 250 for i in range(length)]  # no shared prefix
    engine = make_engine(model=str(mistral), num_blocks=64, block_size=BLOCK)
    want = engine_token_ids(engine, [prompt], SamplingParams(temperature=0.0, max_tokens=NEW,
                                                             ignore_eos=True))[0]

    rid = f"swa-{length}"
    blocks = -(-length // BLOCK)
    skip = max(0, length - WINDOW + 1) // BLOCK  # before the window of position ``length``
    before = worker_stats(prefill, "prefill").kv_transfer_bytes
    with decode.channel() as d_ch, prefill.channel() as p_ch:
        d_stub = worker_pb2_grpc.DecodeServiceStub(d_ch)
        res = d_stub.Reserve(worker_pb2.ReserveRequest(
            request_id=rid, token_ids=prompt, sampling=_greedy(), lease_s=60), timeout=60)
        assert (res.cached_tokens, res.skip_tokens) == (0, skip * BLOCK)
        assert len(res.block_ids) == blocks - skip
        first = worker_pb2_grpc.PrefillServiceStub(p_ch).Prefill(worker_pb2.PrefillRequest(
            request_id=rid, token_ids=prompt, sampling=_greedy(), transfer_id=res.transfer_id,
            block_ids=res.block_ids, skip_tokens=res.skip_tokens, kv_endpoint=res.kv_endpoint,
            layout=res.layout), timeout=120)
        msgs = list(d_stub.Decode(worker_pb2.DecodeRequest(request_id=rid), timeout=120))
    assert [first.first_token] + [t for m in msgs for t in m.token_ids] == want
    assert msgs[-1].finished
    # K and V of every layer, float32, for the pushed blocks only
    lo = res.layout
    per_block = 2 * lo.num_layers * lo.num_kv_heads * lo.head_dim * 4 * BLOCK
    assert lo.bytes_per_token in (0, per_block // BLOCK)
    pushed = worker_stats(prefill, "prefill").kv_transfer_bytes - before
    assert pushed == (blocks - skip) * per_block
    wait_until(lambda: worker_idle(decode, "decode") and worker_idle(prefill, "prefill"))
