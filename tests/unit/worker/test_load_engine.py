"""tandem.worker.app.load_engine: the model loads and warms up (tandem/engine/warmup.py) before a worker
serves; a warm-up that fails stops the start with a StartupError naming it."""

from __future__ import annotations

import pytest

from tandem.engine import EngineConfig
from tandem.worker import app
from tandem.worker.config import StartupError


def test_the_engine_comes_warm(tiny_dir) -> None:
    engine = app.load_engine(EngineConfig.from_kwargs(model=str(tiny_dir("llama", 2)),
                                                      num_blocks=64, block_size=16))
    costs = engine.stats().step_costs
    assert costs.base_s is not None and costs.per_row_s is not None
    assert engine.stats().num_steps == 0  # counters restart after the warm-up


def test_skipping_the_warm_up_leaves_no_fit(tiny_dir) -> None:
    engine = app.load_engine(EngineConfig.from_kwargs(model=str(tiny_dir("llama", 2)),
                                                      num_blocks=64, block_size=16),
                             warmup=False)
    assert engine.stats().step_costs.base_s is None


def test_a_failing_warm_up_is_a_startup_error(tiny_dir, monkeypatch) -> None:
    def broken(engine):
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(app, "warm_up", broken)
    with pytest.raises(StartupError, match="warm-up failed.*no kernel for this shape"):
        app.load_engine(EngineConfig.from_kwargs(model=str(tiny_dir("llama", 2)),
                                                 num_blocks=64, block_size=16))
