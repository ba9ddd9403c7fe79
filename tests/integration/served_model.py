"""A tiny random-weight model the router can serve: SmolLM2's tokenizer (and chat template)
next to a tiny Llama with SmolLM2's vocabulary, so text and chat prompts tokenize as they
would in production while the workers start and run in a fraction of the time."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tandem.launcher.local_cluster import Cluster, Proc

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


def start_all(cluster: Cluster, *commands: Sequence[str], timeout: float = 600.0
              ) -> list[Proc]:
    """Start every ``(module, *args)`` of ``commands`` side by side and wait until each is
    ready (their imports and model loads overlap); the Procs come back in ``commands`` order.
    If one fails, ``Cluster.start`` stops the cluster, so the others fail too: it raises."""
    with ThreadPoolExecutor(len(commands)) as pool:
        futures = [pool.submit(cluster.start, *command, timeout=timeout) for command in commands]
        return [future.result() for future in futures]


def start_workers(cluster: Cluster, model: Path, *extra: str,
                  decode_extra: Sequence[str] = (), prefill_extra: Sequence[str] = ()
                  ) -> tuple[Proc, Proc]:
    """A decode and a prefill worker on ``model``, started side by side (halves the wait);
    ``extra`` goes to both, ``decode_extra``/``prefill_extra`` to one."""
    flags = [*engine_flags(model), *extra]
    decode, prefill = start_all(
        cluster,
        ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *flags, *decode_extra),
        ("tandem.worker.prefill", "--port", "0", *flags, *prefill_extra))
    return decode, prefill


MODEL_ID = "tiny"


@dataclass
class TinyWorkers:
    """The shared workers; ``cluster`` holds them (and the shared router) and their secret."""

    cluster: Cluster
    model: Path
    decode: Proc
    prefill: Proc
    last_user: str = ""  # nodeid of the last collected test that needs these processes
    trace_files: dict[str, Path] = field(default_factory=dict)  # role -> its --trace-file

    def router_flags(self, *extra: str) -> tuple[str, ...]:
        return ("--port", "0", "--tokenizer", str(self.model), "--model-name", MODEL_ID,
                "--decode", self.decode.grpc, *extra)


@contextmanager
def shared_router(tiny_workers: TinyWorkers, *extra: str) -> Iterator[Proc]:
    """A router of one module's own on the shared workers (same cluster secret), stopped on
    leaving the block; ``extra`` follows the common flags."""
    c = Cluster(credential_flags=tiny_workers.cluster.credential_flags)
    try:
        yield c.start("tandem.router", *tiny_workers.router_flags(*extra))
    finally:
        c.stop()
