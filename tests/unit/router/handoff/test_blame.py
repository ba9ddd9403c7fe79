"""The marking rule (tandem/router/handoff/blame.py) and what it does to a request: a slow call
or a prefill worker's report that its receiver failed never takes a worker out of the pool;
a decode leg lost before its first token moves to another decode worker."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tandem.placement.worker_view import Role
from tandem.protos.v1 import tandem_pb2
from tandem.router.errors import Fault, WorkerCallError
from tandem.router.handoff.blame import receiver_lost, slow, takes_out_of_pool
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import expected_output
from tests.unit.router.harness import Cluster, cluster

PROMPT = list(range(1000, 1040))


def _request(n: int = 6) -> tandem_pb2.GenerateRequest:
    return tandem_pb2.GenerateRequest(
        request_id="r1",
        token_ids=tandem_pb2.TokenIds(ids=PROMPT),
        sampling=tandem_pb2.SamplingParams(max_tokens=n, temperature=0.0),
    )


def _tokens(responses: list[tandem_pb2.GenerateResponse]) -> list[int]:
    return [t for r in responses for t in r.token_ids]


def _routable(c: Cluster, role: Role) -> set[str]:
    return {w.endpoint for w in c.router.registry.routable(role)}


def _error(code: str, fault: Fault = Fault.WORKER) -> WorkerCallError:
    return WorkerCallError("10.0.0.1:50061", "Reserve", code, "x", fault=fault)


@pytest.mark.parametrize(("err", "out"), [
    (_error("UNAVAILABLE"), True),  # the channel failed (refused, reset), or a drain said so
    (_error("DEADLINE_EXCEEDED", Fault.SLOW), False),  # the router's bound ran out: slow
    (_error("UNAVAILABLE", Fault.RECEIVER), False),  # the prefill worker's receiver died
    (_error("UNAVAILABLE", Fault.SLOW), False),
    (_error("DEADLINE_EXCEEDED"), False),  # the client's own deadline
    (_error("RESOURCE_EXHAUSTED"), False),
    (_error("INTERNAL"), False),
    (_error("ABORTED"), False),
    (_error("INVALID_ARGUMENT"), False),
])
def test_only_a_failed_channel_takes_a_worker_out(err: WorkerCallError, out: bool) -> None:
    assert takes_out_of_pool(err) is out
    assert receiver_lost(err) is (err.fault is Fault.RECEIVER)
    assert slow(err) is (err.fault is Fault.SLOW)


def test_receiver_death_before_the_first_token_migrates(tokenizer: RouterTokenizer) -> None:
    """The prefill worker says its push's receiver failed: the leg moves to the other decode
    worker with a fresh prefill (on the same prefill worker, which stays routable); the
    decode worker is excluded for the request, not marked down on hearsay."""
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            first = c.first_decode(len(PROMPT) + 6)
            c.prefill[0].receiver_dead = True
            responses = await c.generate(_request())
            assert _tokens(responses) == expected_output(PROMPT, 6)
            (moved,) = c.decode[1 - first].reservations  # the new leg, on the other worker
            rid = moved.removesuffix(".1")
            assert moved == f"{rid}.1" and list(c.decode[first].reservations) == [rid]
            assert c.prefill[0].calls == [rid, f"{rid}.1"]  # prefilled again, same worker
            assert c.decode[first].aborts == [rid]  # the dead leg's reservation dropped
            assert c.counters.migrations == 1 and c.counters.prefill_retries == 0
            assert c.counters.local_prefill_fallbacks == 0
            assert _routable(c, Role.PREFILL) == set(c.prefill_endpoints)
            assert _routable(c, Role.DECODE) == set(c.decode_endpoints)

    asyncio.run(scenario())


def test_receiver_death_without_a_spare_names_no_address(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            c.prefill[0].receiver_dead = True
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.generate(_request())
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            details = err.value.details() or ""
            assert "no healthy decode worker" in details and "KV push failed" in details
            assert "10.1.2.3" not in details and "127.0.0.1" not in details
            assert _routable(c, Role.PREFILL) == set(c.prefill_endpoints)

    asyncio.run(scenario())


def test_a_prefill_cut_by_its_receiver_leaving_migrates(tokenizer: RouterTokenizer) -> None:
    """The health monitor takes the decode worker out while the prefill worker pushes to it
    (dead or partitioned): the Prefill call is cut as its receiver's failure, and the leg
    moves; the prefill worker keeps serving."""
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            first = c.first_decode(len(PROMPT) + 6)
            c.prefill[0].hang = True
            request = asyncio.ensure_future(c.generate(_request()))
            await asyncio.wait_for(c.prefill[0].started.wait(), 10)
            c.prefill[0].hang = False  # the retry answers
            c.router.registry.set_healthy(c.decode_endpoints[first], False)  # as a probe does
            assert c.router.inflight.cancel(c.decode_endpoints[first], "probe failed") == 1
            assert _tokens(await request) == expected_output(PROMPT, 6)
            assert c.counters.migrations == 1
            rid = c.prefill[0].calls[0]
            assert c.prefill[0].aborts == [rid]  # the cut push is dropped
            assert c.prefill[0].calls == [rid, f"{rid}.1"]
            assert _routable(c, Role.PREFILL) == set(c.prefill_endpoints)

    asyncio.run(scenario())


def test_a_decode_worker_gone_at_renewal_moves_the_leg(tokenizer: RouterTokenizer) -> None:
    """A prefill worker fails on its own; the fresh reservation on the same decode worker is
    refused because that worker is going away: the leg moves to the other decode worker
    instead of failing the request."""
    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=2, n_decode=2) as c:
            first = c.first_decode(len(PROMPT) + 6)
            c.decode[first].reserve_limit = 1
            c.prefill[c.first_prefill()].fail = True
            assert _tokens(await c.generate(_request())) == expected_output(PROMPT, 6)
            assert c.counters.migrations == 1
            assert len(c.decode[1 - first].reservations) == 1
            # Both said UNAVAILABLE themselves: both are out until a probe passes.
            assert _routable(c, Role.DECODE) == {c.decode_endpoints[1 - first]}

    asyncio.run(scenario())


def test_a_slow_prefill_keeps_its_worker(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=2, prefill_timeout_s=0.5) as c:
            slow_one = c.first_prefill()
            c.prefill[slow_one].hang = True
            assert _tokens(await c.generate(_request())) == expected_output(PROMPT, 6)
            assert c.counters.prefill_retries == 1
            assert len(c.prefill[1 - slow_one].calls) == 1  # retried on the other one
            assert _routable(c, Role.PREFILL) == set(c.prefill_endpoints)

    asyncio.run(scenario())


def test_a_decode_worker_that_lost_the_leg_is_left_for_another(
    tokenizer: RouterTokenizer,
) -> None:
    """Decode answers NOT_FOUND (the worker dropped the leg unread at its attach lease, or
    restarted): the leg moves on, and the worker, which answered, stays in the pool."""
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            first = c.first_decode(len(PROMPT) + 6)
            c.decode[first].forgot = True
            assert _tokens(await c.generate(_request())) == expected_output(PROMPT, 6)
            assert c.counters.migrations == 1
            assert _routable(c, Role.DECODE) == set(c.decode_endpoints)

    asyncio.run(scenario())
