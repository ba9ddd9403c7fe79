"""Stream messages -> typed chunks -> one GenerateResult."""

from __future__ import annotations

from tandem.protos.v1 import tandem_pb2
from tandem.sdk.results import GenerateResult, ResultBuilder, StreamChunk, Timings, Usage


def _msgs() -> list[tandem_pb2.GenerateResponse]:
    lp = tandem_pb2.TokenLogprob(token_id=5, logprob=-0.5,
                                 top=[tandem_pb2.TopLogprob(token_id=6, logprob=-1.0)])
    return [
        tandem_pb2.GenerateResponse(request_id="r", token_ids=[5], text="Hel", logprobs=[lp]),
        tandem_pb2.GenerateResponse(request_id="r", token_ids=[7, 8], text="lo!"),
        tandem_pb2.GenerateResponse(
            request_id="r", token_ids=[], text="", finished=True, finish_reason="stop",
            stop_reason="!", usage=tandem_pb2.Usage(prompt_tokens=4, completion_tokens=3,
                                                    cached_tokens=2),
            timings=tandem_pb2.Timings(queue_s=0.1, first_token_s=0.2, total_s=0.5),
        ),
    ]


def test_chunks_carry_usage_only_at_the_end() -> None:
    chunks = [StreamChunk.from_proto(m) for m in _msgs()]
    assert chunks[0].usage is None and chunks[0].timings is None
    assert chunks[0].logprobs[0].top == ((6, -1.0),)
    assert chunks[2].finished and chunks[2].usage == Usage(4, 3, 2)
    assert chunks[2].usage.total_tokens == 7


def test_builder_accumulates_a_result() -> None:
    b = ResultBuilder()
    assert not b.finished and b.result().finish_reason == ""
    for m in _msgs():
        b.add(StreamChunk.from_proto(m))
    r = b.result()
    assert isinstance(r, GenerateResult) and b.finished
    assert (r.request_id, r.text, r.token_ids) == ("r", "Hello!", (5, 7, 8))
    assert (r.finish_reason, r.stop_reason) == ("stop", "!")
    assert r.usage == Usage(4, 3, 2)
    assert r.timings.queue_s == 0.1 and r.timings.total_s == 0.5
    assert isinstance(r.timings, Timings) and len(r.logprobs) == 1
