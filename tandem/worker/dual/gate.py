"""Both roles' gRPC services on one server, each answering only while its role is the
worker's current one (a gRPC server takes no new services once started, so a flip cannot
add one).

    PrefillService/X ──> gate ──> the current PrefillServicer.X     (role is prefill)
                              └─> FAILED_PRECONDITION "serves decode now"   (any other)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from tandem.protos.v1 import worker_pb2

Context = grpc.aio.ServicerContext


class RoleGate:
    """A stand-in servicer for ``service`` whose every method calls the servicer that
    ``current(role)`` returns (None: this role is not served now)."""

    def __init__(self, service: str, role: str, current: Callable[[str], Any | None],
                 serving: Callable[[], str]) -> None:
        self._role = role
        self._current = current
        self._serving = serving
        for method in worker_pb2.DESCRIPTOR.services_by_name[service].methods:
            setattr(self, method.name, self._streaming(method.name) if method.server_streaming
                    else self._unary(method.name))

    async def _target(self, name: str, context: Context) -> Any:
        servicer = self._current(self._role)
        if servicer is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"this worker serves {self._serving()} now, not {self._role}")
        return getattr(servicer, name)

    def _unary(self, name: str) -> Callable[[Any, Context], Any]:
        async def call(request: Any, context: Context) -> Any:
            return await (await self._target(name, context))(request, context)
        return call

    def _streaming(self, name: str) -> Callable[[Any, Context], AsyncIterator[Any]]:
        async def call(request: Any, context: Context) -> AsyncIterator[Any]:
            async for message in (await self._target(name, context))(request, context):
                yield message
        return call
