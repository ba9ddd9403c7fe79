"""A prefill or decode worker as a Ray actor: the standalone worker's server, in-process.

    first call (any method) ──> ask the registry actor where the router is
    ──> parse the standalone command's flags ──> tandem.worker.process.serve(stop=event)
        (same engine, KV endpoint, gRPC service, health, registration and heartbeats)
    ──> READY captured from serve's announcement ──> wait until the router knows us
    drain() ──> event set: no new work, running work finishes ──> server closed

The cluster credential is asked of the pool actor as the worker starts (never a constructor
argument: Ray keeps those in the GCS). Started lazily by the first call, so a restarted actor
(``max_restarts``) comes back the same way: the pool's supervisor calls ``ready()`` and the new incarnation serves on a new port and
registers again under a new worker id, while the router forgets the dead one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import deque
from typing import Any

import grpc

from tandem.common.security.credential import ClusterCredential
from tandem.common.security.grpc_auth import ROUTER_AUDIENCE, aio_interceptors
from tandem.common.wire import parse_ready_line
from tandem.launcher.signals import SignalRecorder, TimingServer
from tandem.launcher.spec import REGISTRY
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc

log = logging.getLogger(__name__)

class _LogTail(logging.Handler):
    """The last log lines of this process while a worker starts, for its failure message
    (a worker that exits before READY says why in its log, not in an exception)."""

    def __init__(self, lines: int = 8) -> None:
        super().__init__(logging.INFO)
        self.lines: deque[str] = deque(maxlen=lines)

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):  # a log call must never fail the worker
            self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


class _ReadyCapture:
    """The ``out`` stream given to ``serve``: resolves a future with the READY line's JSON."""

    def __init__(self, future: asyncio.Future[dict[str, Any]]) -> None:
        self._future = future
        self._buf = ""

    def write(self, text: str) -> int:
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            info = parse_ready_line(line)
            if info is not None and not self._future.done():
                self._future.set_result(info)
        return len(text)

    def flush(self) -> None:
        return None


class _TimedApp:
    """A worker app whose service registration goes through ``TimingServer``."""

    def __init__(self, app: Any, recorder: SignalRecorder) -> None:
        self._app = app
        self._rec = recorder

    def add_to_server(self, server: grpc.aio.Server) -> None:
        self._app.add_to_server(TimingServer(server, self._rec))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._app, name)


class WorkerActor:
    """One prefill or decode worker (wrap with ``ray.remote`` and resource options)."""

    def __init__(self, role: str, index: int, argv: list[str], namespace: str,
                 window_s: float, host: str = "") -> None:
        self.role = role
        self.index = index
        self._argv = list(argv)
        self._secret = ""  # hex, from the pool as the worker starts; "" for an insecure cluster
        self._host = host  # where to listen ("": this node's IP)
        self._namespace = namespace
        self._recorder = SignalRecorder(window_s)
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[int] | None = None
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._router = ""
        self._log_tail = _LogTail()
        self.worker_id = f"{role}-{index}-{os.getpid()}"

    async def ready(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """Start if needed; return once serving and known to the router."""
        info = await self._started(timeout_s)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not await self._registered():
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{self.worker_id} not registered with {self._router}")
            await asyncio.sleep(0.1)
        return {**info, "registered": True}

    async def info(self) -> dict[str, Any]:
        """Where this worker serves and whether the router knows it (no waiting)."""
        info = await self._started(600.0)
        return {**info, "registered": await self._registered()}

    async def signals(self) -> dict[str, Any]:
        """Latency window and token counts for the autoscaler."""
        return self._recorder.snapshot()

    async def drain(self) -> int:
        """Stop taking work, finish what runs, close; returns serve's exit status."""
        if self._task is None:
            return 0
        assert self._stop is not None
        self._stop.set()
        return await self._task

    async def _started(self, timeout_s: float) -> dict[str, Any]:
        if self._task is None:
            loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready = loop.create_future()
            logging.getLogger().addHandler(self._log_tail)  # until READY or the exit
            self._ready.add_done_callback(
                lambda _: logging.getLogger().removeHandler(self._log_tail))
            self._task = loop.create_task(self._serve())
            self._task.add_done_callback(self._on_exit)
        assert self._ready is not None
        try:
            base = await asyncio.wait_for(asyncio.shield(self._ready), timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"{self.worker_id} did not report READY in {timeout_s:g} s"
                               f"{self._last_lines()}") from None
        import ray

        return {**base, "role": self.role, "index": self.index, "worker_id": self.worker_id,
                "pid": os.getpid(), "node": ray.util.get_node_ip_address()}

    def _on_exit(self, task: asyncio.Task[int]) -> None:
        """Fail a pending ``ready`` with why the worker ended before READY."""
        if self._ready is None or self._ready.done():
            return
        if task.cancelled():
            why: BaseException = RuntimeError(f"{self.worker_id} was cancelled before READY")
        elif task.exception() is not None:
            why = task.exception()  # type: ignore[assignment]
        else:
            why = RuntimeError(f"{self.worker_id} exited with status {task.result()} before "
                               f"READY{self._last_lines()}")
        self._ready.set_exception(why)

    def _last_lines(self) -> str:
        lines = list(self._log_tail.lines)
        return "; last log lines: " + " | ".join(lines) if lines else ""

    async def _serve(self) -> int:
        import ray

        from tandem.launcher.argv import credential_argv
        from tandem.worker.process import serve

        registry = ray.get_actor(REGISTRY, namespace=self._namespace)
        self._secret = await registry.cluster_secret.remote()
        self._router = await registry.router_endpoint.remote()
        host = self._host or ray.util.get_node_ip_address()
        # Every worker can flip its role (the pool's flip, through the router): one runtime
        # serves either, starting with this actor's (tandem/worker/dual/).
        from tandem.worker.cli import setup_observability
        from tandem.worker.dual import cli
        from tandem.worker.dual.app import build_dual_app as build

        first = ["--role", self.role, "--kv-port", "0"]

        with credential_argv(self._secret) as credential:  # read while the config is built
            args = cli.build_parser().parse_args(
                [*first, "--host", host, "--port", "0", *self._argv, *credential,
                 "--router", self._router, "--worker-id", self.worker_id])
            setup_observability(args, self.role)  # --log-format, tracing: as standalone workers do
            config = cli.config_from_args(args)

        async def build_app() -> Any:
            return _TimedApp(await build(config), self._recorder)  # type: ignore[arg-type]

        assert self._ready is not None and self._stop is not None
        return await serve(config.worker.serve, build_app, _ReadyCapture(self._ready),
                           self._stop)

    async def _registered(self) -> bool:
        """Whether the router knows this worker (a Heartbeat that carries no stats)."""
        credential = (ClusterCredential.from_hex(self._secret) if self._secret
                      else ClusterCredential.insecure_default())
        with contextlib.suppress(grpc.aio.AioRpcError):
            async with grpc.aio.insecure_channel(
                    self._router, interceptors=aio_interceptors(credential, ROUTER_AUDIENCE)) as channel:
                reply = await worker_pb2_grpc.RegistryStub(channel).Heartbeat(
                    worker_pb2.HeartbeatRequest(worker_id=self.worker_id), timeout=5)
                return bool(reply.known)
        return False
