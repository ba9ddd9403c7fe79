"""How many LoRA adapters a follower rank holds at most: rank 0's ``--max-cpu-loras``, or, for a
test, a lower bound on one rank, so that rank refuses an adapter rank 0 accepted and the test
sees the group undo the load and serve on (tests/integration/test_tp_handoff.py).

The lower bound is off unless the worker was started with ``TANDEM_TEST_RANK_LORA_SLOTS`` in
its environment, which only whoever starts the process can set: no RPC, flag, peer or client
can turn it on, and with it unset (every deployment) every rank holds rank 0's bound. With it
set to ``RANK:SLOTS`` the follower of rank RANK holds at most SLOTS adapters; the refusal is
the manager's own (tandem/engine/lora/manager.py ``add``), as for a follower whose adapter
slots are full.
"""

from __future__ import annotations

import os

ENV = "TANDEM_TEST_RANK_LORA_SLOTS"


def rank_lora_slots(rank: int, bound: int | None) -> int | None:
    """The adapters rank ``rank`` holds at most (None: no bound), ``bound`` being rank 0's.
    Raises ValueError when the environment's value is not ``RANK:SLOTS``."""
    value = os.environ.get(ENV)
    if not value:
        return bound
    try:
        which, slots = (int(part) for part in value.split(":"))
    except ValueError:
        raise ValueError(f"{ENV}={value!r}: expected RANK:SLOTS") from None
    if slots < 1:
        raise ValueError(f"{ENV}={value!r}: SLOTS must be >= 1")
    return slots if which == rank else bound
