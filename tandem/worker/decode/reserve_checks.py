"""What a Reserve must satisfy before anything is allocated (its input is the router's,
checked as hostile): a request id the engine can use, a sequence count in bounds, and for a
live move's pre-copy (``precopy``) whole blocks of one plain sequence."""

from __future__ import annotations

from collections.abc import Sequence

from tandem.common.wire import MAX_SEQUENCES
from tandem.engine.core.request import FORK_SEPARATOR
from tandem.worker.errors import BadRequest


def check_reserve(request_id: str, token_ids: Sequence[int], n: int, prior_output_tokens: int,
                  moved_in: bool, precopy: bool, block_size: int) -> None:
    """Raise BadRequest naming the first field a Reserve gets wrong."""
    check_request_id(request_id)
    if not 1 <= n <= MAX_SEQUENCES:
        raise BadRequest("n", f"{n} sequences, not 1..{MAX_SEQUENCES}")
    if precopy and (n != 1 or prior_output_tokens or moved_in
                    or not token_ids or len(token_ids) % block_size):
        raise BadRequest("precopy", "a pre-copy reserves whole blocks of tokens, with one "
                         "sequence, no prior output tokens and not moved_in")


def check_request_id(request_id: str) -> None:
    """Raise BadRequest unless ``request_id`` is 1..256 characters without the engine's fork
    separator."""
    if not request_id or len(request_id) > 256:
        raise BadRequest("request_id", "must be 1..256 characters")
    if FORK_SEPARATOR in request_id:  # the engine names forked sequences with it
        raise BadRequest("request_id", f"must not contain {FORK_SEPARATOR!r}")
