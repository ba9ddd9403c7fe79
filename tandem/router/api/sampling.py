"""How a request samples: the fields a client may set, None where it left one unset.

Unset fields take the engine's defaults on the worker (or the model's generation config:
tandem/router/generation_defaults.py), so "unset" and "set to the default" stay apart until
then, as the wire's optional fields keep them apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

StructuredKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    """Constrain the output to a grammar (the worker's grammar engine compiles it).

    ``value`` by ``kind``: json_schema, regex and grammar a text (a JSON Schema's text, a
    regex, EBNF); choice a tuple of strings (the output is exactly one of them); json_object
    a flag (true: any JSON object). ``after_token``: the grammar constrains only the output
    after this token's first occurrence (a reasoning model's end of thinking, set by the
    router's reasoning parser: tandem/router/reasoning_grammar.py); None: from the first token.
    """

    kind: StructuredKind
    value: str | bool | tuple[str, ...]
    after_token: int | None = None


@dataclass(frozen=True, slots=True)
class LogprobOptions:
    """Whether to report each sampled token's logprob, with this many alternatives (0..20)."""

    enabled: bool = False
    top_logprobs: int = 0


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    """A request's sampling settings (tandem/router/validation.py checks their ranges)."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None  # unset: true
    # false: this request never speculates (unset: it does whenever the decode worker runs a
    # speculative proposer); outputs are the same either way, only speed differs
    speculative: bool | None = None
    structured: StructuredOutput | None = None
    logit_bias: Mapping[int, float] = field(default_factory=dict)  # token id -> added logit
    # every prompt token after the first: its logprob and this many alternatives (0..20)
    prompt_logprobs: int | None = None
