"""The router as a Ray actor: the standalone router's ``RouterServer``, in-process.

Flags go through ``tandem.router.cli``'s own parser, so the actor serves exactly what ``tandem
router`` would (gRPC, the OpenAI HTTP API when the router has one, the worker Registry).
Workers are not listed: they register themselves. Started lazily by the first call, so a
restarted actor serves again on the same ports and workers re-register on their next
heartbeat. The cluster credential and the API keys are asked of the pool actor as it starts
(never constructor arguments, which Ray keeps in the GCS).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tandem.router.config import RouterConfig
    from tandem.router.security import RouterSecurity

log = logging.getLogger(__name__)


class RouterActor:
    """The cluster's router (wrap with ``ray.remote``)."""

    def __init__(self, argv: list[str], namespace: str) -> None:
        self._argv = list(argv)
        self._namespace = namespace  # where the pool actor, which holds the secrets, lives
        self._server: Any = None
        self._info: dict[str, Any] | None = None
        self._lock: asyncio.Lock | None = None

    async def ready(self) -> dict[str, Any]:
        """Start if needed; returns the gRPC and HTTP endpoints."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._info is None:
                self._info = await self._start()
        return self._info

    async def metrics_text(self) -> str:
        """The router's Prometheus exposition (what HTTP /metrics serves), for the
        autoscaler: its TTFT and TPOT histograms and token counters."""
        if self._server is None:
            raise RuntimeError("the router is not serving")
        from prometheus_client import generate_latest

        return generate_latest(self._server.metrics.registry).decode()

    async def drain(self) -> bool:
        """Refuse new requests, wait for those in flight, close; False if the timeout cut it."""
        if self._server is None:
            return True
        drained = bool(await self._server.drain())
        await self._server.stop()
        self._server = None
        return drained

    async def _start(self) -> dict[str, Any]:
        import os

        import ray

        from tandem.launcher.spec import REGISTRY
        from tandem.router.cli import build_parser, setup_observability
        from tandem.router.server import RouterServer
        from tandem.router.tokenizer import RouterTokenizer

        # --log-format and tracing, as the standalone router sets them up (the flags alone:
        # the credential and keys stay inside router_config).
        setup_observability(build_parser().parse_args([*self._argv, "--insecure"]))
        pool = ray.get_actor(REGISTRY, namespace=self._namespace)
        secret, keys = await pool.cluster_secret.remote(), await pool.api_keys.remote()
        config, security = router_config(self._argv, secret, keys)
        server = RouterServer(config, RouterTokenizer(config.tokenizer_dir), security)
        port = await server.start()
        self._server = server
        node = ray.util.get_node_ip_address()
        host = node if config.host in ("0.0.0.0", "::", "[::]", "") else config.host
        info: dict[str, Any] = {
            "grpc": f"{host}:{port}",
            "pid": os.getpid(),
            "node": node,
        }
        if getattr(server, "http", None) is not None:
            info["http"] = f"{host}:{server.http_port}"
        log.info("router serving on %s", info)
        return info


def router_config(
    argv: list[str], cluster_secret: str, api_keys: str = "",
) -> tuple[RouterConfig, RouterSecurity]:
    """(RouterConfig, RouterSecurity) for the router's ``argv``: the cluster secret and the
    API keys each go through a private file on this node (never onto an argv anyone can
    read); the keys' file is removed once read. A ``--api-key-file`` in ``argv`` (a
    ``--router-arg``) wins over the keys given apart."""
    import shutil

    from tandem.launcher.api_keys import write_key_file
    from tandem.launcher.argv import credential_argv
    from tandem.router.cli import build_parser, config_from_args
    from tandem.router.security import RouterSecurity

    key_file = write_key_file(api_keys) if api_keys else None
    try:
        keys = ["--api-key-file", str(key_file)] if key_file is not None else []
        with credential_argv(cluster_secret) as credential:
            config = config_from_args(build_parser().parse_args([*keys, *argv, *credential]))
            return config, RouterSecurity.from_config(config)
    finally:
        if key_file is not None:
            shutil.rmtree(key_file.parent, ignore_errors=True)
