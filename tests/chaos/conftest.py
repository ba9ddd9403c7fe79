"""Fixtures of the chaos tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.worker.step_hold import ENV as STEP_HOLD_ENV


@pytest.fixture
def steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The step hold's directory (tests/chaos/step_holds.py), in the environment the
    workers are started with."""
    d = tmp_path / "steps"
    d.mkdir()
    monkeypatch.setenv(STEP_HOLD_ENV, str(d))
    return d
