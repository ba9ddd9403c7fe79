"""Per-request sampling parameters, validated at the edge of the engine."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tandem.engine.errors import InvalidRequestError
from tandem.engine.structured.spec import StructuredOutput

MAX_LOGIT_BIAS = 300  # OpenAI's: biased tokens per request


@dataclass(slots=True)
class SamplingParams:
    """How to pick tokens for one request, and when to stop.

    ``temperature == 0`` is greedy. ``top_k`` of -1 or 0 disables top-k; ``top_p`` of 1.0 and
    ``min_p`` of 0.0 disable theirs. ``logprobs`` asks for the sampled token's logprob plus the
    top-n alternatives (0 means the sampled token's only). ``seed`` makes sampling reproducible
    independently of what else is in the batch. ``structured`` constrains the output to a
    grammar (tandem/engine/structured); the grammar's end is an EOS, so it cannot be combined with
    ``ignore_eos`` or ``min_tokens``.
    """

    max_tokens: int = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # score the prompt: each token's logprob + top-k
    skip_special_tokens: bool = True
    speculative: bool = True  # False: never speculate for this request (engine-level opt-out)
    structured: StructuredOutput | None = None  # the output must match this grammar
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (-100..100)
    lora: str = ""  # the LoRA adapter the request runs under ("": the base model)

    @property
    def greedy(self) -> bool:
        """True when the request takes the argmax at every step."""
        return self.temperature == 0.0

    def validate(self, vocab_size: int) -> None:
        """Raise InvalidRequestError naming the first bad field."""
        # max_tokens 0 only scores the prompt (prompt_logprobs), generating nothing
        _check_int(self.max_tokens, "max_tokens", lo=0 if self.prompt_logprobs is not None else 1)
        _check_int(self.min_tokens, "min_tokens", lo=0)
        if self.min_tokens > self.max_tokens:
            raise InvalidRequestError("min_tokens", "must be <= max_tokens")
        _check_float(self.temperature, "temperature", lo=0.0)
        _check_float(self.top_p, "top_p")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p}")
        _check_int(self.top_k, "top_k", lo=-1)
        _check_float(self.min_p, "min_p")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError("min_p", f"must be in [0, 1], got {self.min_p}")
        _check_float(self.repetition_penalty, "repetition_penalty")
        if self.repetition_penalty <= 0.0:
            raise InvalidRequestError("repetition_penalty", "must be > 0")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_float(value, name)
            if not -2.0 <= value <= 2.0:
                raise InvalidRequestError(name, f"must be in [-2, 2], got {value}")
        if self.seed is not None:
            _check_int(self.seed, "seed", lo=0)
            if self.seed >= 2**63:
                raise InvalidRequestError("seed", "must be < 2**63")
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if not isinstance(self.stop, (list, tuple)):
            raise InvalidRequestError("stop", "must be a string or a list of strings")
        if not isinstance(self.stop_token_ids, (list, tuple)):
            raise InvalidRequestError("stop_token_ids", "must be a list of token ids")
        for name in (
            "ignore_eos", "include_stop_str_in_output", "skip_special_tokens", "speculative"
        ):
            if not isinstance(getattr(self, name), bool):
                raise InvalidRequestError(name, "must be a boolean")
        for s in self.stop:
            if not isinstance(s, str) or s == "":
                raise InvalidRequestError("stop", "stop strings must be non-empty strings")
        for t in self.stop_token_ids:
            _check_int(t, "stop_token_ids", lo=0)
            if t >= vocab_size:
                raise InvalidRequestError("stop_token_ids", f"token id {t} >= vocab size {vocab_size}")
        if self.logprobs is not None:
            _check_int(self.logprobs, "logprobs", lo=0)
            if self.logprobs > 20:
                raise InvalidRequestError("logprobs", "at most 20 top logprobs")
        self._validate_structured(vocab_size)
        self._validate_logit_bias(vocab_size)
        if self.prompt_logprobs is not None:
            _check_int(self.prompt_logprobs, "prompt_logprobs", lo=0)
            if self.prompt_logprobs > 20:
                raise InvalidRequestError("prompt_logprobs", "at most 20 top logprobs")

    def _validate_structured(self, vocab_size: int) -> None:
        if self.structured is None:
            return
        if not isinstance(self.structured, StructuredOutput):
            raise InvalidRequestError("structured_outputs", "must be a StructuredOutput")
        self.structured.validate()
        after = self.structured.after_token
        if after is not None and after >= vocab_size:
            raise InvalidRequestError("structured_outputs.after_token",
                                      f"token id {after} >= vocab size {vocab_size}")
        if self.ignore_eos:
            raise InvalidRequestError(
                "ignore_eos", "cannot be combined with structured outputs (a grammar ends with EOS)"
            )
        if self.min_tokens:
            raise InvalidRequestError(
                "min_tokens", "cannot be combined with structured outputs (a grammar ends with EOS)"
            )

    def _validate_logit_bias(self, vocab_size: int) -> None:
        if not self.logit_bias:
            self.logit_bias = None
            return
        if not isinstance(self.logit_bias, dict):
            raise InvalidRequestError("logit_bias", "must map token ids to numbers")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise InvalidRequestError("logit_bias", f"at most {MAX_LOGIT_BIAS} tokens")
        for token, bias in self.logit_bias.items():
            _check_int(token, "logit_bias", lo=0)
            if token >= vocab_size:
                raise InvalidRequestError("logit_bias", f"token id {token} >= vocab size {vocab_size}")
            _check_float(bias, "logit_bias")
            if not -100.0 <= bias <= 100.0:
                raise InvalidRequestError("logit_bias", f"bias {bias} is outside [-100, 100]")


def _check_int(value: object, name: str, lo: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(name, f"must be an integer, got {value!r}")
    if value < lo:
        raise InvalidRequestError(name, f"must be >= {lo}, got {value}")


def _check_float(value: object, name: str, lo: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(name, f"must be a number, got {value!r}")
    if math.isnan(value) or math.isinf(value):
        raise InvalidRequestError(name, f"must be finite, got {value}")
    if lo is not None and value < lo:
        raise InvalidRequestError(name, f"must be >= {lo}, got {value}")
