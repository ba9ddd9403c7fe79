"""What the KV connector's roles need from the engine that owns them, and nothing more.

The live-request table, forking and appending stay in ``LLMEngine``: its step does the same
with the same state (a request the decode role commits joins the batch the step runs). The
roles reach them through this protocol, never through the engine's private attributes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from tandem.engine.outputs import RequestOutput, SampleResult
from tandem.engine.request_factory import LiveRequest
from tandem.engine.sampling_params import SamplingParams


class LiveRequestHost(Protocol):
    """The engine's live requests: made (check), tracked (commit), looked up, forked, fed."""

    def new_live(
        self, request_id: str | None, prompt: str | Sequence[int], params: SamplingParams,
        hold_kv: bool = False, prior: int = 0, n: int = 1,
    ) -> LiveRequest:
        """A validated request under an unused id (None: a fresh one); nothing is tracked yet.
        Raises InvalidRequestError."""
        ...

    def track(self, live: LiveRequest) -> None:
        """The engine knows ``live`` from now on (its outputs, abort, stats)."""
        ...

    def live(self, request_id: str) -> LiveRequest:
        """A tracked request. Raises KeyError."""
        ...

    def untrack(self, request_id: str) -> LiveRequest:
        """Forget a tracked request (it has left the engine). Raises KeyError."""
        ...

    def fork(self, live: LiveRequest) -> list[LiveRequest]:
        """Sequences 1..n-1 of a running request whose prompt is computed, now running."""
        ...

    def append(self, live: LiveRequest, results: list[SampleResult]) -> RequestOutput:
        """Append sampled tokens to a running request; its output (retired when finished)."""
        ...
