"""The multi-turn chat workload: its plan, and the runner that feeds replies into prompts."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tandem.loadgen.load import run_conversations
from tandem.loadgen.multiturn import ChatShape, make_conversations, next_prompt
from tandem.loadgen.stats import by_turn, summarize
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc


def test_conversations_are_reproducible_and_shaped() -> None:
    a = make_conversations(0.5, 40, seed=3)
    assert a == make_conversations(0.5, 40, seed=3)
    assert a != make_conversations(0.5, 40, seed=4)
    turns = [t for c in a for t in c.turns]
    assert [t.index for t in turns] == list(range(40))  # conversation-major, no gaps
    assert all(3 <= len(c.turns) <= 4 for c in a[:-1]) and 1 <= len(a[-1].turns) <= 4
    assert len({c.system_ids for c in a}) <= 4  # a handful of shared system prompts
    assert all(192 <= len(c.system_ids) <= 256 for c in a)
    assert all(16 <= len(t.user_ids) <= 48 and 32 <= t.max_tokens <= 64 for t in turns)
    assert all(c.turns[0].think_s == 0.0 and all(t.think_s > 0 for t in c.turns[1:]) for c in a)
    assert all(1000 <= i < 30000 for c in a for i in c.first_prompt())
    starts = [c.arrival_s for c in a]
    assert starts == sorted(starts) and starts[0] == 0.0
    # system_seed: other conversations, the same system prompts
    b = make_conversations(0.5, 40, seed=4, system_seed=3)
    assert {c.system_ids for c in b} <= {c.system_ids for c in a}
    assert not {c.first_prompt() for c in b} & {c.first_prompt() for c in a}


def test_start_rate_makes_the_overall_request_rate() -> None:
    convs = make_conversations(2.0, 4000, seed=1, shape=ChatShape(think_s=0.0))
    span = convs[-1].arrival_s
    # conversation starts/s x turns per conversation = requests/s
    assert (len(convs) - 1) / span * 4000 / len(convs) == pytest.approx(2.0, rel=0.1)
    with pytest.raises(ValueError):
        make_conversations(0.0, 5)


def test_next_turn_extends_the_previous_prompt_with_the_reply() -> None:
    conv = make_conversations(1.0, 4, seed=0, shape=ChatShape(turns=(4, 4)))[0]
    prompt = conv.first_prompt()
    assert prompt[: len(conv.system_ids)] == conv.system_ids
    for turn in conv.turns[1:]:
        reply = [7] * 5  # what a server might have answered
        nxt = next_prompt(prompt, reply, turn.user_ids)
        assert nxt[: len(prompt) + 5] == prompt + (7,) * 5
        assert nxt[len(prompt) + 5 :] == turn.user_ids
        prompt = nxt


class _Fake(tandem_pb2_grpc.TandemServicer):
    """Replies with ids derived from the prompt; reports as cached the longest prompt prefix
    it has seen before (a stand-in for a prefix cache)."""

    def __init__(self) -> None:
        self.prompts: list[tuple[int, ...]] = []

    async def Generate(self, request, context):  # noqa: N802 (gRPC's method name)
        prompt = tuple(request.token_ids.ids)
        cached = max((_common(prompt, p) for p in self.prompts), default=0)
        self.prompts.append(prompt)
        n = request.sampling.max_tokens
        reply = [(len(prompt) + i) % 997 for i in range(n)]
        yield tandem_pb2.GenerateResponse(token_ids=reply[: n // 2])
        yield tandem_pb2.GenerateResponse(
            token_ids=reply[n // 2 :], finished=True, finish_reason="length",
            usage=tandem_pb2.Usage(prompt_tokens=len(prompt), cached_tokens=cached),
        )


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_run_conversations_sends_each_reply_back() -> None:
    shape = ChatShape(system_prompts=1, turns=(3, 3), think_s=0.01)
    convs = make_conversations(50.0, 6, seed=2, shape=shape)
    fake = _Fake()

    async def scenario() -> list:
        server = grpc.aio.server()
        tandem_pb2_grpc.add_TandemServicer_to_server(fake, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            seen: list = []
            results, _ = await run_conversations(f"127.0.0.1:{port}", convs,
                                                 progress=seen.append)
            assert len(seen) == 6
            return results
        finally:
            await server.stop(None)

    results = asyncio.run(scenario())
    assert [(r.conversation, r.turn) for r in results] == [(0, 0), (0, 1), (0, 2),
                                                           (1, 0), (1, 1), (1, 2)]
    assert all(r.ok and r.output_tokens == convs[r.conversation].turns[r.turn].max_tokens
               for r in results)
    by_conv = {c.index: [p for p in fake.prompts if p[: len(c.system_ids)] == c.system_ids
                         and p[len(c.system_ids):][: len(c.turns[0].user_ids)]
                         == c.turns[0].user_ids] for c in convs}
    for c in convs:
        prompts = sorted(by_conv[c.index], key=len)
        assert len(prompts) == 3
        for k in (1, 2):
            prev = prompts[k - 1]
            reply = tuple((len(prev) + i) % 997 for i in range(c.turns[k - 1].max_tokens))
            assert prompts[k] == prev + reply + c.turns[k].user_ids
    system = len(convs[0].system_ids)
    assert all(r.cached_tokens >= system for r in results if r.turn > 0)
    turns = by_turn(results)
    assert set(turns) == {0, 1, 2} and turns[2]["cached_share"] > 0.5
    assert "by_turn" in summarize(results, 1.0, slo_ttft_s=1.0, slo_tpot_s=1.0)
