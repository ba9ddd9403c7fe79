"""The model runner's ``step_threads``: each fused step asks it for a thread count (a decode
worker borrowing an idle prefill worker's cores, tandem/worker/core_lending.py), and the tokens do not
depend on the answer. Also the decode worker's wiring of it (``borrow_cores``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tandem.engine import SamplingParams
from tandem.engine.native import load
from tandem.worker.config import StartupError
from tandem.worker.core_lending import BorrowedThreads, CoreLender, make_core_share_file
from tandem.worker.decode.app import borrow_cores
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
    asked: list[int] = []
    engine = make_engine(model=path, num_blocks=64, num_threads=1)
    assert engine.runner.fused is not None

    def one_then_two(rows: int) -> int:  # steps alternate between one and two threads
        asked.append(rows)
        return 1 + len(asked) % 2

    engine.runner.step_threads = one_then_two
    assert engine_token_ids(engine, prompts, GREEDY) == want
    assert asked == [40 + 3 + 11] + [3] * 11  # the three prompts' prefill, then their decodes


def test_the_decode_worker_borrows_through_the_share_file(make_engine, tiny_dir,
                                                          tmp_path: Path) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, num_threads=1)
    share = make_core_share_file(tmp_path)
    policy = borrow_cores(engine.runner, str(share), min_rows=4)
    assert isinstance(policy, BorrowedThreads) and engine.runner.step_threads is policy
    assert (policy.own, policy.min_rows) == (1, 4)
    lender = CoreLender(share)
    lender.set_busy(True)
    assert policy(64) == 1
    lender.set_busy(False)
    assert policy(64) == policy.borrowed and policy(3) == 1
    with pytest.raises(StartupError, match="core-share"):
        borrow_cores(engine.runner, str(tmp_path / "missing"), min_rows=4)


def test_without_the_fused_forward_the_share_is_ignored_and_said(
    make_engine, tiny_dir, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64,
                         use_native_kernels=False)
    with caplog.at_level(logging.WARNING, logger="tandem.worker.decode.app"):
        assert borrow_cores(engine.runner, str(make_core_share_file(tmp_path)), min_rows=8) \
            is None
    assert engine.runner.step_threads is None
    assert "no effect" in caplog.text
