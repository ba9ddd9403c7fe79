"""Forked requests in the router (n / best_of): one Reserve and one Prefill with n, a Decode
stream per sequence merged by index, a sequence migrating alone when its decode worker dies;
against fake workers over real gRPC and HTTP, and the merge on its own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tandem.router.api.request import GenerateRequest
from tandem.router.errors import InvalidRequestError, LegLostError
from tandem.router.handoff.fork import merge_sequences
from tandem.router.request import Chunk
from tandem.router.tokenizer import RouterTokenizer
from tests.unit.router.fakes import expected_output
from tests.unit.router.harness import MODEL, Cluster, cluster

PROMPT = list(range(1000, 1040))


def _url(c: Cluster, path: str) -> str:
    return f"http://127.0.0.1:{c.router.http_port}{path}"


def _minted(c: Cluster) -> str:
    """The router's id of the test's one forked request (its shared leg's id)."""
    ids = {i for d in c.decode for i in d.reservations if "-" not in i and "." not in i}
    assert len(ids) == 1, ids
    return ids.pop()


async def _post(http: aiohttp.ClientSession, c: Cluster, body: dict[str, Any]) -> Any:
    async with http.post(_url(c, "/v1/completions"), json={"model": MODEL, **body}) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def test_n_is_one_reserve_one_prefill_and_a_stream_per_sequence(
        tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c, aiohttp.ClientSession() as http:
            body = await _post(http, c, {"prompt": PROMPT, "max_tokens": 5, "n": 3, "seed": 9})
            want = [tokenizer.decode(expected_output(PROMPT, 5, j)) for j in range(3)]
            assert [ch["index"] for ch in body["choices"]] == [0, 1, 2]
            assert [ch["text"] for ch in body["choices"]] == want
            assert body["usage"]["completion_tokens"] == 15
            assert body["usage"]["prompt_tokens"] == len(PROMPT)  # the prompt once
            rid = _minted(c)
            assert list(c.decode[0].reservations) == [rid]  # one Reserve ...
            assert c.decode[0].reservations[rid].n == 3
            assert c.prefill[0].calls == [rid]  # ... one prefill (and push) ...
            assert sorted(c.decode[0].decodes) == [(rid, 0), (rid, 1), (rid, 2)]
            assert c.counters.requests == 1 and c.counters.completed == 1
            assert c.counters.migrations == 0 and not c.decode[0].aborts

    asyncio.run(scenario())


def test_colocated_fork_and_best_of(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_prefill=0, http_port=0) as c, \
                aiohttp.ClientSession() as http:
            body = await _post(http, c, {"prompt": PROMPT, "max_tokens": 4, "n": 2})
            assert [ch["text"] for ch in body["choices"]] == [
                tokenizer.decode(expected_output(PROMPT, 4, j)) for j in range(2)]
            assert c.decode[0].local_prefills == [_minted(c)]
            # best_of ranks by cumulative logprob: the fakes give sequence j's first token
            # -1 - j and the rest none, so sequence 0 is the likeliest
            best = await _post(http, c, {"prompt": PROMPT[:20], "max_tokens": 3, "n": 1,
                                         "best_of": 3})
            assert [ch["text"] for ch in best["choices"]] == [
                tokenizer.decode(expected_output(PROMPT[:20], 3, 0))]
            assert max(r.n for r in c.decode[0].reservations.values()) == 3

    asyncio.run(scenario())


def test_streamed_choices_interleave_by_index(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, http_port=0) as c, aiohttp.ClientSession() as http:
            request = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, "n": 2,
                       "stream": True, "stream_options": {"include_usage": True}}
            texts: dict[int, str] = {}
            usage = None
            async with http.post(_url(c, "/v1/completions"), json=request) as r:
                assert r.status == 200
                async for raw in r.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[len("data: "):])
                    for ch in event["choices"]:
                        texts[ch["index"]] = texts.get(ch["index"], "") + ch["text"]
                    usage = event.get("usage") or usage
            assert texts == {j: tokenizer.decode(expected_output(PROMPT, 4, j))
                             for j in range(2)}
            assert usage is not None and usage["completion_tokens"] == 8

    asyncio.run(scenario())


def test_a_sequence_whose_decode_worker_dies_migrates_alone(tokenizer: RouterTokenizer
                                                            ) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer, n_decode=2, http_port=0) as c, \
                aiohttp.ClientSession() as http:
            dying = c.first_decode(len(PROMPT) + 3 * 8)
            c.decode[dying].die_after = 2  # every sequence's stream breaks after 2 messages
            body = await _post(http, c, {"prompt": PROMPT, "max_tokens": 8, "n": 3,
                                         "seed": 4})
            assert [ch["text"] for ch in body["choices"]] == [
                tokenizer.decode(expected_output(PROMPT, 8, j)) for j in range(3)]
            rid = _minted(c)
            other = c.decode[1 - dying]
            # each sequence went on alone: prompt + its 3 tokens so far, seed + j
            assert sorted(other.reservations) == [f"{rid}-{j}" for j in range(3)]
            for j in range(3):
                r = other.reservations[f"{rid}-{j}"]
                assert r.n == 1 and r.prior == 3 and r.sampling.seed == 4 + j
                assert r.token_ids == PROMPT + expected_output(PROMPT, 8, j)[:3]
            assert sorted(c.decode[dying].abort_indexes) == [(rid, 0), (rid, 1), (rid, 2)]
            assert c.counters.migrations == 3 and c.counters.completed == 1

    asyncio.run(scenario())


def test_frontend_bounds_n(tokenizer: RouterTokenizer) -> None:
    async def scenario() -> None:
        async with cluster(tokenizer) as c:
            request = GenerateRequest(tuple(PROMPT))
            for n in (0, 129):
                with pytest.raises(InvalidRequestError) as err:
                    c.router.frontend.accept(request, n=n)
                assert err.value.field == "n"
            assert c.router.frontend.accept(request, n=128).n == 128

    asyncio.run(scenario())


# -- the merge on its own ---------------------------------------------------------------------


async def _messages(tokens: list[int], fail: BaseException | None = None
                    ) -> AsyncIterator[Chunk]:
    for i, t in enumerate(tokens):
        await asyncio.sleep(0)
        yield Chunk([t], finished=i == len(tokens) - 1)
    if fail is not None:
        raise fail


def test_merge_migrates_a_lost_sequence_with_its_tokens_so_far() -> None:
    async def scenario() -> list[Chunk]:
        firsts = [Chunk([10], index=0), Chunk([20], index=1)]
        migrated: list[tuple[int, list[int]]] = []

        def stream_of(j: int) -> AsyncIterator[Chunk]:
            if j == 1:
                return _messages([21], LegLostError("d", "gone"))
            return _messages([11, 12])

        async def migrate(j: int, sent: list[int], lost: LegLostError) -> AsyncIterator[Chunk]:
            migrated.append((j, sent))
            yield Chunk([22], leg_start=True)
            yield Chunk([23], finished=True)

        out = [c async for c in merge_sequences(firsts, stream_of, migrate)]
        assert migrated == [(1, [20, 21])]
        return out

    out = asyncio.run(scenario())
    assert [(c.index, c.token_ids) for c in out[:2]] == [(0, [10]), (1, [20])]
    by_index = {j: [t for c in out if c.index == j for t in c.token_ids] for j in (0, 1)}
    assert by_index == {0: [10, 11, 12], 1: [20, 21, 22, 23]}


def test_merge_fails_as_a_whole_and_stops_every_sequence() -> None:
    cancelled = asyncio.Event()

    async def forever() -> AsyncIterator[Chunk]:
        try:
            await asyncio.Event().wait()
            yield Chunk([])
        finally:
            cancelled.set()

    async def scenario() -> None:
        def stream_of(j: int) -> AsyncIterator[Chunk]:
            return _messages([1], ValueError("bad")) if j else forever()

        async def migrate(j: int, sent: list[int], lost: LegLostError) -> AsyncIterator[Chunk]:
            raise AssertionError("nothing was lost")
            yield Chunk([])

        with pytest.raises(ValueError):
            async for _ in merge_sequences([Chunk([0]), Chunk([0], index=1)], stream_of,
                                           migrate):
                pass
        assert cancelled.is_set()

    asyncio.run(scenario())
