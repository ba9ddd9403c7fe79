"""Start and stop the way users do: poll ``/health`` until 200, then send a request that must
be served at once; SIGTERM ends everything promptly, during the start too.

- A router started alone (as ``tandem up`` starts it, with ``--expect-prefill``) answers
  ``/livez`` 200 and ``/health`` 503 with its reason until a decode worker *and* a prefill
  worker have registered; then a completion sent as soon as ``/health`` says 200 is served.
- ``tandem local --num-prefill 1 --num-decode 2``: the same wait loop, the request served,
  both decode workers routable; SIGTERM with nothing in flight ends it and every process it
  started within a generous bound, and so does a SIGTERM while its workers still load.

(``tandem up`` and ``tandem down`` on Ray: tests/integration/test_ray_up.py.)
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from pathlib import Path

import psutil

from tandem.launcher.local_cluster import Cluster, Proc
from tests.integration import health_poll
from tests.integration.served_model import MODEL_ID, engine_flags, tiny_served_model
from tests.scrape import fetch, parse, value

STOP_BOUND_S = 60.0  # "does not hang": a stop with nothing in flight takes seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _sigterm_ends_everything(proc: Proc, children: list[psutil.Process]) -> None:
    """SIGTERM ``proc``: it exits 0 within the bound and leaves none of ``children``."""
    proc.popen.send_signal(signal.SIGTERM)
    assert proc.popen.wait(timeout=STOP_BOUND_S) == 0, "".join(proc.log[-30:])
    health_poll.until(lambda: not any(_alive(p) for p in children), STOP_BOUND_S,
                      "every process it started to end")


def test_a_router_is_healthy_only_once_it_can_serve(
        tiny_dir: Callable[..., Path], smollm2_dir: Path) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()
    try:
        router = c.start("tandem.router", "--port", "0", "--http-port", "0", "--tokenizer",
                         str(model), "--model-name", MODEL_ID, "--expect-prefill")
        http = str(router.info["http"])
        # Up and answering, nothing to serve with: alive, not healthy.
        assert health_poll.get(http, "/livez") == (200, {"status": "alive"})
        status, body = health_poll.get(http, "/health")
        assert (status, body["reason"]) == (503, "no decode worker registered")
        assert health_poll.get(http, "/ready") == (status, body)
        c.start("tandem.worker.decode", "--port", "0", "--kv-port", "0", *engine_flags(model),
                "--router", router.grpc)
        # The decode worker registers; the cluster was started with prefill workers, so the
        # router still says 503 (and why) until one of them has registered too.
        health_poll.until(lambda: health_poll.get(http, "/health")[1].get(
            "reason", "").startswith("waiting for a prefill worker"), 60,
            "the decode worker to register")
        c.start("tandem.worker.prefill", "--port", "0", *engine_flags(model),
                "--router", router.grpc)
        health_poll.until(lambda: health_poll.get(http, "/health")[0] == 200, 60,
                          "/health to answer 200")
        out = health_poll.complete(http)  # at once: no 503
        assert out["usage"]["completion_tokens"] == 4
        assert health_poll.get(http, "/health") == (200, {"status": "ok"})
    finally:
        c.stop()


def test_tandem_local_with_two_decode_workers_serves_once_healthy(
        tiny_dir: Callable[..., Path], smollm2_dir: Path) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    http = f"127.0.0.1:{_free_port()}"
    c = Cluster()
    children: list[psutil.Process] = []
    try:
        local = c.spawn(
            "tandem.launcher.local", "--model", str(model), "--model-name", MODEL_ID,
            "--port", "0", "--http-port", http.rsplit(":", 1)[1], "--dtype", "float32",
            "--num-blocks", "128", "--num-prefill", "1", "--num-decode", "2")
        # What a user's script does: poll /health, then send the first request.
        health_poll.until(lambda: health_poll.get(http, "/health")[0] == 200, 600,
                          "/health to answer 200", alive=lambda: local.popen.poll() is None)
        out = health_poll.complete(http)
        assert out["usage"]["completion_tokens"] == 4
        samples = parse(fetch(http))
        assert value(samples, "tandem_workers", worker_role="decode", routable="true") == 2
        assert value(samples, "tandem_workers", worker_role="prefill", routable="true") == 1
        c.wait_ready(local)
        workers = local.info["workers"]
        assert sorted(workers) == ["decode-0", "decode-1", "prefill"]
        assert len(set(workers.values())) == 3  # each on its own port
        children = psutil.Process(local.popen.pid).children(recursive=True)
        assert len(children) == 4  # two decode workers, a prefill worker, the router
        assert sum("tandem.worker.decode" in p.cmdline() for p in children) == 2
        _sigterm_ends_everything(local, children)
    finally:
        c.stop()
    assert not any(_alive(p) for p in children)


def test_sigterm_while_tandem_local_starts_ends_it_and_its_workers(
        tiny_dir: Callable[..., Path], smollm2_dir: Path) -> None:
    """Ctrl-C or SIGTERM before the workers are ready: tandem local passes it on at once,
    with no wait for their model loads. The workers are held stopped (SIGSTOP) from the
    moment they appear, so they cannot get ready first: the SIGTERM must reach them while
    they still load (it ends them, or stays pending where the test sees it)."""
    model = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()
    workers: list[psutil.Process] = []
    try:
        local = c.spawn("tandem.launcher.local", "--model", str(model), "--port", "0",
                        "--dtype", "float32", "--num-blocks", "128", "--num-decode", "2")
        parent = psutil.Process(local.popen.pid)

        def hold_new_workers() -> bool:
            for p in parent.children():
                if p.pid not in {w.pid for w in workers}:
                    p.suspend()  # within 0.2 s of its start: long before its imports end
                    workers.append(p)
            return len(workers) == 3

        health_poll.until(hold_new_workers, 120, "its three workers to be started",
                          alive=lambda: local.popen.poll() is None)
        assert not any("TANDEM_READY" in line for line in local.log)  # none ready
        local.popen.send_signal(signal.SIGTERM)
        # A SIGTERM that finds no handler yet ends even a stopped process (its default
        # action); one with its handler set waits, pending, until it runs again.
        health_poll.until(
            lambda: all(_sigterm_pending(p.pid) or not _alive(p) for p in workers),
            STOP_BOUND_S, "tandem local to pass the SIGTERM on to its loading workers")
        for p in workers:  # the ones the SIGTERM ended (no handler yet) are gone already
            _resume(p)
        assert local.popen.wait(timeout=STOP_BOUND_S) == 0, "".join(local.log[-30:])
        health_poll.until(lambda: not any(_alive(p) for p in workers), STOP_BOUND_S,
                          "its workers to end")
        assert not any("Tandem is serving" in line for line in local.log)
    finally:
        for p in workers:
            _resume(p)
        c.stop()


def _resume(p: psutil.Process) -> None:
    """SIGCONT to ``p`` unless it has ended (checking first would race its exit)."""
    try:
        p.resume()
    except psutil.NoSuchProcess:
        pass


def _sigterm_pending(pid: int) -> bool:
    """Whether ``pid`` has a SIGTERM waiting (it is stopped, so it cannot take it yet)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    masks = [int(line.split()[1], 16) for line in status.splitlines()
             if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask >> (signal.SIGTERM - 1) & 1 for mask in masks)
