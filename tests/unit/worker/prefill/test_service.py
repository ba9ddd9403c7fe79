"""PrefillService in process: failed pushes report why and leave nothing held on either side."""

from __future__ import annotations

import asyncio
import socket
import threading

import grpc
import pytest

from tandem.common.wire import FAULT_KEY, RECEIVER_FAULT
from tandem.protos.v1 import worker_pb2
from tests.unit.worker.harness import cluster, greedy, idle, until

PROMPT = list(range(20, 60))


@pytest.fixture
def engines(tiny_dir, make_engine):
    path = str(tiny_dir("llama", 2))
    return (make_engine(model=path, num_blocks=32, block_size=16),
            make_engine(model=path, num_blocks=32, block_size=16))


async def _code(aw) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await aw
    return err.value.code(), err.value.details() or ""


async def _fault(aw) -> tuple[grpc.StatusCode, str | None]:
    """The failed call's code and its ``tandem-fault`` trailer (None: the worker's own)."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await aw
    trailers = dict(err.value.trailing_metadata() or ())
    return err.value.code(), trailers.get(FAULT_KEY)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_layout_mismatch_and_bad_requests(engines) -> None:
    async def main() -> None:
        async with cluster(*engines) as c:
            res = await c.reserve("r", PROMPT, greedy(4))
            bad = worker_pb2.ReserveResponse()
            bad.CopyFrom(res)
            bad.layout.num_kv_heads = 8
            bad.layout.fingerprint = "0123456789abcdef"
            code, why = await _code(c.prefill_into("r", PROMPT, greedy(4), bad))
            assert code == grpc.StatusCode.FAILED_PRECONDITION
            assert "num_kv_heads: 8 (decode) != 2 (prefill)" in why
            code, why = await _code(c.prefill_into("r", PROMPT + [1] * 20, greedy(4), res))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and why.startswith("block_ids:")
            code, why = await _code(c.prefill_into("r", PROMPT, greedy(0), res))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and why.startswith("max_tokens:")
            bad.CopyFrom(res)
            bad.kv_endpoint = "host|nonsense"
            code, why = await _code(c.prefill_into("r", PROMPT, greedy(4), bad))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and why.startswith("kv_endpoint:")
            assert (await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id="r"))).found

    asyncio.run(main())


def test_unreachable_decode_worker_is_unavailable(engines) -> None:
    async def main() -> None:
        async with cluster(*engines) as c:
            res = await c.reserve("r", PROMPT, greedy(4))
            gone = worker_pb2.ReserveResponse()
            gone.CopyFrom(res)
            gone.kv_endpoint = f"127.0.0.1:{_closed_port()}"
            code, why = await _code(c.prefill_into("r", PROMPT, greedy(4), gone))
            assert code == grpc.StatusCode.UNAVAILABLE and "KV push failed" in why
            # The receiver's failure, said as such: the router moves the leg, keeps this worker.
            assert await _fault(c.prefill_into("r", PROMPT, greedy(4), gone)) == (
                grpc.StatusCode.UNAVAILABLE, RECEIVER_FAULT)
            await until(c.prefill_stats, idle)
            # The decode side still holds its reservation; its owner (the router) aborts it.
            assert (await c.decode_stats()).num_reserved == 1
            await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id="r"))

    asyncio.run(main())


def test_released_reservation_aborts_the_push(engines) -> None:
    """The decode worker ended the reservation (aborted there, drained, its lease over): the
    push fails as its receiver's failure, not this worker's."""
    async def main() -> None:
        async with cluster(*engines) as c:
            res = await c.reserve("r", PROMPT, greedy(4))
            await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id="r"))
            code, why = await _code(c.prefill_into("r", PROMPT, greedy(4), res))
            assert code == grpc.StatusCode.UNAVAILABLE and "at the decode worker" in why
            assert await _fault(c.prefill_into("r", PROMPT, greedy(4), res)) == (
                grpc.StatusCode.UNAVAILABLE, RECEIVER_FAULT)

    asyncio.run(main())


def test_abort_rpc_during_a_stuck_push(engines) -> None:
    async def main() -> None:
        # A peer that accepts the connection and never answers the handshake.
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with cluster(*engines, connect_timeout_s=1.0) as c:
            res = await c.reserve("r", PROMPT, greedy(4))
            stuck = worker_pb2.ReserveResponse()
            stuck.CopyFrom(res)
            stuck.kv_endpoint = f"127.0.0.1:{port}"
            call = asyncio.ensure_future(c.prefill_into("r", PROMPT, greedy(4), stuck))
            await until(c.prefill_stats, lambda s: s.num_reserved == 1)  # prefilled, pushing
            assert (await c.prefill_stub.Abort(worker_pb2.AbortRequest(request_id="r"))).found
            code, fault = await _fault(call)
            assert code == grpc.StatusCode.ABORTED and fault is None  # its own: aborted
            await c.decode_stub.Abort(worker_pb2.AbortRequest(request_id="r"))
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_the_reply_does_not_wait_for_the_engine_to_free_the_blocks(engines) -> None:
    """After the commit, the Prefill replies at once; the held blocks are freed on the
    engine thread between steps. Here freeing them is held up (as a long prefill step of the
    next prompt would hold it): the reply and the whole decode still come, the worker counts
    as busy until the blocks are freed, and then nothing is held."""
    decode_engine, prefill_engine = engines
    release = threading.Event()
    side = prefill_engine.remote.prefill
    real_release = side.release

    def slow_release(request_id: str):  # engine thread
        release.wait(30)
        return real_release(request_id)

    side.release = slow_release

    async def main() -> None:
        try:
            async with cluster(*engines) as c:
                res = await c.reserve("r", PROMPT, greedy(4))
                first = await asyncio.wait_for(c.prefill_into("r", PROMPT, greedy(4), res), 10)
                msgs = await c.decode_all("r")
                assert 1 + sum(len(m.token_ids) for m in msgs) == 4 and msgs[-1].finished
                assert first.first_token >= 0
                assert c.prefill.busy()  # its blocks are not free yet
                release.set()
                await asyncio.wait_for(c.prefill.wait_idle(), 10)
                assert idle(await c.prefill_stats())
        finally:
            release.set()
            del side.release

    asyncio.run(main())
