"""Backoff decisions and the retry loop, on a fake clock: jittered, capped, never past the
deadline, and only for the statuses that invite a retry."""

from __future__ import annotations

import asyncio
import random

import grpc
import pytest

from tandem.sdk.errors import (
    DeadlineExceeded,
    Internal,
    InvalidRequest,
    Overloaded,
    Unavailable,
)
from tandem.sdk.retry import (
    Deadline,
    RetryPolicy,
    acall_with_retry,
    call_with_retry,
    is_retryable,
    next_delay,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.sleeps.append(s)
        self.now += s

    async def asleep(self, s: float) -> None:
        self.sleep(s)


class _CallError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, trailers=()) -> None:
        self._code, self._trailers = code, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._code.name.lower()

    def trailing_metadata(self):
        return self._trailers


def test_policy_validation() -> None:
    RetryPolicy()
    for bad in (
        {"max_attempts": 0},
        {"initial_backoff_s": 0},
        {"initial_backoff_s": float("nan")},
        {"initial_backoff_s": 1.0, "max_backoff_s": 0.5},
        {"multiplier": 0.5},
    ):
        with pytest.raises(ValueError):
            RetryPolicy(**bad)


def test_backoff_cap_grows_exponentially_to_the_max() -> None:
    p = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=1.0, multiplier=2.0)
    assert [p.backoff_cap_s(n) for n in range(1, 6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0])


def test_what_is_retryable() -> None:
    assert is_retryable(Unavailable("x"))
    assert is_retryable(Overloaded("x", retry_after_s=0.2))
    assert not is_retryable(Overloaded("x", retry_after_s=None))
    for err in (InvalidRequest("x"), DeadlineExceeded("x"), Internal("x")):
        assert not is_retryable(err)


def test_full_jitter_stays_within_the_cap() -> None:
    p = RetryPolicy(max_attempts=10, initial_backoff_s=0.1, max_backoff_s=1.0)
    rng = random.Random(7)
    no_deadline = Deadline(None)
    for attempt in range(1, 10):
        delays = [next_delay(Unavailable("x"), attempt, p, no_deadline, rng) for _ in range(200)]
        assert all(d is not None and 0 <= d <= p.backoff_cap_s(attempt) for d in delays)
        assert len(set(delays)) > 150  # jittered, not one fixed value


def test_overloaded_waits_at_least_retry_after() -> None:
    p = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.02)
    d = next_delay(Overloaded("x", retry_after_s=0.5), 1, p, Deadline(None), random.Random(0))
    assert d == 0.5


def test_no_retry_when_the_wait_reaches_the_deadline() -> None:
    clock = FakeClock()
    p = RetryPolicy(initial_backoff_s=0.01, max_backoff_s=0.02)
    err = Overloaded("x", retry_after_s=0.5)
    assert next_delay(err, 1, p, Deadline(clock() + 0.4, clock), random.Random(0)) is None
    assert next_delay(err, 1, p, Deadline(clock() + 0.6, clock), random.Random(0)) == 0.5


def test_no_retry_after_the_last_attempt() -> None:
    p = RetryPolicy(max_attempts=3)
    rng = random.Random(0)
    assert next_delay(Unavailable("x"), 2, p, Deadline(None), rng) is not None
    assert next_delay(Unavailable("x"), 3, p, Deadline(None), rng) is None


def test_deadline_after() -> None:
    clock = FakeClock()
    assert Deadline.after(None, clock).remaining_s() is None
    assert Deadline.after(float("inf"), clock).timeout_s() is None
    d = Deadline.after(2.0, clock)
    assert d.remaining_s() == 2.0
    clock.now += 5
    assert d.remaining_s() == -3.0 and d.timeout_s() == 1e-3  # gRPC still gets a deadline


def test_call_with_retry_recovers_from_unavailable() -> None:
    clock = FakeClock()
    timeouts: list[float | None] = []

    def attempt(timeout: float | None) -> str:
        timeouts.append(timeout)
        if len(timeouts) < 3:
            raise _CallError(grpc.StatusCode.UNAVAILABLE)
        return "ok"

    out = call_with_retry(attempt, RetryPolicy(), Deadline.after(10.0, clock), random.Random(1),
                          clock.sleep)
    assert out == "ok" and len(clock.sleeps) == 2
    # Each attempt gets the time left, not the whole budget again.
    assert timeouts[0] == 10.0 and timeouts[2] == pytest.approx(10.0 - sum(clock.sleeps))


@pytest.mark.parametrize("seed", range(20))
def test_retries_never_sleep_past_the_deadline(seed: int) -> None:
    clock = FakeClock()
    policy = RetryPolicy(max_attempts=1000, initial_backoff_s=0.05, max_backoff_s=0.3)
    start = clock()

    def attempt(timeout: float | None) -> None:
        assert timeout is not None and timeout > 0
        clock.now += 0.01  # the failed attempt itself takes a little time
        raise _CallError(grpc.StatusCode.UNAVAILABLE)

    with pytest.raises(Unavailable) as err:
        call_with_retry(attempt, policy, Deadline.after(1.0, clock), random.Random(seed),
                        clock.sleep)
    assert isinstance(err.value.__cause__, grpc.RpcError)
    assert clock() - start < 1.0 + 0.01  # at most one attempt's time past the last sleep
    assert len(clock.sleeps) >= 3


def test_non_retryable_errors_raise_at_once() -> None:
    clock = FakeClock()
    calls = []

    def attempt(timeout: float | None) -> None:
        calls.append(timeout)
        raise _CallError(grpc.StatusCode.INVALID_ARGUMENT)

    with pytest.raises(InvalidRequest):
        call_with_retry(attempt, RetryPolicy(), Deadline(None), random.Random(0), clock.sleep)
    assert len(calls) == 1 and clock.sleeps == []


def test_overload_without_retry_info_is_not_retried() -> None:
    clock = FakeClock()
    calls = []

    def attempt(timeout: float | None) -> None:
        calls.append(1)
        raise _CallError(grpc.StatusCode.RESOURCE_EXHAUSTED)

    with pytest.raises(Overloaded) as err:
        call_with_retry(attempt, RetryPolicy(), Deadline(None), random.Random(0), clock.sleep)
    assert err.value.retry_after_s is None and len(calls) == 1


def test_async_retry_honours_retry_after() -> None:
    clock = FakeClock()
    calls = []

    async def attempt(timeout: float | None) -> int:
        calls.append(timeout)
        if len(calls) == 1:
            raise _CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, (("retry-after-ms", "300"),))
        return 7

    out = asyncio.run(acall_with_retry(attempt, RetryPolicy(initial_backoff_s=0.01,
                                                            max_backoff_s=0.01),
                                       Deadline.after(5.0, clock), random.Random(0),
                                       clock.asleep))
    assert out == 7 and clock.sleeps == [0.3]
