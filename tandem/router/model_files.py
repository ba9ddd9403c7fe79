"""The directory the router reads for a model spec: the tokenizer, config.json and
generation_config.json of what the workers serve, found as the workers find it.

    checkpoint dir -------------------------------------------> the directory itself
    alias, .gguf --(converted already: a worker or launcher)--> <cache>/models/<stem>-<hash>/
                 \\--(not yet)--> tokenizer + context length read from the GGUF, no torch,
                                 written once to <cache>/tokenizers/<stem>-<hash>/

The router never converts weights (that takes torch). A GGUF's tokenizer is built from its
metadata by transformers' GGUF tokenizer builders, the ones the engine's conversion runs, so
both directories hold the same tokenizer.json; the metadata is read by tandem/common/gguf_metadata.py
(transformers' own GGUF reader imports torch).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tandem.common.gguf_metadata import read_gguf_metadata
from tandem.common.model_spec import (
    COMPLETE,
    checkpoint_dir,
    converted_dir,
    default_cache_dir,
    gguf_file,
    is_complete,
)
from tandem.router.tokenizer import TokenizerLoadError

log = logging.getLogger(__name__)

# GGUF metadata key -> the token a tokenizer_config names (transformers' get_gguf_tokenizer).
_SPECIAL_TOKENS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                   "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}


def router_model_dir(spec: str, cache_dir: str | Path | None = None) -> Path:
    """A directory with the tokenizer and config.json of ``spec`` (alias, .gguf file or
    checkpoint directory). Raises ModelSpecError (no such model) or TokenizerLoadError (a
    GGUF whose tokenizer cannot be built or cached)."""
    gguf = gguf_file(spec)
    if gguf is None:
        return checkpoint_dir(spec)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    converted = converted_dir(gguf, cache)
    if is_complete(converted):
        return converted
    target = cache / "tokenizers" / converted.name
    if not is_complete(target):
        _write_gguf_tokenizer(gguf, target)
    return target


def _write_gguf_tokenizer(gguf: Path, target: Path) -> None:
    """Build ``gguf``'s tokenizer and write it, with the config.json keys the router reads
    (context length, vocabulary size), to ``target`` (atomically: a finished directory or
    none)."""
    log.info("reading the tokenizer of %s (first use only; cached under %s)", gguf.name, target)
    try:
        metadata = read_gguf_metadata(gguf)
        tokenizer = gguf_tokenizer(metadata)
        arch = metadata["general.architecture"]
        config = {"max_position_embeddings": int(metadata.get(f"{arch}.context_length", 0)),
                  "vocab_size": len(metadata["tokenizer.ggml.tokens"])}
    except (KeyError, ValueError, TypeError, OSError) as err:
        raise TokenizerLoadError(f"cannot read a tokenizer from {str(gguf)!r}: {err}") from err
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=target.parent))
    except OSError as err:
        raise TokenizerLoadError(f"cannot write the tokenizer cache {str(target)!r}: {err}; "
                                 "pass --tokenizer DIR") from err
    try:
        tokenizer.save_pretrained(tmp)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / COMPLETE).write_text(gguf.name)
        if target.exists():  # a half-written directory from an interrupted run
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if not is_complete(target):  # another router finished first: theirs is as good
                raise
    except OSError as err:
        raise TokenizerLoadError(f"cannot write the tokenizer cache {str(target)!r}: {err}; "
                                 "pass --tokenizer DIR") from err
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gguf_tokenizer(metadata: dict[str, Any]) -> Any:  # -> TokenizersBackend
    """The tokenizer a GGUF's metadata describes, as transformers' ``get_gguf_tokenizer`` and
    ``convert_gguf_tokenizer`` build it for ``AutoTokenizer.from_pretrained(gguf_file=...)``.
    Raises KeyError/ValueError for a tokenizer type transformers cannot build."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    groups = {group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items()
                      if f"tokenizer.{key}" in metadata}
              for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokens, config = groups["tokenizer"], groups["tokenizer_config"]
    if tokens.get("tokenizer_type") == "llama":
        config.setdefault("add_bos_token", True)  # llama.cpp's default for sentencepiece vocabs
    elif tokens.get("tokenizer_type") == "gemma4":
        config["add_bos_token"] = False  # its chat template writes <bos> itself
    for name, key in _SPECIAL_TOKENS.items():
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        config[name] = tokens["tokens"][token_id] if token_id is not None else None
    backend, extra = convert_gguf_tokenizer(metadata["general.architecture"], tokens)
    return TokenizersBackend(tokenizer_object=backend, **config, **extra)
