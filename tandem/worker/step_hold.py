"""A test-only pause of a worker's decode steps: a request held at a known token count, so a
chaos test can move it live (or drain its worker) while it is sure to be mid-stream, without
racing its end (tests/chaos/test_live_migration.py).

A decode worker honours it, and a flippable worker (tandem/worker/dual/) in either role: in
its prefill role a request asks for one output token, so a hold of k >= 2 never pauses it.

Off unless the worker was started with ``TANDEM_TEST_STEP_HOLD_DIR`` in its environment,
which only whoever starts the process can set: no RPC, flag, peer or client can turn it on,
and with it unset (every deployment) the engine thread is given no pause at all. With it set
to a directory: while ``<dir>/hold`` exists (its text: a token count k), the engine thread
(AsyncEngine's ``pause``) takes no step once a request it runs has k output tokens. Engine
calls still run meanwhile (suspend, commit, abort, stats), so a live move of a held request,
or a drain, completes; only the steps wait. No request passes k output tokens while the hold
stands: a test that sees k tokens at the client knows the stream is mid-way, and stays so::

    test: writes hold ("2") ──> requests ──> each worker: a request at 2 tokens, no more steps
    test: sees 2 tokens ──> moves the streams (or drains) ──> removes hold ──> steps again
"""

from __future__ import annotations

import os
from pathlib import Path

from tandem.engine.llm_engine import LLMEngine

ENV = "TANDEM_TEST_STEP_HOLD_DIR"


class StepHold:
    """The pause (see the module docstring) over one hold directory."""

    def __init__(self, directory: Path) -> None:
        self._hold = directory / "hold"

    @classmethod
    def from_env(cls) -> StepHold | None:
        """The hold the process's environment asks for (None unless ``ENV`` is set)."""
        value = os.environ.get(ENV)
        return cls(Path(value)) if value else None

    def paused(self, engine: LLMEngine) -> bool:
        """Whether the engine is to take no step now (called on the engine thread before
        each step)."""
        try:
            k = int(self._hold.read_text())
        except (FileNotFoundError, ValueError):  # none, or still being written
            return False
        return any(r.num_output_tokens >= k for r in engine.scheduler.running)
