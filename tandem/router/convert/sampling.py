"""Sampling settings and logprobs: ``tandem.v1`` messages <-> tandem/router/api types.

An optional wire field that is unset is None in SamplingSpec, and None goes back out unset,
so the worker applies its own default exactly as it would to the client's message.
"""

from __future__ import annotations

from collections.abc import Iterable

from tandem.protos.v1 import tandem_pb2
from tandem.router.api.response import TokenLogprob, TopLogprob
from tandem.router.api.sampling import LogprobOptions, SamplingSpec, StructuredOutput

# SamplingParams' optional scalars: unset on the wire <-> None in SamplingSpec.
_OPTIONAL = (
    "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "seed", "skip_special_tokens", "speculative",
    "prompt_logprobs",
)


def sampling_from_proto(s: tandem_pb2.SamplingParams) -> SamplingSpec:
    """A client's SamplingParams."""
    optional = {name: getattr(s, name) for name in _OPTIONAL if s.HasField(name)}
    return SamplingSpec(
        **optional,
        stop=tuple(s.stop),
        stop_token_ids=tuple(s.stop_token_ids),
        ignore_eos=s.ignore_eos,
        include_stop_str_in_output=s.include_stop_str_in_output,
        structured=structured_from_proto(s.structured) if s.HasField("structured") else None,
        logit_bias=dict(s.logit_bias),
    )


def sampling_to_proto(s: SamplingSpec) -> tandem_pb2.SamplingParams:
    """The SamplingParams a worker is sent."""
    out = tandem_pb2.SamplingParams(
        stop=s.stop,
        stop_token_ids=s.stop_token_ids,
        ignore_eos=s.ignore_eos,
        include_stop_str_in_output=s.include_stop_str_in_output,
        logit_bias=s.logit_bias,
    )
    for name in _OPTIONAL:
        value = getattr(s, name)
        if value is not None:
            setattr(out, name, value)
    if s.structured is not None:
        out.structured.CopyFrom(structured_to_proto(s.structured))
    return out


def structured_from_proto(so: tandem_pb2.StructuredOutput) -> StructuredOutput | None:
    """The constraint a StructuredOutput names (None when it names none)."""
    kind = so.WhichOneof("kind")
    if kind is None:
        return None
    after = so.after_token if so.HasField("after_token") else None
    if kind == "choice":
        return StructuredOutput("choice", tuple(so.choice.choices), after)
    return StructuredOutput(kind, getattr(so, kind), after)


def structured_to_proto(so: StructuredOutput) -> tandem_pb2.StructuredOutput:
    """A constraint as the wire's oneof."""
    if so.kind == "choice":
        assert isinstance(so.value, tuple)
        out = tandem_pb2.StructuredOutput(choice=tandem_pb2.ChoiceList(choices=so.value))
    else:
        out = tandem_pb2.StructuredOutput()
        setattr(out, so.kind, so.value)
    if so.after_token is not None:
        out.after_token = so.after_token
    return out


def logprob_options_from_proto(lp: tandem_pb2.LogprobOptions) -> LogprobOptions:
    """A client's LogprobOptions."""
    return LogprobOptions(enabled=lp.enabled, top_logprobs=lp.top_logprobs)


def logprob_options_to_proto(lp: LogprobOptions) -> tandem_pb2.LogprobOptions:
    """The LogprobOptions a worker is sent."""
    return tandem_pb2.LogprobOptions(enabled=lp.enabled, top_logprobs=lp.top_logprobs)


def token_logprob_from_proto(lp: tandem_pb2.TokenLogprob) -> TokenLogprob:
    """A worker's TokenLogprob."""
    return TokenLogprob(lp.token_id, lp.logprob,
                        tuple(TopLogprob(t.token_id, t.logprob) for t in lp.top))


def token_logprobs_from_proto(lps: Iterable[tandem_pb2.TokenLogprob]) -> tuple[TokenLogprob, ...]:
    """A worker's TokenLogprob list."""
    return tuple(token_logprob_from_proto(lp) for lp in lps)


def token_logprobs_to_proto(lps: Iterable[TokenLogprob]) -> list[tandem_pb2.TokenLogprob]:
    """TokenLogprobs as a client is sent them."""
    return [
        tandem_pb2.TokenLogprob(
            token_id=lp.token_id, logprob=lp.logprob,
            top=[tandem_pb2.TopLogprob(token_id=t.token_id, logprob=t.logprob) for t in lp.top],
        )
        for lp in lps
    ]
