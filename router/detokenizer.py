"""Incremental detokenization of one request's output, cut at stop strings.

Token ids arrive a few at a time; text leaves in deltas that are never retracted::

    ids:  [prompt tail | out0 ... out(n-1) | new ...]
           ^prefix      ^read
    delta = decode(ids[prefix:])[len(decode(ids[prefix:read])):]

Decoding with a little left context keeps word-boundary spaces right. While the new text ends
in U+FFFD a multi-byte character is still split across tokens, so nothing is released yet.
A tail that could still grow into a stop string is held back until it cannot, so text is
never emitted and then cut off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

_CONTEXT = 5  # prompt tokens decoded as left context for the first output tokens
_TRIM_AT = 256  # drop consumed ids from the front once this many pile up
_REPLACEMENT = "\ufffd"


class Detokenizer:
    """Output ids in, text deltas out; the deltas plus ``flush()`` concatenate to ``text``."""

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        prompt_ids: Sequence[int],
        stop: Sequence[str] = (),
        include_stop: bool = False,
    ) -> None:
        self._decode = decode
        self._ids: list[int] = list(prompt_ids[-_CONTEXT:])
        self._prefix = 0
        self._read = len(self._ids)
        self._stops = [s for s in stop if s]
        self._include_stop = include_stop
        self._text = ""  # finalized text (cut at a stop string once one matched)
        self._emitted = 0  # chars of _text handed out
        self.stop_reason: str | None = None

    @property
    def text(self) -> str:
        """All text handed out so far."""
        return self._text[: self._emitted]

    def add(self, token_ids: Sequence[int]) -> str:
        """Append output tokens; return the text they release (maybe "")."""
        for t in token_ids:
            if self.stop_reason is not None:
                break
            self._ids.append(t)
            self._finalize(self._decode_new())
        return self._release(final=False)

    def flush(self) -> str:
        """At the end of the stream: release whatever is held back."""
        if self.stop_reason is None and self._read < len(self._ids):
            tail = self._decode(self._ids[self._prefix :])
            head = self._decode(self._ids[self._prefix : self._read])
            self._finalize(tail[len(head) :])
        return self._release(final=True)

    def _decode_new(self) -> str:
        head = self._decode(self._ids[self._prefix : self._read])
        full = self._decode(self._ids[self._prefix :])
        if len(full) <= len(head) or full.endswith(_REPLACEMENT):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        if self._prefix > _TRIM_AT:
            del self._ids[: self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        return full[len(head) :]

    def _finalize(self, chunk: str) -> None:
        if not chunk:
            return
        start = max(0, len(self._text) - max((len(s) for s in self._stops), default=0))
        self._text += chunk
        best: tuple[int, str] | None = None
        for s in self._stops:
            at = self._text.find(s, start)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, s)
        if best is not None:
            at, s = best
            self._text = self._text[: at + len(s) if self._include_stop else at]
            self.stop_reason = s

    def _release(self, final: bool) -> str:
        end = len(self._text)
        if not final and self.stop_reason is None:
            end -= self._held_back()
        end = max(end, self._emitted)
        delta = self._text[self._emitted : end]
        self._emitted = end
        return delta

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        longest = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(self._text)), longest, -1):
                if self._text.endswith(s[:n]):
                    longest = n
                    break
        return longest
