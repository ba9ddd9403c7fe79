"""The multi-LoRA settings of one engine, vLLM's flags by name.

    --enable-lora                 serve adapters at all (off: a request naming one is refused)
    --lora-modules name=path ...  PEFT adapter directories registered at start
    --max-loras N                 distinct adapters one step may carry (default 1, as vLLM)
    --max-lora-rank R             the largest rank an adapter may have (default 16, as vLLM)
    --max-cpu-loras N             adapters held in memory at once (default: no bound); a
                                  registration past it is refused, never an eviction
    --allow-runtime-lora-updates  adapters may be loaded and unloaded while serving (vLLM:
                                  VLLM_ALLOW_RUNTIME_LORA_UPDATING); off, the worker refuses
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


@dataclass(frozen=True, slots=True)
class LoraConfig:
    """Whether an engine serves LoRA adapters, which it registers at start, and its bounds."""

    enabled: bool = False
    modules: tuple[tuple[str, str], ...] = ()  # (name, PEFT directory) registered at start
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    runtime_updates: bool = False  # LoraAdapters.Load/Unload allowed (the router's admin API)

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if not 1 <= self.max_lora_rank <= 512:
            raise ValueError("max_lora_rank must be in [1, 512]")
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError("max_cpu_loras must be >= max_loras")
        if (self.modules or self.runtime_updates) and not self.enabled:
            raise ValueError("--lora-modules and --allow-runtime-lora-updates need "
                             "--enable-lora")
        names = [name for name, _ in self.modules]
        for name in names:
            check_name(name)
        if len(set(names)) != len(names):
            raise ValueError("--lora-modules names a LoRA adapter twice")
        if self.max_cpu_loras is not None and len(names) > self.max_cpu_loras:
            raise ValueError(f"{len(names)} --lora-modules are more than --max-cpu-loras "
                             f"{self.max_cpu_loras}")


def check_name(name: str) -> str:
    """An adapter's name as requests give it in ``model``: 1-128 characters of letters,
    digits and ``._:/-``. Raises ValueError."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"LoRA adapter name {name!r} must be 1-128 characters of letters, "
                         "digits and ._:/- (starting with a letter or digit)")
    return name


def parse_module(text: str) -> tuple[str, str]:
    """One ``--lora-modules`` value, ``name=path`` (vLLM's JSON form ``{"name": ..., "path":
    ...}`` too). Raises ValueError."""
    text = text.strip()
    if text.startswith("{"):
        import json

        try:
            value = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"--lora-modules {text!r}: not JSON: {err}") from err
        if not isinstance(value, dict) or not isinstance(value.get("name"), str) or \
                not isinstance(value.get("path"), str):
            raise ValueError(f"--lora-modules {text!r}: JSON needs string name and path")
        return check_name(value["name"]), value["path"]
    name, sep, path = text.partition("=")
    if not sep or not path:
        raise ValueError(f"--lora-modules {text!r}: expected name=path")
    return check_name(name), path
