"""The handoff end to end against fake workers: success, fallbacks, migration, cancel, overload."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tandem.common.wire import BUSY_KEY, GRAMMAR_BUSY, RETRY_AFTER_KEY
from tandem.protos.v1 import tandem_pb2
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import expected_output
from tests.unit.router.harness import Cluster, cluster

PROMPT = list(range(1000, 1040))  # 40 tokens: 2 full blocks of 16
# A client deadline long enough that reserve and prefill finish well before it on a loaded
# machine; the deadline test still waits for the decode leg to open before it may pass.
DEADLINE_S = 2.0


def _request(n: int = 6, prompt: list[int] | None = None) -> tandem_pb2.GenerateRequest:
    return tandem_pb2.GenerateRequest(
        request_id="r1",
        token_ids=tandem_pb2.TokenIds(ids=prompt or PROMPT),
        sampling=tandem_pb2.SamplingParams(max_tokens=n, temperature=0.0),
    )


def _tokens(responses: list[tandem_pb2.GenerateResponse]) -> list[int]:
    return [t for r in responses for t in r.token_ids]


def _check_complete(c: Cluster, responses: list, n: int, tok: RouterTokenizer) -> None:
    assert _tokens(responses) == expected_output(PROMPT, n)
    assert len(responses[0].token_ids) == 1  # the first token alone, straight from prefill
    last = responses[-1]
    assert last.finished and last.finish_reason == "length"
    assert last.usage.prompt_tokens == len(PROMPT) and last.usage.completion_tokens == n
    assert "".join(r.text for r in responses) == tok.decode(expected_output(PROMPT, n))
    assert last.timings.total_s >= last.timings.first_token_s > 0
    assert all(r.request_id == "r1" for r in responses)  # the client's id, echoed


def _rid(c: Cluster) -> str:
    """The id the router minted for the test's one request: its first leg's id, the base
    of every later leg's (``rid.1`` ...); never the client's own "r1"."""
    minted = {i for d in c.decode for i in d.reservations if "." not in i}
    assert len(minted) == 1 and "r1" not in minted, minted
    return minted.pop()




def test_success_disaggregated(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            responses = await c.generate(_request())
            _check_complete(c, responses, 6, tokenizer)
            assert responses[-1].usage.cached_tokens == 16
            rid = _rid(c)
            assert c.prefill[0].calls == [rid] and not c.decode[0].local_prefills
            assert c.counters.completed == 1 and c.counters.migrations == 0

    asyncio.run(scenario())


def test_prefill_failure_falls_back_to_another_prefill(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=2) as c:
            first = c.first_prefill()
            c.prefill[first].fail = True  # the one the policy tries first
            _check_complete(c, await c.generate(_request()), 6, tokenizer)
            assert c.counters.prefill_retries == 1
            assert c.counters.local_prefill_fallbacks == 0
            rid = _rid(c)
            assert c.prefill[first].calls == [rid] and c.prefill[first].aborts == [rid]
            assert c.prefill[1 - first].calls == [f"{rid}.1"]
            assert c.decode[0].aborts == [rid]  # the half-filled reservation was dropped

    asyncio.run(scenario())


def test_all_prefills_fail_then_local_prefill(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=2) as c:
            first = c.first_prefill()  # tried first, on the first reservation
            for p in c.prefill:
                p.fail = True
            _check_complete(c, await c.generate(_request()), 6, tokenizer)
            assert c.counters.prefill_retries == 2
            assert c.counters.local_prefill_fallbacks == 1
            rid = _rid(c)
            assert c.decode[0].local_prefills == [f"{rid}.2"]  # a fresh reservation per attempt
            assert c.decode[0].aborts == [rid, f"{rid}.1"]
            assert c.prefill[first].aborts == [rid] and c.prefill[1 - first].aborts == [f"{rid}.1"]

    asyncio.run(scenario())


def test_no_prefill_workers_is_colocated(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=0) as c:
            _check_complete(c, await c.generate(_request()), 6, tokenizer)
            assert c.counters.local_prefill_colocated == 1

    asyncio.run(scenario())


def test_short_prompt_prefills_on_decode_worker(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, local_prefill_threshold=64) as c:
            _check_complete(c, await c.generate(_request()), 6, tokenizer)
            assert c.counters.local_prefill_short == 1 and not c.prefill[0].calls

    asyncio.run(scenario())


def test_decode_gone_during_local_prefill_migrates(tokenizer: RouterTokenizer) -> None:
    """A decode worker that goes away while it prefills the prompt locally (a drain with no
    grace, a crash) loses the leg as a dying decode stream does: the request moves to
    another decode worker, not fails (tests/integration/test_ray_up.py's drain met this)."""
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2, local_prefill_threshold=64) as c:
            first = c.first_decode(len(PROMPT) + 6)
            c.decode[first].local_prefill_dies = True
            _check_complete(c, await c.generate(_request()), 6, tokenizer)
            assert c.counters.migrations == 1
            assert len(c.decode[first].local_prefills) == 1
            assert len(c.decode[1 - first].local_prefills) == 1

    asyncio.run(scenario())


def test_decode_death_migrates_without_loss_or_repeat(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            # The harness waited for every worker's Stats, so the ranking asked now is the one
            # the request meets: the worker it picks is the one that dies.
            first = c.first_decode(len(PROMPT) + 10)
            c.decode[first].die_after = 3
            responses = await c.generate(_request(n=10))
            _check_complete(c, responses, 10, tokenizer)
            assert c.counters.migrations == 1
            rid = _rid(c)
            moved = c.decode[1 - first].reservations[f"{rid}.1"]
            assert moved.token_ids == PROMPT + expected_output(PROMPT, 10)[:4]
            # The new leg knows the request's own budget and how much of it is spent.
            assert moved.sampling.max_tokens == 10 and moved.prior == 4
            assert c.decode[first].aborts == [rid]

    asyncio.run(scenario())


def test_client_cancel_mid_prefill_aborts_both_legs(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            c.prefill[0].hang = True
            call = c.stub.Generate(_request())
            reader = asyncio.ensure_future(call.read())
            await asyncio.wait_for(c.prefill[0].started.wait(), 10)
            call.cancel()
            await asyncio.wait_for(c.prefill[0].aborted.wait(), 10)
            await asyncio.wait_for(c.decode[0].aborted.wait(), 10)
            rid = _rid(c)
            assert c.prefill[0].aborts == [rid] and c.decode[0].aborts == [rid]
            with pytest.raises(asyncio.CancelledError):
                await reader

    asyncio.run(scenario())


def test_client_cancel_mid_decode_aborts_decode(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            c.decode[0].hang_after = 2
            call = c.stub.Generate(_request())
            for _ in range(3):
                await call.read()
            await asyncio.wait_for(c.decode[0].hanging.wait(), 10)
            call.cancel()
            await asyncio.wait_for(c.decode[0].aborted.wait(), 10)
            rid = _rid(c)
            assert c.decode[0].aborts == [rid]

    asyncio.run(scenario())


def test_deadline_propagates_and_aborts(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            c.decode[0].hang_after = 0
            call = c.stub.Generate(_request(), timeout=DEADLINE_S)
            # Both legs are open (the decode stream hangs) before the deadline passes.
            await asyncio.wait_for(c.decode[0].hanging.wait(), DEADLINE_S)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in call:
                    pass
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await asyncio.wait_for(c.decode[0].aborted.wait(), 10)

    asyncio.run(scenario())


def test_overload_is_resource_exhausted_with_retry_info(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, max_inflight=1, max_queue=0) as c:
            c.decode[0].hang_after = 0
            busy = c.stub.Generate(_request())
            await busy.read()  # admitted: holds the only slot
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.generate(_request())
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            trailing = dict(err.value.trailing_metadata() or ())
            assert int(trailing[RETRY_AFTER_KEY]) > 0
            busy.cancel()

    asyncio.run(scenario())


def test_full_decode_workers_are_resource_exhausted(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            for d, hint in zip(c.decode, (900, 400), strict=True):
                d.exhausted, d.retry_hint_ms = True, hint
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.generate(_request())
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # The client is told to come back when the soonest full worker expects room.
            assert dict(err.value.trailing_metadata() or ())[RETRY_AFTER_KEY] == "400"
            assert c.counters.reserve_retries == 1
            assert BUSY_KEY not in dict(err.value.trailing_metadata() or ())
            assert "every decode worker is full" in (err.value.details() or "")
            c.decode[1].exhausted = False  # and the router keeps serving
            _check_complete(c, await c.generate(_request()), 6, tokenizer)

    asyncio.run(scenario())


@pytest.mark.parametrize("others_full", [False, True])
def test_a_grammar_still_compiling_is_the_reason_given(tokenizer: RouterTokenizer,
                                                       others_full: bool) -> None:
    """A decode worker that is busy compiling the request's grammar says so in a trailer; the
    client is told that, not that every worker is full (RESOURCE_EXHAUSTED and the retry
    hint stay), whether or not the other worker was full."""
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            compiling, other = c.decode
            compiling.exhausted, compiling.retry_hint_ms = True, 1000
            compiling.busy = GRAMMAR_BUSY
            other.exhausted, other.retry_hint_ms = True, 600
            if not others_full:
                other.busy = GRAMMAR_BUSY
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.generate(_request())
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            trailers = dict(err.value.trailing_metadata() or ())
            assert trailers[RETRY_AFTER_KEY] == "600" and trailers[BUSY_KEY] == GRAMMAR_BUSY
            assert "grammar is still compiling" in (err.value.details() or "")
            assert all(d.reservations == {} for d in c.decode)  # neither worker took it
            compiling.exhausted = other.exhausted = False  # compiled: served
            _check_complete(c, await c.generate(_request()), 6, tokenizer)

    asyncio.run(scenario())


def test_worker_text_is_used_without_repeating_the_first_token(
    tokenizer: RouterTokenizer,
) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            marked = {}

            def text_of(ids: list[int]) -> str:
                marked[len(ids)] = True
                return tokenizer.decode(ids)

            for d in c.decode:
                d.text_of = text_of
            first = c.first_decode(len(PROMPT) + 8)
            c.decode[first].die_after = 2  # and across a migration
            responses = await c.generate(_request(n=8))
            out = expected_output(PROMPT, 8)
            assert _tokens(responses) == out and marked
            assert c.counters.migrations == 1
            assert "".join(r.text for r in responses) == tokenizer.decode(out)
            assert responses[0].text == tokenizer.decode(out[:1])

    asyncio.run(scenario())


def test_decode_death_without_a_spare_is_unavailable(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            c.decode[0].die_after = 2
            call = c.stub.Generate(_request(n=10))
            got = []
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for r in call:
                    got.extend(r.token_ids)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert got == expected_output(PROMPT, 10)[:3]  # what was sent stays valid
            assert c.counters.failed == 1 and c.counters.migrations == 1

    asyncio.run(scenario())


def test_migrations_are_bounded(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=3, max_migrations=1) as c:
            for d in c.decode:
                d.die_after = 1
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.generate(_request(n=10))
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "gave up after 1 migrations" in (err.value.details() or "")
            assert sum(len(d.reservations) for d in c.decode) == 2

    asyncio.run(scenario())
