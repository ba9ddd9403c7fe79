"""Stop strings over a stream of text chunks: cut at the first match, never retract a delta.

The text side of the detokenizer, with no tokenizer in sight::

    stop = "END OF ANSWER"
    chunk in:    "The answer"   " is 42."   " EN"     "D OF"        " ANSWER"
    held back:   ""             ""          "EN"      "END OF"      (matched: cut)
    delta out:   "The answer"   " is 42."   " "       ""            ""
    text:        "The answer is 42. "                                 stop_reason: the stop

A tail of the text that is a proper prefix of a stop string might still grow into one, so it
is held back until it cannot (or the stream ends): text handed out is never cut off later.
When the stop string is kept in the output (``include_stop``) a match never removes text that
came before it, so nothing is held back at all.

The match that ends first wins (of two ending at the same character, the longer one), so the
result does not depend on how the text was split into chunks.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStrings:
    """Text chunks in, final text deltas out; the deltas concatenate to ``text``.

    ``add`` searches only matches that end inside the new chunk (a chunk added with
    ``search=False`` can still be the start of a later match, but never holds the end of one).
    After a match, or after ``flush()``, further chunks are ignored.
    """

    def __init__(self, stops: str | Sequence[str] = (), include_stop: bool = False) -> None:
        if isinstance(stops, str):
            stops = (stops,)
        self._stops = tuple(dict.fromkeys(s for s in stops if s))  # "" would match anywhere
        self._include_stop = include_stop
        longest = max((len(s) for s in self._stops), default=0)
        self._hold_max = 0 if include_stop else max(longest - 1, 0)
        self._text = ""  # the text so far, cut at the stop string once one matched
        self._emitted = 0  # chars of _text handed out
        self._out = ""  # == _text[:_emitted], kept so that .text costs nothing
        self._stop_reason: str | None = None
        self._flushed = False

    @property
    def text(self) -> str:
        """All text handed out so far (== the concatenated deltas)."""
        return self._out

    @property
    def stop_reason(self) -> str | None:
        """The stop string that matched, or None."""
        return self._stop_reason

    @property
    def done(self) -> bool:
        """Whether the stream is over (a stop string matched, or ``flush()`` was called)."""
        return self._stop_reason is not None or self._flushed

    def add(self, chunk: str, search: bool = True) -> str:
        """Append ``chunk``; return the text that is now final (maybe ""). With ``search``
        false (e.g. before ``min_tokens``) no match may end inside this chunk."""
        if self.done or not chunk:
            return ""
        start = len(self._text)
        self._text += chunk
        if search and self._stops:
            self._cut_at_first_match(start)
        return self._release(final=self._stop_reason is not None)

    def flush(self) -> str:
        """At the end of the stream: release what is held back."""
        delta = self._release(final=True)
        self._flushed = True
        return delta

    # -- internals ----------------------------------------------------------------------------
    def _cut_at_first_match(self, start: int) -> None:
        """Cut the text at the first-ending match that ends after ``start``."""
        best: tuple[int, int, str] | None = None  # (end, begin, stop)
        for stop in self._stops:
            # A match ending after `start` begins at most len(stop) - 1 chars before it.
            begin = self._text.find(stop, max(0, start - len(stop) + 1))
            if begin == -1:
                continue
            end = begin + len(stop)
            if best is None or (end, begin) < best[:2]:
                best = (end, begin, stop)
        if best is not None:
            end, begin, stop = best
            self._text = self._text[: end if self._include_stop else begin]
            self._stop_reason = stop

    def _release(self, final: bool) -> str:
        """Hand out the text up to what is held back (all of it when ``final``)."""
        end = len(self._text) if final else len(self._text) - self._held_back()
        end = max(end, self._emitted)  # never take back what was handed out
        delta = self._text[self._emitted : end]
        self._emitted = end
        self._out += delta
        return delta

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        if self._hold_max == 0:
            return 0
        tail = self._text[-self._hold_max :]
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(tail)), best, -1):
                if tail.endswith(stop[:n]):
                    best = n
                    break
        return best
