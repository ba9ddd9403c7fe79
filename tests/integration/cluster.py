"""Start Tandem processes for integration tests and wait until they say they are serving.

Every process prints ``TANDEM_READY {json}`` on stdout once it listens; ``start`` waits for
that line (never a fixed sleep) and ``Cluster.stop`` ends everything it started, SIGTERM first
and SIGKILL after a grace period.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

READY = "TANDEM_READY "
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    """A started process and what it announced."""

    popen: subprocess.Popen[str]
    info: dict[str, Any]
    log: list[str]

    @property
    def grpc(self) -> str:
        return str(self.info["grpc"])

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=30)


@dataclass
class Cluster:
    """The processes one test started; ``stop`` ends them all."""

    procs: list[Proc] = field(default_factory=list)

    def start(self, module: str, *args: str, timeout: float = 180.0) -> Proc:
        """Run ``python -m module args`` and wait for its READY line."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        popen = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        proc = Proc(popen, {}, [])
        self.procs.append(proc)
        sel = selectors.DefaultSelector()
        sel.register(popen.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            line = popen.stdout.readline()  # type: ignore[union-attr]
            if not line:
                break  # the process exited
            proc.log.append(line)
            if line.startswith(READY):
                proc.info = json.loads(line[len(READY) :])
                sel.close()
                # Keep draining its output so a chatty process never blocks on a full pipe.
                threading.Thread(target=_drain, args=(proc,), daemon=True).start()
                return proc
        self.stop()
        tail = "".join(proc.log[-30:])
        raise RuntimeError(f"{module} did not become ready (exit {popen.poll()}):\n{tail}")

    def stop(self) -> None:
        """SIGTERM everything still running, then SIGKILL what outlives the grace period."""
        for proc in self.procs:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(timeout=30)
        self.procs.clear()


def _drain(proc: Proc) -> None:
    for line in proc.popen.stdout:  # type: ignore[union-attr]
        proc.log.append(line)
