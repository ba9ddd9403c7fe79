"""Start Tandem processes on this machine and wait until each says it is serving.

Used by ``tandem local`` (``make serve``) and by the integration tests. Every process prints
``TANDEM_READY {json}`` on stdout once it listens; ``start`` waits for that line (never a fixed
sleep) and ``Cluster.stop`` ends everything it started, SIGTERM first (the processes drain)
and SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.wire import parse_ready_line

ROOT = Path(__file__).resolve().parents[1]


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

    echo: bool = False  # copy each process's output to our stderr (interactive use)

    def start(
        self, module: str, *args: str, timeout: float = 600.0, wrap: Sequence[str] = ()
    ) -> Proc:
        """Run ``python -m module args`` and wait for its READY line.

        ``wrap`` prefixes the command line, e.g. ``("taskset", "-c", "0")`` to pin a worker.
        """
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        popen = subprocess.Popen(
            [*wrap, sys.executable, "-m", module, *args],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        proc = Proc(popen, {}, [])
        self.procs.append(proc)
        ready = threading.Event()
        # One reader per process, for its whole life: it finds the READY line and keeps the
        # pipe drained so a chatty process never blocks on it.
        reader = threading.Thread(
            target=_read, args=(proc, module, self.echo, ready), daemon=True
        )
        reader.start()
        deadline = time.monotonic() + timeout
        while not ready.wait(timeout=0.5):
            if popen.poll() is not None or time.monotonic() > deadline:
                reader.join(timeout=5)  # collect what it printed before dying
                self.stop()
                tail = "".join(proc.log[-30:])
                raise RuntimeError(
                    f"{module} did not become ready (exit {popen.poll()}):\n{tail}"
                )
        return proc

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


def _read(proc: Proc, module: str, echo: bool, ready: threading.Event) -> None:
    for line in proc.popen.stdout:  # type: ignore[union-attr]
        proc.log.append(line)
        if echo:
            sys.stderr.write(f"[{module}] {line}")
        info = None if ready.is_set() else parse_ready_line(line)
        if info is not None:
            proc.info = info
            ready.set()
