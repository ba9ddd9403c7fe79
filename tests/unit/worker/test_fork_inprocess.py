"""A forked request (n sequences) through both services in one process: one Reserve, one
push of the prompt, one COMMIT with n first tokens, a Decode stream per sequence; each
sequence equals a single request seeded seed + j. Colocated (PrefillLocal) alike; Abort of
one sequence leaves the others running."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tandem.engine.core.request import sequence_id
from tandem.engine.sampling_params import SamplingParams
from tandem.protos.v1 import tandem_pb2, worker_pb2
from tests.unit.worker.harness import cluster

PROMPT = [5 + (i * 37) % 240 for i in range(41)]  # three blocks of 16, the last one partial
SEED = 7


def _sampled(max_tokens: int) -> tandem_pb2.SamplingParams:
    return tandem_pb2.SamplingParams(max_tokens=max_tokens, temperature=1.0, top_k=30,
                                     seed=SEED, ignore_eos=True)


def _seeded_singles(engine, prompt: list[int], max_tokens: int, n: int) -> list[list[int]]:
    """What n single requests seeded SEED, SEED + 1, ... generate (the fork's contract)."""
    for j in range(n):
        engine.add_request(prompt, SamplingParams(temperature=1.0, top_k=30, seed=SEED + j,
                                                  max_tokens=max_tokens, ignore_eos=True),
                           request_id=f"single{j}")
    got: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
    return [got[f"single{j}"] for j in range(n)]


@pytest.fixture
def engines(tiny_dir, make_engine):
    path = str(tiny_dir("llama", 2))
    return (make_engine(model=path, num_blocks=64, block_size=16),
            make_engine(model=path, num_blocks=64, block_size=16),
            make_engine(model=path, num_blocks=64, block_size=16))


async def _streams(c, rid: str, n: int) -> list[list[tandem_pb2.GenerateResponse]]:
    async def one(j: int) -> list[tandem_pb2.GenerateResponse]:
        return [m async for m in c.decode_stub.Decode(
            worker_pb2.DecodeRequest(request_id=rid, index=j))]
    return list(await asyncio.gather(*(one(j) for j in range(n))))


def test_forked_request_pushes_the_prompt_once(engines) -> None:
    decode_engine, prefill_engine, ref_engine = engines
    want = _seeded_singles(ref_engine, PROMPT, 10, 4)
    lp = tandem_pb2.LogprobOptions(enabled=True)

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine) as c:
            res = await c.decode_stub.Reserve(worker_pb2.ReserveRequest(
                request_id="f", token_ids=PROMPT, sampling=_sampled(10), logprobs=lp,
                lease_s=10, n=4))
            assert len(res.block_ids) == 3  # the prompt's blocks, once
            first = await c.prefill_stub.Prefill(worker_pb2.PrefillRequest(
                request_id="f", token_ids=PROMPT, sampling=_sampled(10), logprobs=lp,
                transfer_id=res.transfer_id, block_ids=res.block_ids,
                skip_tokens=res.skip_tokens, kv_endpoint=res.kv_endpoint, layout=res.layout,
                n=4))
            assert [t.token_id for t in first.first_tokens][0] == first.first_token
            assert len(first.first_tokens) == 4 and all(t.logprob < 0 for t in first.first_tokens)
            streams = await _streams(c, "f", 4)
            for j, msgs in enumerate(streams):
                assert all(m.index == j for m in msgs) and msgs[-1].finished
                tokens = [first.first_tokens[j].token_id] + [t for m in msgs for t in m.token_ids]
                assert tokens == want[j], j
                assert msgs[-1].usage.completion_tokens == 10
            layout = c.sender.layout
            one_push = layout.payload_bytes(layout.num_layers, 3)
            assert (await c.prefill_stats()).kv_transfer_bytes == one_push
            assert (await c.decode_stats()).kv_transfer_bytes == one_push

    asyncio.run(main())


def test_forked_reservation_prefilled_locally(engines) -> None:
    decode_engine, prefill_engine, ref_engine = engines
    want = _seeded_singles(ref_engine, PROMPT, 8, 3)

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine) as c:
            await c.decode_stub.Reserve(worker_pb2.ReserveRequest(
                request_id="loc", token_ids=PROMPT, sampling=_sampled(8), lease_s=10, n=3))
            first = await c.decode_stub.PrefillLocal(worker_pb2.PrefillLocalRequest(
                request_id="loc"))
            assert len(first.first_tokens) == 3
            streams = await _streams(c, "loc", 3)
            got = [[first.first_tokens[j].token_id] + [t for m in msgs for t in m.token_ids]
                   for j, msgs in enumerate(streams)]
            assert got == want

    asyncio.run(main())


def test_abort_of_one_sequence_and_of_the_rest(engines) -> None:
    decode_engine, prefill_engine, _ = engines

    async def main() -> None:
        async with cluster(decode_engine, prefill_engine) as c:
            await c.decode_stub.Reserve(worker_pb2.ReserveRequest(
                request_id="a", token_ids=PROMPT, sampling=_sampled(500), lease_s=10, n=3))
            with pytest.raises(grpc.aio.AioRpcError) as err:  # '#' names forked sequences
                await c.decode_stub.Reserve(worker_pb2.ReserveRequest(
                    request_id="a#1", token_ids=PROMPT, sampling=_sampled(5), lease_s=10))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            await c.decode_stub.PrefillLocal(worker_pb2.PrefillLocalRequest(request_id="a"))
            assert decode_engine.kv.holds(sequence_id("a", 1))
            found = await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id="a", index=1))
            assert found.found
            with pytest.raises(grpc.aio.AioRpcError) as err:  # unread, so forgotten at once
                await anext(aiter(c.decode_stub.Decode(
                    worker_pb2.DecodeRequest(request_id="a", index=1))))
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert not decode_engine.kv.holds(sequence_id("a", 1))
            assert decode_engine.kv.holds("a") and decode_engine.kv.holds(sequence_id("a", 2))
            stream0 = aiter(c.decode_stub.Decode(worker_pb2.DecodeRequest(request_id="a")))
            assert (await anext(stream0)).token_ids  # sequence 0 goes on
            assert (await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id="a"))).found
            rest = [m async for m in stream0]  # its reader is told: the last message says abort
            assert rest[-1].finished and rest[-1].finish_reason == "abort"
            assert not (await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id="a"))).found

    asyncio.run(main())
