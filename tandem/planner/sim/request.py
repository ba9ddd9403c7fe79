"""One simulated request's mutable state, as it moves through the queues.

A request holds at most one leg at a time: a reservation on a decode worker (``decode``)
and the prefill job filling it, remote (``job_p``) or local. A migration or a failed
prefill starts a new leg (``leg`` + 1); events and queue entries of an older leg carry its
number and are ignored when they come due, so nothing has to be dug out of a heap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tandem.planner.sim.decode import DecodeWorker
    from tandem.planner.sim.prefill import PrefillWorker

NAN = math.nan


@dataclass(slots=True, eq=False)
class SimRequest:
    """A trace request plus where it is and what happened to it (times in seconds)."""

    index: int
    arrival_s: float
    prompt: int
    output: int
    group: int  # prefix group (-1: none) and its shared tokens
    prefix: int
    need_blocks: int  # KV blocks of prompt + output: what a reservation holds
    # The group the next turn of this conversation reads, and how many tokens of this
    # turn's prompt + reply it shares (-1, 0: no next turn).
    next_group: int = -1
    next_prefix: int = 0
    leg: int = 0
    sent: int = 0  # tokens the client has received
    tokens: int = 0  # what this leg prefills: prompt + tokens sent before it
    decode: DecodeWorker | None = None
    d_cached: int = 0  # tokens of the prompt the decode worker already held (its Reserve)
    private_blocks: int = 0  # blocks reserved beyond the cached prefix
    pinned: bool = False  # holds a reference on the decode worker's prefix entry
    job_p: PrefillWorker | None = None  # the prefill worker with this leg's job queued
    job_done: int = -1  # tokens of ``tokens`` computed (-1: the job has not started)
    job_est: int = 0  # tokens the job was expected to compute when queued
    job_queued_s: float = 0.0  # when the job was queued on its prefill worker
    p_attempts: int = 0  # remote prefill attempts of this leg
    dispatch_s: float = 0.0
    predicted_s: float = -1.0  # cost_model.predict_remote's TTFT of the chosen prefill worker
    # A local prefill the model placed: its predicted compute (Prediction.compute_s), to
    # learn from when its first token comes (-1: nothing to learn, as for a fallback).
    local_predicted_s: float = -1.0
    first_token_s: float = NAN
    leg_token_s: float = NAN  # when this leg's first token reached the router
    finish_s: float = NAN
    itl_max_s: float = 0.0
    join_step: int = 0  # the decode step it joined the batch at, and its context then
    join_ctx: int = 0
    decision: str = ""  # the first placement's, as counted in tandem_disagg_decision_total
    reason: str = ""
    prefill_endpoint: str = ""
    decode_endpoint: str = ""
    pushed_bytes: int = 0
    migrations: int = 0
    carry_kv: bool = False  # its next reservation receives its KV by live migration
    completed: bool = False
    failed: str = ""  # why it never completed ("" while it may)

    @property
    def remaining(self) -> int:
        """Tokens still to send."""
        return self.output - self.sent
