"""``tandem.SamplingOptions``: the sampling fields of a request as one typed, reusable value.

    greedy = tandem.SamplingOptions(temperature=0.0, max_tokens=64, stop=("\\n\\n",))
    client.generate("Once upon a time", sampling=greedy)
    client.generate("Once upon a time", sampling=dataclasses.replace(greedy, seed=7))

It is the typed twin of the keyword options ``generate(..., max_tokens=64, temperature=0)``,
which keep working: both end in the same ``SamplingParams`` message (``request_builder``).
A field left at None is not sent, so the server's default applies. Giving the same field both
here and as a keyword is an ``InvalidRequest`` (no silent precedence); ``dataclasses.replace``
is the way to tweak a preset. Value ranges are the router's to check, as for the keywords, so
the SDK and the server never disagree on what is valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """How to sample a completion (every field optional; None: the server's default).

    ``max_tokens``/``min_tokens``: bounds on generated tokens. ``temperature`` (0: greedy),
    ``top_p``, ``top_k``, ``min_p``: the sampling distribution. ``repetition_penalty``,
    ``presence_penalty``, ``frequency_penalty``: OpenAI/vLLM penalties. ``seed``: a
    per-request seed (reproducible sampling). ``stop``: stop strings (a single string is one
    stop string); ``stop_token_ids``: stop tokens. ``ignore_eos``: keep going past EOS.
    ``include_stop_str_in_output``, ``skip_special_tokens``: how the text is rendered.
    ``speculative``: False opts this request out of speculative decoding. ``logit_bias``:
    ``{token id: bias}``. ``structured``: one of ``{"json_schema": dict | str}``,
    ``{"json_object": True}``, ``{"regex": str}``, ``{"choice": [str, ...]}``,
    ``{"grammar": EBNF str}``. ``prompt_logprobs``: alternatives per prompt token (0..20).
    """

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
    stop: str | Sequence[str] | None = None
    stop_token_ids: Sequence[int] | None = None
    ignore_eos: bool | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    speculative: bool | None = None
    logit_bias: Mapping[int, float] | None = None
    structured: Mapping[str, Any] | None = None
    prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        # Sequences become tuples so a preset is immutable (and hashable) once built.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif self.stop is not None:
            object.__setattr__(self, "stop", tuple(self.stop))
        if self.stop_token_ids is not None and not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    def as_options(self) -> dict[str, Any]:
        """The fields that are set, as the keyword options ``generate`` takes."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


def merge_sampling(
    sampling: SamplingOptions | None, options: Mapping[str, Any]
) -> dict[str, Any]:
    """``sampling``'s set fields plus the keyword ``options``; raises ValueError (naming the
    field) when one is given both ways, TypeError when ``sampling`` is not SamplingOptions."""
    if sampling is None:
        return dict(options)
    if not isinstance(sampling, SamplingOptions):
        raise TypeError(f"sampling must be SamplingOptions, got {type(sampling).__name__}")
    typed = sampling.as_options()
    twice = sorted(set(typed) & {k for k, v in options.items() if v is not None})
    if twice:
        raise ValueError(f"given both in sampling= and as a keyword: {', '.join(twice)}")
    return {**options, **typed}
