"""Routing policies: pure functions from worker load snapshots to a ranked choice.

Each returns candidates best first, so the handoff can move on to the next one when a worker
refuses (RESOURCE_EXHAUSTED) or fails, without asking the policy again.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from tandem.placement.worker_view import WorkerView


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """KV blocks a sequence of ``num_tokens`` occupies."""
    return -(-num_tokens // block_size)


def rank_decode(
    workers: Sequence[WorkerView],
    num_tokens: int,
    block_size: int,
    exclude: Collection[str] = (),
    matched: Mapping[str, int] | None = None,
    slack: int = 4,
) -> list[WorkerView]:
    """Decode workers best first: the prefix holder unless it is overloaded, then those with
    room for the request, least busy, most free blocks.

    ``matched``: leading prompt blocks each endpoint holds (tandem/router/handoff/held_blocks.py).
    The worker holding the longest prefix goes first when it has room and its queue is at
    most ``slack`` deeper than the least busy worker's with room: its Reserve reuses those
    blocks, so the prefill pushes (or computes locally) only the rest. Deeper than that, it
    is overloaded and ranked by load like the others. A worker that has not reported its
    capacity yet is assumed to have room; workers without room come last (their stats may be
    stale; Reserve has the final word).
    """
    need = blocks_needed(num_tokens, block_size)
    matched = matched or {}

    def fits(w: WorkerView) -> bool:  # its cached prefix blocks need no new ones
        return w.num_blocks == 0 or w.num_free_blocks >= need - matched.get(w.endpoint, 0)

    def key(w: WorkerView) -> tuple[bool, int, int, str]:
        return (not fits(w), w.queue_depth, -w.num_free_blocks, w.endpoint)

    ranked = sorted((w for w in workers if w.endpoint not in exclude), key=key)
    roomy = [w for w in ranked if fits(w)]
    if not roomy or not matched:
        return ranked
    least = roomy[0].queue_depth
    holders = [w for w in roomy
               if matched.get(w.endpoint, 0) > 0 and w.queue_depth <= least + slack]
    if not holders:
        return ranked
    best = max(holders, key=lambda w: matched[w.endpoint])  # ties: the less busy (stable)
    return [best, *(w for w in ranked if w is not best)]


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
