"""What the router's metrics record of one request: its clock, its tokens' timings, its outcome.

    arrival -> queued -> admitted (queue_time) -> first chunk (ttft) -> chunks (itl, tokens)
            -> each sequence's last message (usage, timings, tpot) -> the request's outcome
               (succeeded with its finish reason, e2e) | failed | deadline

The front door (tandem/router/frontend.py) calls these as a generation moves; the figures are the
ones a TTFT/TPOT target is met or missed on (docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.router.api.response import Timings, Usage
from tandem.router.errors import DeadlineError
from tandem.router.handoff.deadline import Deadline
from tandem.router.metrics import RouterMetrics
from tandem.router.request import HandoffReport

log = logging.getLogger(__name__)

# gRPC cancels a call right at its deadline, a hair before the router's own clock (started a
# little later) says it passed: a cancellation this close to the deadline is the deadline.
_DEADLINE_SLACK_S = 0.05


def deadline_passed(deadline: Deadline) -> bool:
    """Whether a cancelled request was cut off by its deadline rather than by its client."""
    try:
        left = deadline.remaining()
    except DeadlineError:
        return True
    return left is not None and left <= _DEADLINE_SLACK_S


@dataclass(slots=True)
class RequestClock:
    """Phase boundaries of one request (perf_counter seconds)."""

    arrival: float
    queued: float
    admitted: float = 0.0
    first: float = 0.0
    ended: bool = False  # its outcome is counted


class RequestAccounting:
    """Records requests into ``metrics`` (one per router)."""

    def __init__(self, metrics: RouterMetrics) -> None:
        self.metrics = metrics

    def failed(self, exc: BaseException, deadline: Deadline) -> None:
        """A request that ended by raising ``exc``; a cancellation at its deadline is the
        deadline's doing (gRPC cancels the call then), any other the client's."""
        if isinstance(exc, (asyncio.CancelledError, GeneratorExit)) and deadline_passed(deadline):
            self.metrics.finished("deadline")
        else:
            self.metrics.failed(exc)

    def chunk(self, token_ids: Sequence[int], clock: RequestClock, last: float) -> float:
        """TTFT on the request's first chunk, ITL between a sequence's chunks with tokens
        (``last``: its previous such chunk's time, 0 for none); returns the new ``last``."""
        now = time.perf_counter()
        metrics = self.metrics
        if not clock.first:
            clock.first = now
            metrics.ttft.observe(now - clock.arrival)
        elif token_ids and last:
            metrics.itl.observe(now - last)
        if token_ids:
            metrics.generation_tokens.inc(len(token_ids))
            return now
        return last

    def finish(
        self,
        finish_reason: str,
        prompt_tokens: int,
        report: HandoffReport,
        completion: int,
        clock: RequestClock,
        last: bool = True,
    ) -> tuple[Usage, Timings]:
        """A sequence's last message (finished for ``finish_reason``): its usage and timings;
        the request's outcome is counted with its ``last`` sequence."""
        end = time.perf_counter()
        log.debug("finished (%s): %d prompt + %d completion tokens in %.3f s",
                  finish_reason, prompt_tokens, completion, end - clock.arrival)
        self.metrics.request_generation_tokens.observe(completion)
        if completion > 1:  # the sequence's own TPOT: what a TPOT target is met or missed on
            self.metrics.tpot.observe((end - clock.first) / (completion - 1))
        if last:
            clock.ended = True
            self.metrics.succeeded(finish_reason)
            self.metrics.e2e.observe(end - clock.arrival)
        usage = Usage(
            prompt_tokens=prompt_tokens,
            completion_tokens=completion,
            cached_tokens=report.cached_tokens,
        )
        timings = Timings(
            queue_s=clock.admitted - clock.queued,
            prefill_s=report.prefill_s,
            transfer_s=report.transfer_s,
            first_token_s=clock.first - clock.arrival,
            decode_s=end - clock.first,
            total_s=end - clock.arrival,
        )
        return usage, timings
