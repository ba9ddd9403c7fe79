"""llama.cpp's side of bench/vs_llama_cpp/compare.py: its own benches, and llama-server as a process.

    llama_bench      llama-bench -p P -n N -t T -r R -o json     pp<P> and tg<N> tokens/s
    batched_bench    llama-batched-bench -npp P -ntg G -npl B,B,..  S_TG (decode tokens/s of B
                     sequences together), one run per repeat in one process
    llama_server     llama-server -t T -np B -cb -c B*320 on a free port, ready once /health
                     answers 200; stopped (SIGTERM, then SIGKILL) on every way out

Each runs the same GGUF file our engine loads, with the thread count it gets.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench.vs_llama_cpp.binaries import LlamaCpp

SLOT_CTX = 320  # llama-server context per slot: 128 + 128 tokens and headroom


class LlamaCppError(RuntimeError):
    """A llama.cpp binary failed or printed nothing we could read."""


class ServerError(RuntimeError):
    """A server under test did not start, or did not answer as asked."""


def _run(cmd: Sequence[str], timeout_s: float) -> str:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                         timeout=timeout_s)
    if out.returncode != 0:
        raise LlamaCppError(f"{Path(cmd[0]).name} exited {out.returncode}:\n"
                            f"{(out.stdout + out.stderr)[-2000:]}")
    return out.stdout + "\n" + out.stderr


def llama_bench(lc: LlamaCpp, gguf: Path, threads: int, prompt: int, gen: int,
                repeats: int, timeout_s: float = 600.0) -> dict[str, float]:
    """pp<prompt> and tg<gen> tokens/s: the median of llama-bench's ``repeats`` samples."""
    text = _run([lc.bench, "-m", gguf, "-p", prompt, "-n", gen, "-t", threads,
                 "-r", repeats, "-o", "json"], timeout_s)
    tests = json.loads(text[text.index("["): text.rindex("]") + 1])
    row: dict[str, float] = {}
    for t in tests:
        ts = statistics.median(t.get("samples_ts") or [t["avg_ts"]])
        if t["n_prompt"] == prompt and t["n_gen"] == 0:
            row["pp_tok_s"] = ts
        elif t["n_prompt"] == 0 and t["n_gen"] == gen:
            row["tg_tok_s"] = ts
            row["tg_ms_per_tok"] = 1e3 / ts
    if set(row) != {"pp_tok_s", "tg_tok_s", "tg_ms_per_tok"}:
        raise LlamaCppError(f"llama-bench printed no pp{prompt}/tg{gen} rows:\n{text[-2000:]}")
    return row


def batched_bench(lc: LlamaCpp, gguf: Path, threads: int, prompt: int, gen: int, seqs: int,
                  repeats: int, timeout_s: float = 600.0) -> dict[str, float]:
    """S_TG (decode tokens/s of ``seqs`` sequences together) and S_PP; medians."""
    ctx = seqs * (prompt + gen) + 64
    text = _run([lc.batched_bench, "-m", gguf, "-c", ctx, "-npp", prompt, "-ntg", gen,
                 "-npl", ",".join([str(seqs)] * repeats), "-t", threads,
                 "--output-format", "jsonl"], timeout_s)
    rows = []
    for line in text.splitlines():
        if line.startswith("{") and '"speed_tg"' in line:
            rows.append(json.loads(line))
    if not rows:
        raise LlamaCppError(f"llama-batched-bench printed no jsonl rows:\n{text[-2000:]}")
    return {"tok_s": statistics.median(r["speed_tg"] for r in rows),
            "pp_tok_s": statistics.median(r["speed_pp"] for r in rows)}


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http_ok(url: str, alive, timeout_s: float, what: str) -> None:
    """Return once GET ``url`` answers 200; raise when ``alive()`` turns False or time runs out.
    (The server answers 503 while it loads, and refuses connections before it listens.)"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive():
            raise ServerError(f"{what} exited before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)  # the poll interval of a condition we cannot be told about
    raise ServerError(f"{what}: {url} did not answer 200 within {timeout_s:.0f} s")


@contextmanager
def llama_server(lc: LlamaCpp, gguf: Path, threads: int, slots: int,
                 wrap: Sequence[str] = (), timeout_s: float = 300.0,
                 slot_ctx: int = SLOT_CTX) -> Iterator[str]:
    """Run llama-server until the block ends (``slots`` parallel sequences of ``slot_ctx``
    tokens each); yields its base URL (``http://host:port``)."""
    port = free_port()
    log = tempfile.TemporaryFile("w+")
    cmd = [*wrap, str(lc.server), "-m", str(gguf), "-t", str(threads), "-np", str(slots),
           "-cb", "-c", str(slots * slot_ctx), "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        try:
            wait_http_ok(f"{base}/health", lambda: proc.poll() is None, timeout_s, "llama-server")
        except ServerError as exc:
            log.seek(0)
            raise ServerError(f"{exc}\n{log.read()[-2000:]}") from None
        yield base
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        log.close()
