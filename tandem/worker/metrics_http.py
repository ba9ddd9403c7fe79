"""A worker's ``/metrics`` endpoint: a tiny aiohttp server on the worker's own event loop.

    GET /metrics ──> await refresh() (engine and transfer stats, read on their own threads
                     and loops) ──> render the registry in the Prometheus text format

On the event loop, not a scrape thread, so the snapshot is taken between engine steps like
every other engine call. ``--metrics-port 0`` picks a free port (``start`` returns it).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)


class MetricsBindError(OSError):
    """The metrics address could not be bound."""


class MetricsServer:
    """Serves one registry at ``/metrics`` until ``stop``."""

    def __init__(
        self, registry: CollectorRegistry, refresh: Callable[[], Awaitable[None]]
    ) -> None:
        self._registry = registry
        self._refresh = refresh
        self._runner: web.AppRunner | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port); returns the bound port."""
        try:
            sock = socket.create_server((host, port))
        except OSError as exc:
            raise MetricsBindError(f"cannot listen for metrics on {host}:{port}: {exc}") from exc
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.SockSite(runner, sock).start()
        except BaseException:
            await runner.cleanup()
            sock.close()
            raise
        self._runner = runner
        return int(sock.getsockname()[1])

    async def _handle(self, request: web.Request) -> web.Response:
        try:
            await self._refresh()
        except Exception as exc:  # e.g. the engine stopped: say so, keep serving
            log.warning("metrics refresh failed: %r", exc)
            return web.Response(status=503, text=f"metrics unavailable: {exc}\n")
        return web.Response(
            body=generate_latest(self._registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def stop(self) -> None:
        """Close the listener and any open scrape connections."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
