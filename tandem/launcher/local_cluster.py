"""Start Tandem processes on this machine and wait until each says it is serving.

Used by ``tandem local`` (``make serve``) and by the integration tests. Every process prints
``TANDEM_READY {json}`` on stdout once it listens; ``start`` waits for that line (never a fixed
sleep) and ``Cluster.stop`` ends everything it started, SIGTERM first (the processes drain)
and SIGKILL after a grace period.

The processes are one cluster: the router and the workers (``MEMBERS``) each get the
cluster credential's flags (by default a new secret in a private file, removed by ``stop``),
and ``credential`` lets the caller talk to the workers as a member does. Each process's
temporary files (the KV receivers' shared-memory sockets) go to a private folder of the
cluster's (``TMPDIR``), removed by ``stop`` once every process has ended: a worker killed
with SIGKILL cannot unlink its socket itself.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tandem.common.security.credential import ClusterCredential, new_secret, private_secret_file
from tandem.common.security.grpc_auth import ROUTER_AUDIENCE, sync_channel
from tandem.common.wire import parse_ready_line

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    """A started process and what it announced."""

    popen: subprocess.Popen[str]
    info: dict[str, Any]
    log: list[str]
    credential: ClusterCredential = field(default_factory=ClusterCredential.insecure_default)
    module: str = ""
    ready: threading.Event = field(default_factory=threading.Event)  # its READY line came
    reader: threading.Thread | None = None  # copies its output into ``log``

    @property
    def grpc(self) -> str:
        return str(self.info["grpc"])

    def channel(self) -> grpc.Channel:
        """A channel to this process's gRPC port that calls as a cluster member does."""
        audience = ROUTER_AUDIENCE if self.info.get("role") == "router" else self.grpc
        return sync_channel(grpc.insecure_channel(self.grpc), self.credential, audience)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=30)


MEMBERS = ("tandem.router", "tandem.worker.prefill", "tandem.worker.decode",
           "tandem.worker.dual")  # hold the credential


@dataclass
class Cluster:
    """The processes one test started; ``stop`` ends them all."""

    procs: list[Proc] = field(default_factory=list)

    echo: bool = False  # copy each process's output to our stderr (interactive use)
    # The members' credential flags; None: a new secret for this cluster, in a private folder
    # removed when the Cluster object goes away (or the interpreter exits).
    credential_flags: list[str] | None = None
    credential: ClusterCredential = field(init=False)
    _scratch: Path | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.credential_flags is None:
            made = private_secret_file(new_secret())
            weakref.finalize(self, shutil.rmtree, made.parent, True)
            self.credential_flags = ["--cluster-secret-file", str(made)]
        flags = self.credential_flags
        self.credential = (ClusterCredential.from_file(flags[flags.index("--cluster-secret-file") + 1])
                           if "--cluster-secret-file" in flags
                           else ClusterCredential.insecure_default())

    def start(
        self, module: str, *args: str, timeout: float = 600.0, wrap: Sequence[str] = ()
    ) -> Proc:
        """Run ``python -m module args`` and wait for its READY line. A cluster member gets
        the credential flags, unless ``args`` already say how it is credentialed.

        ``wrap`` prefixes the command line, e.g. ``("taskset", "-c", "0")`` to pin a worker.
        """
        return self.wait_ready(self.spawn(module, *args, wrap=wrap), timeout)

    def spawn(self, module: str, *args: str, wrap: Sequence[str] = ()) -> Proc:
        """Run ``python -m module args`` (as ``start`` does) without waiting for it: several
        spawned at once load side by side; ``wait_ready`` then waits for each."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(self.scratch))
        given = {"--cluster-secret-file", "--insecure"} & {a.split("=", 1)[0] for a in args}
        member = list(self.credential_flags or ()) if module in MEMBERS and not given else []
        popen = subprocess.Popen(
            [*wrap, sys.executable, "-m", module, *args, *member],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        proc = Proc(popen, {}, [], self.credential, module)
        self.procs.append(proc)
        # One reader per process, for its whole life: it finds the READY line and keeps the
        # pipe drained so a chatty process never blocks on it.
        proc.reader = threading.Thread(target=_read, args=(proc, self.echo), daemon=True)
        proc.reader.start()
        return proc

    def wait_ready(self, proc: Proc, timeout: float = 600.0) -> Proc:
        """Wait for ``proc``'s READY line. If it exits first or ``timeout`` passes, stop the
        whole cluster and raise RuntimeError with the end of its output. Waits in short
        steps, so a signal handler that raises (Ctrl-C) interrupts it."""
        deadline = time.monotonic() + timeout
        while not proc.ready.wait(timeout=0.5):
            if proc.popen.poll() is not None or time.monotonic() > deadline:
                if proc.reader is not None:
                    proc.reader.join(timeout=5)  # collect what it printed before dying
                self.stop()
                tail = "".join(proc.log[-30:])
                raise RuntimeError(
                    f"{proc.module} did not become ready (exit {proc.popen.poll()}):\n{tail}"
                )
        return proc

    @property
    def scratch(self) -> Path:
        """The processes' private temporary folder (mode 0700; made on first use)."""
        if self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="tandem-cluster-"))
            weakref.finalize(self, shutil.rmtree, self._scratch, True)
        return self._scratch

    def channel(self, target: str, audience: str | None = None) -> grpc.Channel:
        """A channel to ``target`` (one of this cluster's processes) that calls as a member;
        its tokens are for ``audience`` (default: ``target``, a worker dialed by it)."""
        return sync_channel(grpc.insecure_channel(target), self.credential, audience or target)

    def stop(self) -> None:
        """SIGTERM everything still running, then SIGKILL what outlives the grace period;
        then remove the processes' temporary folder (a later ``start`` makes a new one)."""
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
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None


def _read(proc: Proc, echo: bool) -> None:
    for line in proc.popen.stdout:  # type: ignore[union-attr]
        proc.log.append(line)
        if echo:
            sys.stderr.write(f"[{proc.module}] {line}")
        info = None if proc.ready.is_set() else parse_ready_line(line)
        if info is not None:
            proc.info = info
            proc.ready.set()
