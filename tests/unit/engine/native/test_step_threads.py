"""The model runner's ``step_threads``: each fused step asks it for a thread count and reports
what the step took (tandem/engine/step_threads.py), and the tokens do not depend on the answer.
Also the decode worker's wiring of it (``choose_step_threads``): under a lease on an idle
prefill worker's cores (tandem/worker/core_lending.py), or between half and all of its own."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from tandem.engine import SamplingParams
from tandem.engine.native import load
from tandem.engine.step_threads import AdaptiveThreads
from tandem.worker.config import StartupError
from tandem.worker.core_lending import CoreLender, make_core_share_file
from tandem.worker.decode.app import choose_step_threads
from tests.unit.engine._reference import engine_token_ids

pytestmark = pytest.mark.skipif(load() is None, reason="native kernels unavailable here")

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def test_each_step_runs_on_the_threads_asked_and_the_tokens_do_not_change(
    make_engine, tiny_dir,
) -> None:
    path = str(tiny_dir("llama", 2))
    prompts = [list(range(3, 43)), [7, 8, 9], list(range(50, 61))]
    plain = make_engine(model=path, num_blocks=64, num_threads=1)
    want = engine_token_ids(plain, prompts, GREEDY)
    engine = make_engine(model=path, num_blocks=64, num_threads=1)
    assert engine.runner.fused is not None

    class OneThenTwo:  # steps alternate between one and two threads
        def __init__(self) -> None:
            self.asked: list[int] = []
            self.ran: list[tuple[int, int]] = []

        def choose(self, tokens: int) -> int:
            self.asked.append(tokens)
            return 1 + len(self.asked) % 2

        def observed(self, tokens: int, threads: int, seconds: float) -> None:
            assert seconds > 0
            self.ran.append((tokens, threads))

    rule = OneThenTwo()
    engine.runner.step_threads = rule
    assert engine_token_ids(engine, prompts, GREEDY) == want
    assert rule.asked == [40 + 3 + 11] + [3] * 11  # the three prompts' prefill, then decodes
    assert rule.ran == [(n, 1 + (i + 1) % 2) for i, n in enumerate(rule.asked)]


def test_the_decode_worker_borrows_through_the_share_file(make_engine, tiny_dir,
                                                          tmp_path: Path) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, num_threads=1)
    share = make_core_share_file(tmp_path)
    rule = choose_step_threads(engine.runner, str(share), adaptive=True)
    if rule is None:  # this process may use one core only: nothing to borrow
        assert len(os.sched_getaffinity(0)) == 1
        return
    assert isinstance(rule, AdaptiveThreads) and engine.runner.step_threads is rule
    assert rule.narrow.threads == 1 and rule.wide.threads == len(os.sched_getaffinity(0))
    assert rule.choose(64) == rule.wide.threads  # the lender is idle: the first step borrows
    lender = CoreLender(share)
    lender_done = threading.Event()

    def revoke() -> None:
        lender.set_busy(True)  # waits for the borrowed step in flight to end
        lender_done.set()

    waiter = threading.Thread(target=revoke)
    waiter.start()
    assert not lender_done.wait(0.05)  # the step has not ended: the lender still waits
    rule.observed(64, rule.wide.threads, 0.01)
    waiter.join(10)
    assert lender_done.is_set()
    assert rule.choose(64) == 1  # nothing is lent while the lender computes
    rule.observed(64, 1, 0.02)
    lender.set_busy(False)
    with pytest.raises(StartupError, match="core-share"):
        choose_step_threads(engine.runner, str(tmp_path / "missing"), adaptive=True)


def test_a_colocated_worker_chooses_between_half_and_all_its_threads(make_engine, tiny_dir,
                                                                    tmp_path: Path) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, num_threads=2)
    rule = choose_step_threads(engine.runner, None, adaptive=True)
    assert isinstance(rule, AdaptiveThreads)
    assert (rule.narrow.threads, rule.wide.threads) == (1, 2)
    assert choose_step_threads(engine.runner, None, adaptive=False) is None
    leased = choose_step_threads(engine.runner, str(make_core_share_file(tmp_path)),
                                 adaptive=False)  # the lease without measuring
    if len(os.sched_getaffinity(0)) > 2:
        assert leased is not None and leased.sizes == (2, len(os.sched_getaffinity(0)))
    one = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, num_threads=1)
    assert choose_step_threads(one.runner, None, adaptive=True) is None  # nothing to choose


def test_without_the_fused_forward_the_share_is_ignored_and_said(
    make_engine, tiny_dir, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64,
                         use_native_kernels=False)
    with caplog.at_level(logging.WARNING, logger="tandem.worker.decode.app"):
        assert choose_step_threads(engine.runner, str(make_core_share_file(tmp_path)),
                                   adaptive=True) is None
    assert engine.runner.step_threads is None
    assert "no effect" in caplog.text


def test_fixed_step_threads_with_a_share_borrow_whenever_lent(make_engine, tiny_dir,
                                                             tmp_path: Path) -> None:
    from tandem.engine.step_threads import LeasedThreads

    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, num_threads=1)
    rule = choose_step_threads(engine.runner, str(make_core_share_file(tmp_path)),
                               adaptive=False)
    if len(os.sched_getaffinity(0)) == 1:
        assert rule is None
        return
    assert isinstance(rule, LeasedThreads) and engine.runner.step_threads is rule
    assert rule.sizes == (1, len(os.sched_getaffinity(0)))
