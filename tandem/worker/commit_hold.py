"""A test-only pause before a push's COMMIT: the window between a decode worker's reservation
and its commit, held open so a chaos test can kill the decode worker inside it without
racing the push (tests/chaos/test_decode_death_before_commit.py). Every push honours it: a
prefill worker's, and a decode worker's live move of a stream to another decode worker, its
pre-copy's and its stop-and-copy's alike (tandem/worker/decode/moves.py).

Off unless the worker was started with ``TANDEM_TEST_COMMIT_HOLD_DIR`` in its environment,
which only whoever starts the process can set: no RPC, flag, peer or client can turn it on,
and with it unset (every deployment) the hold is a no-op. With it set to a directory, before
committing a leg the worker looks for ``<dir>/hold``; if it is there the worker takes it
(removes it: one hold per file, so only the next leg waits), writes the leg's id to
``<dir>/held`` and waits until ``<dir>/release`` appears (and removes it)::

    test: touch hold ──> request ──> worker: hold taken, writes held, waits
    test: sees held ──> kills the decode worker ──> touch release ──> worker: COMMIT (fails)

The wait ends early if the Prefill (or MoveOut) call is cancelled (the router's bound, an Abort);
a PreCopy's push runs to its end whoever stops waiting, so its hold waits for the release.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

ENV = "TANDEM_TEST_COMMIT_HOLD_DIR"
POLL_S = 0.01  # how often a held push looks for the release file


class CommitHold:
    """The hold (see the module docstring); ``directory`` None: never holds."""

    def __init__(self, directory: Path | None = None) -> None:
        self._dir = directory

    @classmethod
    def from_env(cls) -> CommitHold:
        """The hold the process's environment asks for (none unless ``ENV`` is set)."""
        value = os.environ.get(ENV)
        return cls(Path(value) if value else None)

    async def before_commit(self, leg_id: str) -> None:
        """Wait here if a hold was asked for (returns at once otherwise)."""
        if self._dir is None:
            return
        try:
            (self._dir / "hold").unlink()
        except FileNotFoundError:
            return
        partial = self._dir / "held.partial"
        partial.write_text(leg_id)
        partial.rename(self._dir / "held")  # appears whole
        release = self._dir / "release"
        while not release.exists():
            await asyncio.sleep(POLL_S)
        release.unlink()
