"""Speculative decoding settings (torch-free, frozen, validated)."""

from __future__ import annotations

from dataclasses import dataclass

SPEC_METHODS = ("none", "ngram", "draft")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Which proposer guesses tokens, and how many per step.

    ``ngram``: prompt lookup over the request's own prompt + output (no model); the longest
    suffix of ``ngram_max`` down to ``ngram_min`` tokens that occurred before proposes the
    tokens that followed its latest occurrence: k of them after a match of ``ngram_max``
    tokens, half as many for each token shorter (tandem/engine/spec/ngram.py). ``draft``: a smaller
    model with the same tokenizer, either a checkpoint (``draft_model``) or the target's first
    ``draft_layers`` layers (shared weights).
    Requests opt out with ``SamplingParams(speculative=False)``.
    """

    speculative_method: str = "none"  # none | ngram | draft
    num_speculative_tokens: int = 4  # k: tokens proposed per step
    ngram_max: int = 4
    ngram_min: int = 1
    draft_model: str | None = None  # alias, HF directory or .gguf of the draft
    draft_layers: int = 0  # >0 and no draft_model: the target's first layers are the draft

    def __post_init__(self) -> None:
        if self.speculative_method not in SPEC_METHODS:
            raise ValueError(
                f"speculative_method must be one of {SPEC_METHODS}, got {self.speculative_method!r}"
            )
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("need 1 <= ngram_min <= ngram_max")
        if self.draft_layers < 0:
            raise ValueError("draft_layers must be >= 0")
        if self.speculative_method == "draft" and not (self.draft_model or self.draft_layers):
            raise ValueError("speculative_method 'draft' needs draft_model or draft_layers")

    @property
    def enabled(self) -> bool:
        """True when a proposer runs."""
        return self.speculative_method != "none"
