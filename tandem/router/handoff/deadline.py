"""A request's deadline, carried to every worker call as that call's timeout."""

from __future__ import annotations

import time
from collections.abc import Callable

from tandem.router.errors import DeadlineError


class Deadline:
    """Absolute expiry on a monotonic clock; ``None`` budget means no deadline."""

    def __init__(self, budget_s: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._expires = None if budget_s is None else clock() + budget_s

    def remaining(self) -> float | None:
        """Seconds left (the timeout for the next call); raises DeadlineError when none are."""
        if self._expires is None:
            return None
        left = self._expires - self._clock()
        if left <= 0:
            raise DeadlineError("deadline exceeded")
        return left
