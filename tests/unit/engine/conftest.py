"""Tiny perturbed checkpoints keyed by any options (rope_scaling dicts included), for every
engine test (the model families' and the native kernels')."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def family_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``family_dir(arch, **options)``: a tiny checkpoint (make_tiny_checkpoint), written once
    per session for each (arch, options)."""
    from tandem.engine.testing import make_tiny_checkpoint

    made: dict[str, Path] = {}

    def get(arch: str, **options: Any) -> Path:
        key = repr((arch, sorted(options.items())))
        if key not in made:
            made[key] = make_tiny_checkpoint(tmp_path_factory.mktemp(f"family-{arch}"),
                                             arch=arch, **options)
        return made[key]

    return get
