"""A worker's metrics label (``WorkerConfig.model_name``) without --served-model-name: the
router's default for the same --model, never a crash on the engine's nested config."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tandem.engine.config import EngineConfig
from tandem.worker.config import WorkerConfig


def _config(model: str, served: str = "") -> WorkerConfig:
    required = {f.name: None for f in dataclasses.fields(WorkerConfig)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    required.update(engine=EngineConfig.from_kwargs(model=model), served_model_name=served)
    return WorkerConfig(**required)


def test_model_name_defaults_like_the_router(tmp_path: Path) -> None:
    checkpoint = tmp_path / "tiny-llama"
    checkpoint.mkdir()
    assert _config("smollm2").model_name == "smollm2"
    assert _config(str(checkpoint)).model_name == "tiny-llama"
    assert _config(str(tmp_path / "model.Q4_1.gguf")).model_name == "model.Q4_1"
    assert _config("smollm2", served="my-model").model_name == "my-model"
