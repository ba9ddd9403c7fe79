"""Which text each client message carries: the worker's own deltas when it sends them, else
the router's incremental detokenization.

A decode worker that sends text sends, over one leg, texts that concatenate to that leg's whole
output, the first token's text included (the first token itself arrived from the prefill
reply, whose text the router already emitted)::

    client:  [first: router "Hel"] [msg: worker "Hello"   -> "lo"] [msg: worker " world" -> " world"]

So per leg the router emits ``worker_text[len(emitted_this_leg):]``: never a repeat, and never a
retraction (a worker that holds text back just sends "" for a while).
"""

from __future__ import annotations

from tandem.common.text.detokenizer import Detokenizer
from tandem.router.request import Chunk


class TextStream:
    """Text deltas for a request's chunks, one leg after another."""

    def __init__(self, detokenizer: Detokenizer) -> None:
        self._detok = detokenizer
        self._worker_text = ""  # this leg's worker texts, concatenated
        self._emitted = ""  # what the client got during this leg
        self._worker_sends_text = False

    @property
    def stop_reason(self) -> str | None:
        """The stop string the router's detokenizer matched, if any."""
        return self._detok.stop_reason

    def delta(self, chunk: Chunk) -> str:
        """The text to send with ``chunk``."""
        if chunk.leg_start:
            self._worker_text = self._emitted = ""
            self._worker_sends_text = False
        router_delta = self._detok.add(chunk.token_ids)  # always fed: its state follows along
        if chunk.text:
            self._worker_sends_text = True
            self._worker_text += chunk.text
            out = self._worker_text[len(self._emitted) :]
        elif self._worker_sends_text:
            out = ""  # the worker is holding text back
        else:
            out = router_delta
        if chunk.finished and not self._worker_sends_text:
            out += self._detok.flush()
        self._emitted += out
        return out
