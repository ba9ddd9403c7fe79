"""Live moves through the router against fake decode workers (tests/unit/router/fakes.py):
RouterAdmin.MoveStreams moves a stream held mid-way to the other decode worker and the
client's stream equals the undisturbed one, with its pre-copy (the full blocks first, the
stream's stop-and-copy reserved on the same target, the pre-copy freed after) or without; a
failed push, a failed pre-copy (never suspended), or no other decode worker, leaves it where
it is; a stream that ends, or whose client leaves, during its pre-copy frees it; the admin service answers cluster
members only; and the ticket book."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tandem.placement.worker_view import Role
from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc
from tandem.router.handoff.live_moves import LiveStreams, MoveCause, MoveOutcome
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import expected_output
from tests.unit.router.harness import Cluster, cluster, until

PROMPT = list(range(1000, 1040))
N = 10


def _request() -> tandem_pb2.GenerateRequest:
    return tandem_pb2.GenerateRequest(
        request_id="r1", token_ids=tandem_pb2.TokenIds(ids=PROMPT),
        sampling=tandem_pb2.SamplingParams(max_tokens=N, temperature=0.0))


async def _move_while_held(c: Cluster, source: int) -> tuple[list, worker_pb2.MovedStreams]:
    """A request whose stream on decode ``source`` holds after 3 tokens, moved meanwhile."""
    c.decode[source].hang_after = 3
    task = asyncio.create_task(c.generate(_request()))
    await asyncio.wait_for(c.decode[source].hanging.wait(), 10)
    admin = worker_pb2_grpc.RouterAdminStub(c.channel)
    reply = await admin.MoveStreams(
        worker_pb2.MoveStreamsRequest(worker=c.decode_endpoints[source]), timeout=10)
    return await asyncio.wait_for(task, 10), reply


def test_moved_stream_equals_undisturbed(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2, live_move_precopy_blocks=0) as c:
            source = c.first_decode(len(PROMPT) + N)
            target = 1 - source
            responses, reply = await _move_while_held(c, source)
            assert (reply.moved, reply.stayed) == (1, 0)
            assert [t for r in responses for t in r.token_ids] == expected_output(PROMPT, N)
            assert responses[-1].finish_reason == "length"
            (moved,) = c.decode[source].moves_out
            (leg,) = c.decode[target].reservations.values()
            # The target reserved the tokens so far but the last, which the move commits.
            sent = expected_output(PROMPT, N)[: leg.prior + 1]
            assert leg.moved_in and leg.token_ids == PROMPT + sent[:-1]
            assert moved.last_token == sent[-1] and moved.transfer_id == leg.request_id
            assert not c.decode[source].aborts  # it freed the request itself
            counters = c.router.deps.counters
            assert counters.live_moves[("operator", "moved")] == 1
            assert counters.moved_bytes == 4096 * 2 and sum(counters.move_gap.counts) == 1
            assert counters.migrations == 0  # nothing was prefilled again
            assert counters.precopy_bytes == 0 and not c.decode[source].precopies

    asyncio.run(scenario())


def test_precopy_then_the_tail_to_the_same_target(tokenizer: RouterTokenizer) -> None:
    """The stream's full blocks (those of its 4 tokens and 40-token prompt but the last:
    two blocks of 16) are pre-copied to a pre-copy reservation before the Suspend; the move's
    own reservation goes to that target, and the pre-copy's leg is aborted there after."""
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            source = c.first_decode(len(PROMPT) + N)
            target = c.decode[1 - source]
            responses, reply = await _move_while_held(c, source)
            assert (reply.moved, reply.stayed) == (1, 0)
            want = expected_output(PROMPT, N)
            assert [t for r in responses for t in r.token_ids] == want
            (pre,) = c.decode[source].precopies
            assert list(pre.token_ids) == (PROMPT + want)[:32]
            pre_leg, move_leg = target.reservations.values()  # in the order reserved
            assert pre_leg.precopy and not pre_leg.moved_in
            assert pre_leg.token_ids == list(pre.token_ids)
            assert pre.transfer_id == pre_leg.request_id
            assert move_leg.moved_in and not move_leg.precopy
            (moved,) = c.decode[source].moves_out
            assert moved.transfer_id == move_leg.request_id
            assert moved.request_id == pre.request_id  # the same leg: pre-copied, then moved
            await until(lambda: pre_leg.request_id in target.aborts)  # freed after the move
            assert move_leg.request_id not in target.aborts
            counters = c.router.deps.counters
            assert counters.precopy_bytes == 4096 * 2 and counters.moved_bytes == 4096 * 2
            assert counters.live_moves[("operator", "moved")] == 1

    asyncio.run(scenario())


def test_a_refused_precopy_reserve_moves_without_one(tokenizer: RouterTokenizer) -> None:
    """The target takes no pre-copy (no prefix cache there, a sliding window): the stream
    moves all the same, its whole KV pushed after the Suspend."""
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            source = c.first_decode(len(PROMPT) + N)
            target = c.decode[1 - source]
            target.refuses_precopy = True
            responses, reply = await _move_while_held(c, source)
            assert (reply.moved, reply.stayed) == (1, 0)
            assert [t for r in responses for t in r.token_ids] == expected_output(PROMPT, N)
            assert not c.decode[source].precopies
            (move_leg,) = target.reservations.values()
            assert move_leg.moved_in and not move_leg.precopy
            assert c.router.deps.counters.precopy_bytes == 0

    asyncio.run(scenario())


def test_failed_precopy_stays_untouched(tokenizer: RouterTokenizer) -> None:
    """The pre-copy's push fails at the target: the stream is never suspended, it stays on
    its source (the reason says why), and the target's pre-copy leg is aborted."""
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            source = c.first_decode(len(PROMPT) + N)
            fake = c.decode[source]
            fake.precopy_fails = True
            fake.hang_after = 3
            target = c.decode[1 - source]
            task = asyncio.create_task(c.generate(_request()))
            await asyncio.wait_for(fake.hanging.wait(), 10)
            admin = worker_pb2_grpc.RouterAdminStub(c.channel)
            reply = await admin.MoveStreams(
                worker_pb2.MoveStreamsRequest(worker=c.decode_endpoints[source]), timeout=10)
            assert (reply.moved, reply.stayed) == (0, 1)
            assert "pre-copy failed" in reply.reasons[0]
            fake.resume.set()  # nothing suspended it: it reads on where it was
            responses = await asyncio.wait_for(task, 10)
            assert [t for r in responses for t in r.token_ids] == expected_output(PROMPT, N)
            assert not c.decode[source].suspends and not c.decode[source].moves_out
            (pre_leg,) = target.reservations.values()
            assert pre_leg.precopy
            await until(lambda: pre_leg.request_id in target.aborts)
            assert c.router.deps.counters.live_moves[("operator", "stayed")] == 1

    asyncio.run(scenario())


def test_stream_ending_during_its_precopy_frees_it(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            source = c.first_decode(len(PROMPT) + N)
            fake = c.decode[source]
            fake.hang_after = 3
            fake.precopy_gate = gate = asyncio.Event()
            task = asyncio.create_task(c.generate(_request()))
            await asyncio.wait_for(fake.hanging.wait(), 10)
            admin = worker_pb2_grpc.RouterAdminStub(c.channel)
            move = asyncio.ensure_future(admin.MoveStreams(
                worker_pb2.MoveStreamsRequest(worker=c.decode_endpoints[source]), timeout=10))
            await asyncio.wait_for(fake.precopy_started.wait(), 10)
            fake.resume.set()  # the stream reads on to its end while its pre-copy runs
            responses = await asyncio.wait_for(task, 10)
            assert [t for r in responses for t in r.token_ids] == expected_output(PROMPT, N)
            gate.set()
            reply = await move
            assert (reply.moved, reply.stayed) == (0, 1)
            assert reply.reasons[0] == "the request ended first"
            target = c.decode[1 - source]
            (pre_leg,) = target.reservations.values()
            await until(lambda: pre_leg.request_id in target.aborts)
            assert not fake.moves_out

    asyncio.run(scenario())


def test_client_gone_during_the_precopy_aborts_every_leg(tokenizer: RouterTokenizer) -> None:
    """The client cancels while the pre-copy is under way: the router aborts the request's
    leg on its source and the pre-copy's leg on the target; the move ends as not moved."""
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2) as c:
            source = c.first_decode(len(PROMPT) + N)
            fake = c.decode[source]
            fake.hang_after = 3
            fake.precopy_gate = gate = asyncio.Event()
            call = c.stub.Generate(_request())
            await call.read()  # the first token: its stream is under way
            await asyncio.wait_for(fake.hanging.wait(), 10)
            admin = worker_pb2_grpc.RouterAdminStub(c.channel)
            move = asyncio.ensure_future(admin.MoveStreams(
                worker_pb2.MoveStreamsRequest(worker=c.decode_endpoints[source]), timeout=10))
            await asyncio.wait_for(fake.precopy_started.wait(), 10)
            call.cancel()  # the client leaves mid pre-copy
            (leg,) = fake.reservations
            await until(lambda: leg in fake.aborts)
            target = c.decode[1 - source]
            (pre_leg,) = target.reservations.values()
            await until(lambda: pre_leg.request_id in target.aborts)
            gate.set()
            reply = await move
            assert (reply.moved, reply.stayed) == (0, 1)
            assert not fake.moves_out

    asyncio.run(scenario())


def test_failed_push_stays_on_the_source(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2, live_move_precopy_blocks=0) as c:
            source = c.first_decode(len(PROMPT) + N)
            c.decode[source].move_fails = True
            responses, reply = await _move_while_held(c, source)
            assert (reply.moved, reply.stayed) == (0, 1)
            assert "push failed" in reply.reasons[0]
            assert [t for r in responses for t in r.token_ids] == expected_output(PROMPT, N)
            target = c.decode[1 - source]
            (leg_id,) = target.reservations
            assert leg_id in target.aborts  # the target's reservation was dropped
            assert c.router.deps.counters.live_moves[("operator", "stayed")] == 1

    asyncio.run(scenario())


def test_no_other_decode_worker_resumes(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=1, live_move_precopy_blocks=0) as c:
            responses, reply = await _move_while_held(c, 0)
            assert (reply.moved, reply.stayed) == (0, 1)
            assert "no decode worker could take it" in reply.reasons[0]
            assert [t for r in responses for t in r.token_ids] == expected_output(PROMPT, N)
            assert not c.decode[0].moves_out

    asyncio.run(scenario())


def test_a_stream_starting_on_a_worker_drained_with_migrate_moves(
        tokenizer: RouterTokenizer) -> None:
    """A request still in its prefill when its decode worker is drained with migrate moves
    as soon as it starts decoding there (the drain's own moves did not see it)."""
    async def scenario() -> None:
        # no pre-copy: the fake's stream runs to its end at once, and only a move as soon as
        # its first token is out (the Suspend) comes before that
        async with cluster(tokenizer, n_decode=2, live_move_precopy_blocks=0) as c:
            source = c.first_decode(len(PROMPT) + N)
            c.prefill[0].gate = gate = asyncio.Event()
            task = asyncio.create_task(c.generate(_request()))
            await asyncio.wait_for(c.prefill[0].started.wait(), 10)
            assert c.router.registry.drain(c.decode_endpoints[source], move_streams=True)
            gate.set()
            responses = await asyncio.wait_for(task, 10)
            assert [t for r in responses for t in r.token_ids] == expected_output(PROMPT, N)
            assert len(c.decode[source].moves_out) == 1
            assert c.router.deps.counters.live_moves[("drain", "moved")] == 1

    asyncio.run(scenario())


def test_admin_answers_members_only(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            port = c.router.port
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as stranger:
                admin = worker_pb2_grpc.RouterAdminStub(stranger)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await admin.DrainWorker(worker_pb2.DrainWorkerRequest(
                        worker=c.decode_endpoints[0], migrate=True), timeout=10)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            member = worker_pb2_grpc.RouterAdminStub(c.channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await member.MoveStreams(worker_pb2.MoveStreamsRequest(worker="nobody:1"),
                                         timeout=10)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert len(c.router.registry.routable(Role.DECODE)) == 1  # nothing drained

    asyncio.run(scenario())


def test_tickets_follow_their_stream() -> None:
    async def scenario() -> None:
        live = LiveStreams()
        with live.open("d1:1", "r") as ticket:
            assert live.on("d1:1") == [ticket]
            live.rehome(ticket, "d2:1", "r.1")
            assert live.on("d1:1") == [] and live.on("d2:1") == [ticket]
            outcome, first = ticket.ask(MoveCause.DRAIN)
            assert first and ticket.ask(MoveCause.DRAIN) == (outcome, False)  # one move
        # The stream ended with the move still asked for: settled as not moved.
        assert await outcome == MoveOutcome(False, "the request ended first")
        assert live.on("d2:1") == []

    asyncio.run(scenario())
