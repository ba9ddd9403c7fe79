"""One step's chunks of local prefill on a simulated decode worker, under its token budget.

The decode worker (tandem/planner/sim/decode.py) prefills prompts in its own queue a chunk
a step, beside its running rows: a step takes ``budget`` prompt tokens at most, from the
queue's head in FIFO order, the last prompt taken cut at what is left of the budget::

    queue:  A (300 left)  B (40 left)  C (500 left)      budget 384
    chunks: (A, 300)      (B, 40)      (C, 44)

A chunk of ``n`` tokens after ``done`` already computed attends ``n x done`` cached keys
plus ``n (n + 1) / 2`` of its own (causal): the query-key pairs the step's cost model
charges (tandem/planner/fit.prefill_context; the prefill worker sums them the same way).
"""

from __future__ import annotations

from collections.abc import Iterable

from tandem.planner.sim.request import SimRequest


def plan_chunks(queue: Iterable[SimRequest], budget: int
                ) -> tuple[list[tuple[SimRequest, int]], int, float]:
    """``(chunks, tokens, pairs)`` of one step: each ``(request, tokens it computes)`` from
    ``queue``'s head (``req.job_done`` of ``req.tokens`` done), their tokens summed (at
    most ``budget``) and their query-key pairs summed."""
    chunks: list[tuple[SimRequest, int]] = []
    tokens, pairs = 0, 0.0
    for req in queue:
        done = req.job_done
        take = req.tokens - done
        if take > budget:
            take = budget
        chunks.append((req, take))
        tokens += take
        pairs += take * done + take * (take + 1) / 2
        budget -= take
        if budget == 0:
            break
    return chunks, tokens, pairs
