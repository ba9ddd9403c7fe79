"""A forced ordering for tests of AsyncEngine's bookkeeping lock: hold the engine thread
inside the model's forward of its next step (the real forward, run once lifted), the lock
free meanwhile (tandem/engine/async_engine.py)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from tandem.engine.model_runner import ModelRunner


class ForwardHold:
    """Holds the next forward of ``runner`` (whose window an AsyncEngine set) until
    ``lift`` is set; ``inside`` is set once the engine thread is held there."""

    def __init__(self, runner: ModelRunner) -> None:
        self._window = runner.forward_window
        self._armed = True
        self.inside = threading.Event()
        self.lift = threading.Event()
        runner.forward_window = self._held

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        with self._window():
            if self._armed:
                self._armed = False
                self.inside.set()
                self.lift.wait(60)
            yield
