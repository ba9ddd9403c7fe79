"""The engine's per-request detokenizer: ``tandem.common.text.detokenizer`` fed one token at a time.

Only the wiring lives here: the sampling params say which stop strings apply, whether the stop
string stays in the text, how many tokens come before any stop (``min_tokens``) and whether
special tokens are shown; the HF tokenizer supplies its ``tokenizers.Tokenizer`` backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from tandem.common.text.detokenizer import Detokenizer
from tandem.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class IncrementalDetokenizer:
    """Turns one request's output token ids into text deltas, honouring ``params.stop``.

    Invariant: the deltas returned by ``add`` plus ``flush()`` concatenate to ``text``.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | Tokenizer,
        prompt_token_ids: list[int],
        params: SamplingParams,
    ) -> None:
        self._core = Detokenizer(
            _backend(tokenizer),
            prompt_token_ids,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
            include_stop=params.include_stop_str_in_output,
            min_tokens=params.min_tokens,
        )

    @property
    def text(self) -> str:
        """All output text handed out so far (== the concatenated deltas)."""
        return self._core.text

    @property
    def stop_reason(self) -> str | None:
        """The stop string that matched, or None."""
        return self._core.stop_reason

    def add(self, token_id: int) -> str:
        """Append one output token; return the text it finalized (maybe ""). After a stop
        string matched, further tokens are ignored."""
        return self._core.add((token_id,))

    def flush(self) -> str:
        """On finish, release the held-back text and any split character (as U+FFFD)."""
        return self._core.flush()


def _backend(tokenizer: Any) -> Tokenizer:
    """The ``tokenizers.Tokenizer`` behind a transformers fast tokenizer (or itself)."""
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise TypeError(f"{type(tokenizer).__name__} has no tokenizers backend (not a fast one)")
    return backend
