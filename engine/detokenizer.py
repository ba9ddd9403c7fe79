"""Incremental detokenization of one request's output, with stop strings.

Token ids arrive one at a time; text leaves in deltas that are never retracted::

    ids:   ... prompt tail | out0 out1 ... out(n-1) | new
                ^prefix_offset        ^read_offset
    prefix_text = decode(ids[prefix_offset:read_offset])
    new_text    = decode(ids[prefix_offset:])      -> delta = new_text[len(prefix_text):]

Decoding a few tokens of left context (as vLLM's ``detokenize_incrementally`` does) keeps
word-boundary spaces right and costs O(new tokens) per call. While ``new_text`` ends in U+FFFD
a multi-byte character is still split across tokens, so nothing is finalized yet.

Finalized text is then searched for stop strings (from the token after ``min_tokens`` on, as
vLLM does). The longest tail that could still grow into a stop string is held back, so a
stop-string prefix is never emitted and then cut off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Prompt tokens decoded as left context for the first output tokens (vLLM uses 5).
_PROMPT_CONTEXT = 5
# Drop consumed ids from the front once this many pile up.
_TRIM_AT = 256
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns one request's output token ids into text deltas, honouring ``params.stop``.

    Invariant: the deltas returned by ``add`` plus ``flush()`` concatenate to ``text``.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: list[int],
        params: SamplingParams,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = params.skip_special_tokens
        self._stops = [params.stop] if isinstance(params.stop, str) else list(params.stop)
        self._include_stop = params.include_stop_str_in_output
        self._min_tokens = params.min_tokens
        self._ids: list[int] = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        self._prefix_offset = 0  # ids[prefix_offset:read_offset] is decoded left context
        self._read_offset = len(self._ids)  # ids from here on are not finalized yet
        self._num_output = 0
        self._text = ""  # finalized output text, cut at a stop string once one matched
        self._emitted = 0  # chars of _text handed out so far
        self._out = ""  # == _text[:_emitted], kept so that .text costs nothing
        self._stop_reason: str | None = None

    @property
    def text(self) -> str:
        """All output text handed out so far (== the concatenated deltas)."""
        return self._out

    @property
    def stop_reason(self) -> str | None:
        """The stop string that matched, or None."""
        return self._stop_reason

    def add(self, token_id: int) -> str:
        """Append one output token; return the text it finalized (maybe ""). After a stop
        string matched, further tokens are ignored."""
        if self._stop_reason is not None:
            return ""
        self._ids.append(token_id)
        self._num_output += 1
        chunk = self._decode_new(final=False)
        if chunk:
            self._extend(chunk)
        if self._stop_reason is not None:
            return self._release(len(self._text))
        return self._release(len(self._text) - self._held_back())

    def flush(self) -> str:
        """On finish, release the held-back text and any split character (as U+FFFD)."""
        if self._stop_reason is None and self._read_offset < len(self._ids):
            chunk = self._decode_new(final=True)
            if chunk:
                self._extend(chunk)
        return self._release(len(self._text))

    # -- internals ----------------------------------------------------------------------------
    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(
            ids, skip_special_tokens=self._skip_special, clean_up_tokenization_spaces=False
        )

    def _decode_new(self, final: bool) -> str:
        """The text of ids[read_offset:], if finalized (or ``final``); advances the offsets."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) and not final:
            return ""  # e.g. a skipped special token: nothing to show yet
        if new_text.endswith(_REPLACEMENT) and not final:
            return ""  # a character is split across tokens: wait for the rest
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        if self._prefix_offset >= _TRIM_AT:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return new_text[len(prefix_text) :]

    def _extend(self, chunk: str) -> None:
        """Append finalized text and cut it at the earliest stop string that ends in it."""
        self._text += chunk
        if not self._stops or self._num_output <= self._min_tokens:
            return
        best: tuple[int, str] | None = None
        for stop in self._stops:
            # A new match must end inside chunk, so it starts at most len(stop)-1 chars earlier.
            i = self._text.find(stop, max(0, len(self._text) - len(chunk) - len(stop) + 1))
            if i != -1 and (best is None or i < best[0]):
                best = (i, stop)
        if best is not None:
            i, stop = best
            self._text = self._text[: i + len(stop) if self._include_stop else i]
            self._stop_reason = stop

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string.

        When the stop string is kept in the output nothing is ever cut, so nothing is held.
        """
        if not self._stops or self._include_stop:
            return 0
        longest = max(len(s) for s in self._stops) - 1
        if longest == 0:
            return 0
        tail = self._text[-longest:]
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(tail)), best, -1):
                if tail.endswith(stop[:n]):
                    best = n
                    break
        return best

    def _release(self, end: int) -> str:
        """Hand out _text up to ``end`` (never taking back what was handed out)."""
        end = max(end, self._emitted)
        delta = self._text[self._emitted : end]
        self._emitted = end
        self._out += delta
        return delta
