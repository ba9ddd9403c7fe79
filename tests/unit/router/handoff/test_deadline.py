"""The request deadline carried to every worker call as its timeout."""

from __future__ import annotations

import pytest

from tandem.router.errors import DeadlineError
from tandem.router.handoff.deadline import Deadline


def test_deadline_counts_down_on_its_clock() -> None:
    now = [10.0]
    deadline = Deadline(2.0, clock=lambda: now[0])
    assert deadline.remaining() == 2.0
    now[0] = 11.5
    assert deadline.remaining() == 0.5
    now[0] = 12.0
    with pytest.raises(DeadlineError):
        deadline.remaining()
    assert Deadline(None).remaining() is None
