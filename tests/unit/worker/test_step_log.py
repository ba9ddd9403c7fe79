"""A worker's ``--step-log``: a line per model step, read back by wall-clock window."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from tandem.engine import SamplingParams
from tandem.worker.app import attach_step_log
from tandem.worker.config import StartupError
from tandem.worker.step_log import StepLog, StepRecord, read_step_log


def test_an_engine_logs_each_step_with_its_rows_and_prompt_tokens(
    tiny_dir, make_engine, tmp_path: Path,
) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=64, block_size=16)
    path = tmp_path / "steps.jsonl"
    log = attach_step_log(engine, str(path))
    assert log is not None
    before = time.time()
    engine.add_request([5, 6, 7, 8, 9], SamplingParams(max_tokens=3, temperature=0.0,
                                                       ignore_eos=True))
    engine.add_request([11, 12], SamplingParams(max_tokens=2, temperature=0.0,
                                                ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    log.close()
    after = time.time()
    steps = read_step_log(path)
    assert len(steps) == engine.num_steps
    # the first step prefills both prompts (7 tokens); then one decode row per running
    # sequence, over its whole length so far
    assert [(s.rows, s.tokens, s.context) for s in steps] == [(0, 7, 7), (2, 0, 6 + 3), (1, 0, 7)]
    assert all(before <= s.start <= s.end <= after and s.seconds > 0 for s in steps)
    assert [s.start for s in steps] == sorted(s.start for s in steps)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_reading_keeps_the_window_and_skips_a_line_being_written(tmp_path: Path) -> None:
    path = tmp_path / "steps.jsonl"
    log = StepLog(path)
    log.record(1, 0, 30, 0.01)
    log.close()
    log.record(2, 0, 60, 0.01)  # after close: dropped
    (first,) = read_step_log(path)
    assert (first.rows, first.tokens, first.context, first.seconds) == (1, 0, 30, 0.01)
    lines = [
        '{"start": 100.0, "s": 1.0, "rows": 0, "tokens": 64, "context": 64}',
        '{"start": 101.0, "s": 0.5, "rows": 3, "tokens": 0, "context": 300}',
        '{"start": 102.0, "s": 2.0, "rows": 4, "tokens": 0, "context": 404}',
    ]
    path.write_text("\n".join(lines) + '\n{"start": 105.0, "s"')
    assert read_step_log(path) == [StepRecord(100.0, 1.0, 0, 64, 64),
                                   StepRecord(101.0, 0.5, 3, 0, 300),
                                   StepRecord(102.0, 2.0, 4, 0, 404)]
    assert read_step_log(path, since=100.5, until=103.0) == [StepRecord(101.0, 0.5, 3, 0, 300)]
    path.write_text(lines[0] + '\n{"start": 101.0}\n')
    with pytest.raises(ValueError, match=r"steps.jsonl:2: not a step record"):
        read_step_log(path)


def test_no_path_no_log_and_an_unopenable_one_stops_the_start(
    tiny_dir, make_engine, tmp_path: Path,
) -> None:
    engine = make_engine(model=str(tiny_dir("llama", 2)), num_blocks=16, block_size=16)
    assert attach_step_log(engine, None) is None and engine.step_costs.observer is None
    with pytest.raises(StartupError, match="cannot open --step-log"):
        attach_step_log(engine, str(tmp_path / "missing" / "steps.jsonl"))
