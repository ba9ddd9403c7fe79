"""Reserve -> Prefill -> Decode through both services in one process (real engines, real
kv_transfer over TCP loopback): the tokens equal one engine's greedy output."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tandem.protos.v1 import tandem_pb2, worker_pb2
from tests.unit.worker.harness import cluster, greedy, reference

PROMPT = [5 + (i * 37) % 240 for i in range(41)]  # three blocks of 16, the last one partial


@pytest.fixture
def engines(tiny_dir, make_engine):
    path = str(tiny_dir("llama", 2))
    return (make_engine(model=path, num_blocks=64, block_size=16),
            make_engine(model=path, num_blocks=64, block_size=16),
            make_engine(model=path, num_blocks=64, block_size=16))


def test_disaggregated_equals_colocated(engines) -> None:
    decode_engine, prefill_engine, ref_engine = engines
    want = reference(ref_engine, PROMPT, 12)
    want_shared = reference(ref_engine, PROMPT[:32] + [7, 8, 9], 12)

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine) as c:
            res = await c.reserve("r1", PROMPT, greedy(12))
            assert len(res.block_ids) == 3 and res.layout.fingerprint
            first = await c.prefill_into("r1", PROMPT, greedy(12), res)
            msgs = await c.decode_all("r1")
            tokens = [first.first_token] + [t for m in msgs for t in m.token_ids]
            assert tokens == want
            last = msgs[-1]
            assert last.finished and last.finish_reason == "length"
            assert (last.usage.prompt_tokens, last.usage.completion_tokens) == (41, 12)
            assert not any(m.finished for m in msgs[:-1])
            assert first.prefill_s > 0 and first.transfer_s > 0

            # A prompt sharing two full blocks reuses them on the prefill worker.
            shared = PROMPT[:32] + [7, 8, 9]
            res = await c.reserve("r2", shared, greedy(12))
            first = await c.prefill_into("r2", shared, greedy(12), res)
            assert first.cached_tokens == 32
            msgs = await c.decode_all("r2")
            assert [first.first_token] + [t for m in msgs for t in m.token_ids] == want_shared

    asyncio.run(main())


def test_logprobs_and_max_tokens_one(engines) -> None:
    decode_engine, prefill_engine, _ = engines
    lp = tandem_pb2.LogprobOptions(enabled=True, top_logprobs=2)

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine) as c:
            res = await c.decode_stub.Reserve(worker_pb2.ReserveRequest(
                request_id="one", token_ids=PROMPT, sampling=greedy(1), logprobs=lp))
            first = await c.prefill_stub.Prefill(worker_pb2.PrefillRequest(
                request_id="one", token_ids=PROMPT, sampling=greedy(1), logprobs=lp,
                transfer_id=res.transfer_id, block_ids=res.block_ids, skip_tokens=res.skip_tokens,
                kv_endpoint=res.kv_endpoint, layout=res.layout))
            assert first.logprob < 0 and len(first.first_logprob.top) == 2
            assert first.first_logprob.token_id == first.first_token
            msgs = await c.decode_all("one")  # only the final message: the first was the last
            assert len(msgs) == 1 and not msgs[0].token_ids
            assert msgs[0].finished and msgs[0].usage.completion_tokens == 1

            res = await c.decode_stub.Reserve(worker_pb2.ReserveRequest(
                request_id="lp", token_ids=PROMPT, sampling=greedy(4), logprobs=lp))
            await c.prefill_stub.Prefill(worker_pb2.PrefillRequest(
                request_id="lp", token_ids=PROMPT, sampling=greedy(4), logprobs=lp,
                transfer_id=res.transfer_id, block_ids=res.block_ids, skip_tokens=res.skip_tokens,
                kv_endpoint=res.kv_endpoint, layout=res.layout))
            msgs = await c.decode_all("lp")
            assert [len(m.logprobs) for m in msgs] == [1, 1, 1]
            assert all(len(m.logprobs[0].top) == 2 for m in msgs)

    asyncio.run(main())


def test_prefill_local_fallback(engines) -> None:
    decode_engine, prefill_engine, ref_engine = engines
    want = reference(ref_engine, PROMPT, 10)

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine) as c:
            await c.reserve("loc", PROMPT, greedy(10))
            first = await c.decode_stub.PrefillLocal(worker_pb2.PrefillLocalRequest(
                request_id="loc"))
            msgs = await c.decode_all("loc")
            assert [first.first_token] + [t for m in msgs for t in m.token_ids] == want
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.decode_stub.PrefillLocal(worker_pb2.PrefillLocalRequest(
                    request_id="loc"))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND

    asyncio.run(main())
