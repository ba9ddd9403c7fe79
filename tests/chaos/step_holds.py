"""The test-only step hold (tandem/worker/step_hold.py) from a chaos test's side: hold every
worker's steps once a request has ``k`` output tokens, wait until the clients have them, lift.
The ``steps`` fixture (tests/chaos/conftest.py) puts the hold's directory in the environment
the workers are started with."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tandem.launcher.local_cluster import Proc
from tests.integration.sdk_cluster import wait_until, worker_stats

K = 2  # output tokens a held stream stops at: its second is its decode worker's


def hold_steps(steps: Path, k: int = K) -> None:
    """No request steps past ``k`` output tokens from now on (the file written whole); a
    hold standing already is replaced (a higher ``k``: each held worker takes its next step)."""
    (steps / "hold.partial").write_text(str(k))
    (steps / "hold.partial").rename(steps / "hold")


def lift_steps(steps: Path) -> None:
    """Every worker steps again."""
    (steps / "hold").unlink()


def reached(*received: Callable[[], int], k: int = K) -> None:
    """Wait until each stream's client has ``k`` tokens (held there: no more come)."""
    wait_until(lambda: all(r() >= k for r in received), timeout=120)


def holder(*decoders: Proc) -> Proc:
    """The one decode worker running a stream now."""
    (busy,) = [d for d in decoders if worker_stats(d, "decode").num_running]
    return busy
