"""Every worker call is bounded: the router's default deadlines when the client sets none,
a worker call that runs them out handled as a failed worker, and calls cut by the in-flight
tracker (what the health monitor does to a worker it cannot reach) migrating or failing the
request as UNAVAILABLE, never leaking a cancellation to the client."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tandem.placement.worker_view import Role
from tandem.protos.v1 import tandem_pb2
from tandem.router.handoff.legs import bound
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import expected_output
from tests.unit.router.harness import Cluster, cluster, until

PROMPT = list(range(1000, 1040))
# Short bounds, so a hung fake is given up on quickly; the fakes that answer do so in
# milliseconds, well inside them even on a loaded machine.
SHORT_S = 0.5
# gRPC sends a deadline as a coarse timeout header (rounded up): what a worker sees may be
# up to a second past the bound the router set.
WIRE_S = 1.5


def _request(n: int = 6) -> tandem_pb2.GenerateRequest:
    return tandem_pb2.GenerateRequest(
        request_id="r1",
        token_ids=tandem_pb2.TokenIds(ids=PROMPT),
        sampling=tandem_pb2.SamplingParams(max_tokens=n, temperature=0.0),
    )


def _tokens(responses: list[tandem_pb2.GenerateResponse]) -> list[int]:
    return [t for r in responses for t in r.token_ids]


def _rid(c: Cluster) -> str:
    minted = {i for d in c.decode for i in d.reservations if "." not in i}
    assert len(minted) == 1, minted
    return minted.pop()


def _idle(c: Cluster) -> bool:
    """Every admission slot given back (the handler has unwound)."""
    ledger = c.router.gate.ledger
    return ledger.running == 0 and ledger.waiting == 0


def test_bound_is_the_shorter_of_deadline_and_default() -> None:
    assert bound(None, 30.0) == (30.0, True)  # no client deadline: the router's
    assert bound(5.0, 30.0) == (5.0, False)  # the client's is sooner
    assert bound(60.0, 30.0) == (30.0, True)


def test_default_deadlines_apply_when_the_client_sets_none(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=1, n_prefill=1) as c:
            assert _tokens(await c.generate(_request())) == expected_output(PROMPT, 6)
            reserve = c.decode[0].timeouts["Reserve"][0]
            prefill = c.prefill[0].timeouts[0]
            # What the worker sees is the call's deadline, a little of it already spent.
            assert reserve is not None and 20.0 < reserve <= 30.0 + WIRE_S
            assert prefill is not None and 500.0 < prefill <= 600.0 + WIRE_S
            # A client deadline sooner than the defaults binds instead.
            await c.generate(_request(), timeout=20.0)
            assert 10.0 < (c.decode[0].timeouts["Reserve"][1] or 0.0) <= 20.0 + WIRE_S
            assert 10.0 < (c.prefill[0].timeouts[1] or 0.0) <= 20.0 + WIRE_S

    asyncio.run(scenario())


def test_local_prefill_gets_the_prefill_bound(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=0, prefill_timeout_s=120.0) as c:
            await c.generate(_request())
            left = c.decode[0].timeouts["PrefillLocal"][0]
            assert left is not None and 60.0 < left <= 120.0 + WIRE_S

    asyncio.run(scenario())


def test_a_hung_reserve_moves_to_the_next_decode_worker(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2, rpc_timeout_s=SHORT_S) as c:
            first = c.first_decode(len(PROMPT) + 6)
            c.decode[first].reserve_hang = True
            responses = await c.generate(_request())  # no client deadline
            assert _tokens(responses) == expected_output(PROMPT, 6)
            assert c.counters.reserve_retries == 1
            # A slow call is its request's failure: the worker stays in the pool (only the
            # health monitor's probes or a failed channel take it out) ...
            routable = {w.endpoint for w in c.router.registry.routable(Role.DECODE)}
            assert routable == set(c.decode_endpoints)
            # ... and is told to drop the reservation it may have made after the router
            # stopped waiting.
            (taken,) = c.decode[1 - first].reservations  # the second leg: ``rid.1``
            await until(lambda: bool(c.decode[first].aborts))
            assert c.decode[first].aborts == [taken.removesuffix(".1")]

    asyncio.run(scenario())


def test_a_hung_reserve_without_a_spare_is_unavailable(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, rpc_timeout_s=SHORT_S) as c:
            c.decode[0].reserve_hang = True
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.generate(_request())
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            await until(lambda: _idle(c))

    asyncio.run(scenario())


def test_a_hung_prefill_is_aborted_and_prefilled_locally(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, prefill_timeout_s=SHORT_S) as c:
            c.prefill[0].hang = True
            responses = await c.generate(_request())
            assert _tokens(responses) == expected_output(PROMPT, 6)
            rid = _rid(c)
            assert c.prefill[0].aborts == [rid]  # told to drop what it was doing
            assert c.decode[0].aborts == [rid]  # the reservation it may have half-filled
            assert c.decode[0].local_prefills == [f"{rid}.1"]
            assert c.counters.prefill_retries == 1 and c.counters.local_prefill_fallbacks == 1

    asyncio.run(scenario())


def test_a_cut_decode_stream_migrates(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            first = c.first_decode(len(PROMPT) + 10)
            c.decode[first].hang_after = 2
            call = c.stub.Generate(_request(n=10))
            got = list((await call.read()).token_ids)
            await asyncio.wait_for(c.decode[first].hanging.wait(), 10)
            endpoint = c.decode_endpoints[first]
            assert c.router.inflight.cancel(endpoint, "health check failed") == 1
            async for r in call:
                got.extend(r.token_ids)
            assert got == expected_output(PROMPT, 10)  # nothing lost or repeated
            assert c.counters.migrations == 1 and c.counters.completed == 1
            assert c.decode[first].aborts == [_rid(c)]
            c.decode[first].resume.set()

    asyncio.run(scenario())


def test_a_cut_stream_without_a_spare_fails_unavailable(tokenizer: RouterTokenizer) -> None:
    """The client sees UNAVAILABLE naming the cut, not CANCELLED; its slot is given back."""

    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            c.decode[0].hang_after = 1
            call = c.stub.Generate(_request(n=10))
            await call.read()
            await asyncio.wait_for(c.decode[0].hanging.wait(), 10)
            assert c.router.inflight.cancel(c.decode_endpoints[0], "probe failed") == 1
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in call:
                    pass
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert c.counters.failed == 1 and c.counters.cancelled == 0
            await until(lambda: _idle(c))
            assert c.decode[0].aborts == [_rid(c)]
            c.decode[0].resume.set()

    asyncio.run(scenario())


def test_a_cut_prefill_retries_on_another_prefill_worker(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=2) as c:
            first = c.first_prefill()
            c.prefill[first].hang = True
            request = asyncio.ensure_future(c.generate(_request()))
            await asyncio.wait_for(c.prefill[first].started.wait(), 10)
            assert c.router.inflight.cancel(c.prefill_endpoints[first], "probe failed") == 1
            assert _tokens(await request) == expected_output(PROMPT, 6)
            rid = _rid(c)
            assert c.prefill[1 - first].calls == [f"{rid}.1"]
            assert c.prefill[first].aborts == [rid]
            assert c.router.inflight.count(c.prefill_endpoints[first]) == 0

    asyncio.run(scenario())
