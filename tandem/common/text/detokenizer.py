"""Incremental detokenization of one request's output, cut at stop strings.

Token ids arrive a few at a time; text leaves in deltas that are never retracted::

    ids:  [prompt tail | out0 ... out(k-1) | out(k) ... out(n-1)]
           ^ context (left context of the pending ids)   ^ pending: no text out yet
    DecodeStream.step:  decode(context + pending)[len(decode(context)):]
                        -> None while that ends in U+FFFD (a character split across tokens)
    text chunk -> StopStrings (stop match + hold-back) -> delta

Decoding with a few tokens of left context keeps word-boundary spaces right and costs
O(new tokens) per step; ``tokenizers.decoders.DecodeStream`` does exactly that in Rust. Where
it cannot (a context ending inside a character, a decoder whose text is not prefix-stable) the
same arithmetic runs here by hand until the next chunk. Stop strings are searched only once
more than ``min_tokens`` output tokens were added.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from tandem.common.text.stop_strings import StopStrings

PROMPT_CONTEXT = 5  # prompt tokens decoded as left context for the first output tokens
_REPLACEMENT = "\ufffd"


class Detokenizer:
    """Output ids in, text deltas out; the deltas plus ``flush()`` concatenate to ``text``.

    After a stop string matched (``stop_reason``) or ``flush()`` was called, further tokens
    are ignored.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        *,
        skip_special_tokens: bool = True,
        stop: str | Sequence[str] = (),
        include_stop: bool = False,
        min_tokens: int = 0,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._min_tokens = min_tokens
        self._num_output = 0
        self._context: list[int] = list(prompt_ids[-PROMPT_CONTEXT:])
        self._pending: list[int] = []
        self._stream = self._open_stream()
        self._stops = StopStrings(stop, include_stop)

    @property
    def text(self) -> str:
        """All output text handed out so far (== the concatenated deltas)."""
        return self._stops.text

    @property
    def stop_reason(self) -> str | None:
        """The stop string that matched, or None."""
        return self._stops.stop_reason

    def add(self, token_ids: Sequence[int]) -> str:
        """Append output tokens; return the text they release (maybe "")."""
        delta = ""
        for token_id in token_ids:
            if self._stops.done:
                break
            self._num_output += 1
            self._pending.append(token_id)
            chunk = self._step(token_id)
            if chunk:
                delta += self._stops.add(chunk, search=self._num_output > self._min_tokens)
        return delta

    def flush(self) -> str:
        """At the end of the stream: release what is held back, and a character still split
        across tokens (as U+FFFD)."""
        delta = ""
        if not self._stops.done and self._pending:
            head = self._decode(self._context)
            chunk = self._decode(self._context + self._pending)[len(head) :]
            delta = self._stops.add(chunk, search=self._num_output > self._min_tokens)
        return delta + self._stops.flush()

    # -- internals ----------------------------------------------------------------------------
    def _step(self, token_id: int) -> str | None:
        """The text the pending ids (``token_id`` last) complete, or None while they complete
        none; on text, the pending ids become the left context."""
        if self._stream is not None:
            try:
                chunk = self._stream.step(self._tokenizer, token_id)
            except Exception:  # tokenizers raises a bare Exception
                # DecodeStream refuses a decoder whose text for context + pending does not
                # start with the context's text; slicing by length is what we did before it.
                self._stream = None
            else:
                if chunk is not None:
                    self._context, self._pending = self._pending, []
                return chunk
        head = self._decode(self._context)
        full = self._decode(self._context + self._pending)
        if len(full) <= len(head) or full.endswith(_REPLACEMENT):
            return None
        self._context, self._pending = self._pending, []
        self._stream = self._open_stream()
        return full[len(head) :]

    def _open_stream(self) -> DecodeStream | None:
        """A DecodeStream that continues after ``_context``, or None to decode by hand.

        A context that ends inside a character (only a token-id prompt can) would make
        DecodeStream hand out the context's own text with the first chunk.
        """
        if self._context and self._decode(self._context).endswith(_REPLACEMENT):
            return None
        return DecodeStream(ids=self._context, skip_special_tokens=self._skip_special)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)
