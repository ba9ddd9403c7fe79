"""Sampling defaults from the model's ``generation_config.json`` (vLLM's ``--generation-config
auto``): a request that leaves temperature, top_p, top_k, min_p or repetition_penalty unset
gets the model author's value instead of the engine's.

``do_sample`` is not consulted (as in vLLM): a request wanting greedy output sets
``temperature: 0``.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from tandem.router.api.sampling import SamplingSpec

log = logging.getLogger(__name__)

# generation_config.json key (a SamplingSpec field) -> its kind
_KEYS = {"temperature": float, "top_p": float, "top_k": int, "min_p": float,
         "repetition_penalty": float}


@dataclass(frozen=True, slots=True)
class GenerationDefaults:
    """The defaults found (empty: none)."""

    values: dict[str, float | int] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: str | Path) -> GenerationDefaults:
        """Read ``directory/generation_config.json``; missing or unreadable: no defaults."""
        path = Path(directory) / "generation_config.json"
        if not path.is_file():
            return cls()
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            log.warning("ignoring %s: %s", path, err)
            return cls()
        values: dict[str, float | int] = {}
        for key, kind in _KEYS.items():
            value = raw.get(key) if isinstance(raw, dict) else None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if kind is int and (not float(value).is_integer()):
                continue
            if math.isfinite(value):
                values[key] = kind(value)
        if values:
            log.info("sampling defaults from %s: %s", path, values)
        return cls(values)

    def apply(self, sampling: SamplingSpec) -> SamplingSpec:
        """``sampling`` with the fields a request left unset filled."""
        unset = {k: v for k, v in self.values.items() if getattr(sampling, k) is None}
        return replace(sampling, **unset) if unset else sampling
