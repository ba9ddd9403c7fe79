"""A tiny random-weight model the router can serve: SmolLM2's tokenizer (and chat template)
next to a tiny Llama with SmolLM2's vocabulary, so text and chat prompts tokenize as they
would in production while the workers start and run in a fraction of the time."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tandem.local_cluster import Cluster, Proc

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")
SMOLLM2_VOCAB = 49152


def tiny_served_model(tiny_dir: Callable[..., Path], smollm2_dir: Path) -> Path:
    """The tiny checkpoint directory with SmolLM2's tokenizer files copied in."""
    path = tiny_dir("llama", 2, vocab_size=SMOLLM2_VOCAB)
    for name in TOKENIZER_FILES:
        if (smollm2_dir / name).is_file() and not (path / name).is_file():
            shutil.copy(smollm2_dir / name, path / name)
    return path


def engine_flags(model: Path) -> list[str]:
    """Worker flags for the tiny model: one thread, a small fixed cache."""
    return ["--model", str(model), "--dtype", "float32", "--threads", "1", "--num-blocks", "128"]


def start_workers(cluster: Cluster, model: Path, *extra: str,
                  decode_extra: Sequence[str] = (), prefill_extra: Sequence[str] = ()
                  ) -> tuple[Proc, Proc]:
    """A decode and a prefill worker on ``model``, started side by side (halves the wait);
    ``extra`` goes to both, ``decode_extra``/``prefill_extra`` to one."""
    flags = [*engine_flags(model), *extra]
    with ThreadPoolExecutor(2) as pool:
        decode = pool.submit(cluster.start, "decode_worker", "--port", "0", "--kv-port", "0",
                             *flags, *decode_extra)
        prefill = pool.submit(cluster.start, "prefill_worker", "--port", "0", *flags,
                              *prefill_extra)
        return decode.result(), prefill.result()
