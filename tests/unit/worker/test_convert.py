"""Proto <-> plain value conversions, the layout check and the error -> status mapping (no
model needed)."""

from __future__ import annotations

import math

import grpc
import pytest

from tandem.engine.async_engine import EngineDeadError
from tandem.engine.errors import InvalidRequestError, OutOfBlocksError
from tandem.engine.outputs import KVCacheSpec, RequestOutput, TokenLogprob
from tandem.engine.sampling_params import SamplingParams
from tandem.kv_transfer import ConnectionLost, LayoutMismatchError, TransferAborted
from tandem.protos.v1 import tandem_pb2
from tandem.worker.convert import (
    first_token_to_proto,
    kv_layout,
    layout_from_proto,
    layout_to_proto,
    response_from_output,
    sampling_from_proto,
)
from tandem.worker.errors import Draining, grpc_status
from tandem.worker.first_token import FirstToken
from tandem.worker.layout import LayoutSummary, layout_mismatch


def test_unset_fields_keep_engine_defaults() -> None:
    assert sampling_from_proto(tandem_pb2.SamplingParams()) == SamplingParams()


def test_every_field_is_carried() -> None:
    proto = tandem_pb2.SamplingParams(
        max_tokens=7, min_tokens=2, temperature=0.5, top_p=0.9, top_k=5, min_p=0.1,
        repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=-0.3, seed=42,
        stop=["a", "bc"], stop_token_ids=[3, 4], ignore_eos=True,
        include_stop_str_in_output=True, skip_special_tokens=False, speculative=False,
    )
    got = sampling_from_proto(proto, tandem_pb2.LogprobOptions(enabled=True, top_logprobs=3))
    assert got == SamplingParams(
        max_tokens=7, min_tokens=2, temperature=pytest.approx(0.5), top_p=pytest.approx(0.9),
        top_k=5, min_p=pytest.approx(0.1), repetition_penalty=pytest.approx(1.1),
        presence_penalty=pytest.approx(0.2), frequency_penalty=pytest.approx(-0.3), seed=42,
        stop=["a", "bc"], stop_token_ids=[3, 4], ignore_eos=True,
        include_stop_str_in_output=True, logprobs=3, skip_special_tokens=False, speculative=False,
    )
    got.validate(vocab_size=100)
    assert sampling_from_proto(tandem_pb2.SamplingParams()).speculative is True  # unset


@pytest.mark.parametrize("after", [None, 0, 151668])
def test_a_structured_output_crosses_from_the_router_with_its_after_token(
    after: int | None,
) -> None:
    from tandem.engine.structured.spec import StructuredOutput
    from tandem.router.api.sampling import SamplingSpec
    from tandem.router.api.sampling import StructuredOutput as RouterStructured
    from tandem.router.convert.sampling import sampling_from_proto as router_from_proto
    from tandem.router.convert.sampling import sampling_to_proto

    for kind, value, engine_value in (("json_schema", "{}", "{}"), ("regex", "a+", "a+"),
                                      ("choice", ("x", "y"), ("x", "y"))):
        spec = SamplingSpec(structured=RouterStructured(kind, value, after))
        proto = sampling_to_proto(spec)
        assert router_from_proto(proto).structured == spec.structured  # the router's own trip
        assert sampling_from_proto(proto).structured == StructuredOutput(kind, engine_value, after)


def test_logprob_options() -> None:
    sp = tandem_pb2.SamplingParams()
    assert sampling_from_proto(sp, tandem_pb2.LogprobOptions()).logprobs is None
    assert sampling_from_proto(sp, tandem_pb2.LogprobOptions(enabled=True)).logprobs == 0
    assert sampling_from_proto(sp, tandem_pb2.LogprobOptions(top_logprobs=2)).logprobs == 2


def test_explicit_zero_reaches_validation() -> None:
    params = sampling_from_proto(tandem_pb2.SamplingParams(max_tokens=0, temperature=0.0))
    assert params.temperature == 0.0 and params.greedy
    with pytest.raises(InvalidRequestError) as err:
        params.validate(vocab_size=100)
    assert err.value.field == "max_tokens"


def test_response_messages() -> None:
    out = RequestOutput("r", [1, 2, 3], [9], "x", [8, 9], "wx",
                        logprobs=[TokenLogprob(9, -0.5, [(9, -0.5), (4, -1.0)])])
    msg = response_from_output(out, text_prefix="w")
    assert (list(msg.token_ids), msg.text, msg.finished) == ([9], "wx", False)
    assert msg.logprobs[0].top[1].token_id == 4 and not msg.HasField("usage")
    done = RequestOutput("r", [1, 2, 3], [], "", [8, 9], "wx", finished=True,
                         finish_reason="stop", stop_reason=2, num_cached_tokens=16)
    msg = response_from_output(done)
    assert (msg.finish_reason, msg.stop_reason) == ("stop", "2")
    assert (msg.usage.prompt_tokens, msg.usage.completion_tokens, msg.usage.cached_tokens) == (
        3, 2, 16)


def test_first_token_answers() -> None:
    """A prefill's answer from its outputs: prompt logprobs one per prompt token (the first
    NaN), a forked request's every first token (a missing logprob sent as 0)."""
    lp = TokenLogprob(9, -0.5, [(9, -0.5), (4, -1.0)])
    out = RequestOutput("r", [7, 8, 9], [9], "x", [9], "x", logprobs=[lp], num_cached_tokens=16,
                        prompt_logprobs=[None, TokenLogprob(8, -2.0), TokenLogprob(9, -3.0)])
    first = FirstToken.of([out], prefill_s=0.25, transfer_s=0.125)
    reply = first_token_to_proto(first)
    assert (reply.first_token, reply.cached_tokens, reply.prefill_s, reply.transfer_s) == (
        9, 16, 0.25, 0.125)
    assert reply.logprob == -0.5 and reply.first_logprob.top[1].token_id == 4
    assert [p.token_id for p in reply.prompt_logprobs] == [7, 8, 9]
    assert math.isnan(reply.prompt_logprobs[0].logprob)
    assert [p.logprob for p in reply.prompt_logprobs[1:]] == [-2.0, -3.0]
    assert not reply.first_tokens  # one sequence
    other = RequestOutput("r#1", [7, 8, 9], [5], "y", [5], "y")
    forked = first_token_to_proto(FirstToken.of([out, other], prefill_s=0.25))
    assert [(t.token_id, t.logprob) for t in forked.first_tokens] == [(9, -0.5), (5, 0.0)]
    plain = first_token_to_proto(FirstToken.of([other], prefill_s=0.25))
    assert not plain.HasField("first_logprob") and not plain.prompt_logprobs


def test_layouts() -> None:
    mine = kv_layout(KVCacheSpec("m", "float32", "float16", 16, 2, 2, 16))
    assert mine.kv_dtype == "float16" and mine.model_id == "m" and mine.scale_bytes == 0
    int8 = kv_layout(KVCacheSpec("m", "float32", "int8", 16, 2, 2, 16, scale_bytes=4))
    assert int8.row_width == 20 and int8.fingerprint != mine.fingerprint
    proto = layout_to_proto(mine)
    assert layout_from_proto(proto) == LayoutSummary.of(mine)  # the wire keeps every field
    assert layout_mismatch(mine, layout_from_proto(proto)) is None
    proto.block_size, proto.fingerprint = 32, "x"
    why = layout_mismatch(mine, layout_from_proto(proto))
    assert why is not None and "block_size: 32 (decode) != 16 (prefill)" in why


def test_layouts_state_the_bytes_a_token_pushes() -> None:
    """The router prices a push by the bytes per token the decode worker states: K and V for
    a K/V cache (int8's scales included), one plane for a latent cache, not 2 x heads x dim."""
    fp16 = kv_layout(KVCacheSpec("m", "float32", "float16", 16, 4, 2, 16))
    assert LayoutSummary.of(fp16).bytes_per_token == 4 * 2 * 2 * 16 * 2
    int8 = kv_layout(KVCacheSpec("m", "float32", "int8", 16, 4, 2, 16, scale_bytes=4))
    assert LayoutSummary.of(int8).bytes_per_token == 4 * 2 * 2 * (16 + 4)
    latent = kv_layout(KVCacheSpec("m", "bfloat16", "bfloat16", 16, 4, 1, 72, kv_lora_rank=64))
    assert LayoutSummary.of(latent).bytes_per_token == 4 * 1 * 72 * 2
    assert layout_from_proto(layout_to_proto(latent)).bytes_per_token == 4 * 72 * 2


@pytest.mark.parametrize("exc,code", [
    (InvalidRequestError("top_p", "bad"), grpc.StatusCode.INVALID_ARGUMENT),
    (OutOfBlocksError("3 needed"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Draining(), grpc.StatusCode.UNAVAILABLE),
    (EngineDeadError("gone"), grpc.StatusCode.UNAVAILABLE),
    (ConnectionLost("t", "reset"), grpc.StatusCode.UNAVAILABLE),
    (TransferAborted("t", "lease", by="receiver"), grpc.StatusCode.ABORTED),
    (LayoutMismatchError("layout"), grpc.StatusCode.FAILED_PRECONDITION),
])
def test_status_codes(exc: Exception, code: grpc.StatusCode) -> None:
    got = grpc_status(exc)
    assert got is not None and got[0] == code and got[1]


def test_bugs_are_not_mapped() -> None:
    assert grpc_status(RuntimeError("bug")) is None
