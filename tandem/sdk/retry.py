"""When and how long to wait before retrying a failed call: jittered exponential backoff,
never past the call's deadline.

What is retried (the decision is pure; the clients do the waiting):

    Unavailable                      unary calls; streams only before their first chunk
    Overloaded with retry_after_s    the same, waiting at least retry_after_s
    Overloaded without retry info    never (the server did not invite a retry)
    anything else                    never

A retry whose wait would end at or after the deadline is not attempted: the caller gets the
last error at once instead of a sleep that can only end in DeadlineExceeded.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from tandem.sdk.errors import Overloaded, TandemError, Unavailable, from_rpc_error

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff shape. Attempt ``n`` (1-based) that failed waits a uniform random time in
    ``[0, min(max_backoff_s, initial_backoff_s * multiplier ** (n - 1))]`` ("full jitter", so
    clients that failed together do not retry together). ``max_attempts=1`` disables retries.
    """

    max_attempts: int = 4
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("retry.max_attempts must be >= 1")
        if not self.initial_backoff_s > 0 or not math.isfinite(self.initial_backoff_s):
            raise ValueError("retry.initial_backoff_s must be a positive number")
        if not self.max_backoff_s >= self.initial_backoff_s or not math.isfinite(
            self.max_backoff_s
        ):
            raise ValueError("retry.max_backoff_s must be >= initial_backoff_s")
        if not self.multiplier >= 1.0 or not math.isfinite(self.multiplier):
            raise ValueError("retry.multiplier must be >= 1")

    def backoff_cap_s(self, attempt: int) -> float:
        """The largest wait after failed attempt ``attempt`` (1-based)."""
        return min(self.max_backoff_s, self.initial_backoff_s * self.multiplier ** (attempt - 1))


def is_retryable(err: TandemError) -> bool:
    """Whether the server's answer invites another attempt (see the module table)."""
    if isinstance(err, Overloaded):
        return err.retry_after_s is not None
    return isinstance(err, Unavailable)


@dataclass(slots=True)
class Deadline:
    """An absolute end time on a monotonic clock (``None``: no deadline)."""

    expires_at: float | None
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def after(
        cls, timeout_s: float | None, clock: Callable[[], float] = time.monotonic
    ) -> Deadline:
        """A deadline ``timeout_s`` from now (None or infinite: none)."""
        if timeout_s is None or math.isinf(timeout_s):
            return cls(None, clock)
        return cls(clock() + timeout_s, clock)

    def remaining_s(self) -> float | None:
        """Seconds left (may be <= 0), or None without a deadline."""
        return None if self.expires_at is None else self.expires_at - self.clock()

    def timeout_s(self) -> float | None:
        """What to pass as a gRPC ``timeout``: the time left, floored at a millisecond so an
        expired deadline still yields a prompt DEADLINE_EXCEEDED from gRPC itself."""
        left = self.remaining_s()
        return None if left is None else max(left, 1e-3)


def next_delay(
    err: TandemError,
    attempt: int,
    policy: RetryPolicy,
    deadline: Deadline,
    rng: random.Random,
) -> float | None:
    """Seconds to wait before attempt ``attempt + 1``, or None to give up and raise ``err``.

    ``attempt`` is the 1-based number of the attempt that just failed with ``err``.
    """
    if attempt >= policy.max_attempts or not is_retryable(err):
        return None
    delay = rng.uniform(0.0, policy.backoff_cap_s(attempt))
    if isinstance(err, Overloaded) and err.retry_after_s is not None:
        delay = max(delay, err.retry_after_s)
    left = deadline.remaining_s()
    if left is not None and delay >= left:
        return None
    return delay


def call_with_retry(
    attempt_fn: Callable[[float | None], T],
    policy: RetryPolicy,
    deadline: Deadline,
    rng: random.Random,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run ``attempt_fn(timeout_s)`` until it returns, retrying as ``next_delay`` allows.

    A gRPC failure is raised as its typed ``TandemError`` (the ``grpc.RpcError`` chained).
    """
    attempt = 1
    while True:
        try:
            return attempt_fn(deadline.timeout_s())
        except grpc.RpcError as err:
            typed, cause = from_rpc_error(err), err
        delay = next_delay(typed, attempt, policy, deadline, rng)
        if delay is None:
            raise typed from cause
        sleep(delay)
        attempt += 1


async def acall_with_retry(
    attempt_fn: Callable[[float | None], Awaitable[T]],
    policy: RetryPolicy,
    deadline: Deadline,
    rng: random.Random,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """``call_with_retry`` for coroutines: ``await attempt_fn(timeout_s)`` with retries."""
    attempt = 1
    while True:
        try:
            return await attempt_fn(deadline.timeout_s())
        except grpc.RpcError as err:
            typed, cause = from_rpc_error(err), err
        delay = next_delay(typed, attempt, policy, deadline, rng)
        if delay is None:
            raise typed from cause
        await sleep(delay)
        attempt += 1
