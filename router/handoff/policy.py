"""Routing policies: pure functions from worker load snapshots to a ranked choice.

Each returns candidates best first, so the handoff can move on to the next one when a worker
refuses (RESOURCE_EXHAUSTED) or fails, without asking the policy again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from router.membership.worker_view import WorkerView


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """KV blocks a sequence of ``num_tokens`` occupies."""
    return -(-num_tokens // block_size)


def rank_decode(
    workers: Sequence[WorkerView],
    num_tokens: int,
    block_size: int,
    exclude: Collection[str] = (),
) -> list[WorkerView]:
    """Decode workers best first: those with room for the prompt, least busy, most free blocks.

    A worker that has not reported its capacity yet is assumed to have room. Workers without
    room still come last (their stats may be stale; Reserve has the final word).
    """
    need = blocks_needed(num_tokens, block_size)

    def key(w: WorkerView) -> tuple[bool, int, int, str]:
        fits = w.num_blocks == 0 or w.num_free_blocks >= need
        return (not fits, w.queue_depth, -w.num_free_blocks, w.endpoint)

    return sorted((w for w in workers if w.endpoint not in exclude), key=key)


def rank_prefill(
    workers: Sequence[WorkerView],
    owners: Sequence[tuple[str, int]],
    max_queue: int,
    exclude: Collection[str] = (),
) -> list[WorkerView]:
    """Prefill workers best first: prefix affinity, guarded by queue depth, then least loaded.

    ``owners`` are (endpoint, matched blocks) from PrefixAffinity.lookup, longest match first.
    The longest-matching owner whose queue depth is at most ``max_queue`` goes first; owners
    with deeper queues lose their affinity and are ranked by load like everyone else.
    """
    pool = [w for w in workers if w.endpoint not in exclude]
    by_endpoint = {w.endpoint: w for w in pool}
    sticky: WorkerView | None = None
    for endpoint, _depth in owners:
        w = by_endpoint.get(endpoint)
        if w is not None and w.queue_depth <= max_queue:
            sticky = w
            break
    rest = sorted((w for w in pool if w is not sticky), key=lambda w: (w.queue_depth, w.endpoint))
    return [sticky, *rest] if sticky is not None else rest
