"""One gRPC channel per worker endpoint, opened on first use and closed with the router.

Every channel pings its worker (tandem/common/grpc_keepalive.py): a worker that stops answering
without closing the connection (a partition) fails its calls UNAVAILABLE within
``KEEPALIVE_BOUND_S`` instead of holding them open forever.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2_grpc

from tandem.common.grpc_keepalive import CLIENT_OPTIONS
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc
from tandem.router.errors import WorkerCallError

# Streams of many small messages: keep the channel's buffers modest but allow big prompts.
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    *CLIENT_OPTIONS,
]

# The client interceptors for the channel to one endpoint (the cluster token, minted for it).
Interceptors = Callable[[str], Sequence[grpc.aio.ClientInterceptor]]


class WorkerClients:
    """Lazily built stubs for each worker endpoint (must be used inside the event loop).

    With ``credentials`` every channel is TLS (mTLS when they carry a client certificate);
    ``interceptors(endpoint)`` put the cluster credential on every call to ``endpoint``, its
    tokens minted for that worker alone (tandem/common/security/grpc_auth.py).
    """

    def __init__(
        self,
        credentials: grpc.ChannelCredentials | None = None,
        interceptors: Interceptors = lambda endpoint: (),
    ) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._credentials = credentials
        self._interceptors = interceptors

    def _channel(self, endpoint: str) -> grpc.aio.Channel:
        channel = self._channels.get(endpoint)
        if channel is None:
            interceptors = list(self._interceptors(endpoint))
            if self._credentials is None:
                channel = grpc.aio.insecure_channel(endpoint, options=_CHANNEL_OPTIONS,
                                                    interceptors=interceptors)
            else:
                channel = grpc.aio.secure_channel(endpoint, self._credentials, _CHANNEL_OPTIONS,
                                                  interceptors=interceptors)
            self._channels[endpoint] = channel
        return channel

    def prefill(self, endpoint: str) -> worker_pb2_grpc.PrefillServiceStub:
        """PrefillService stub for ``endpoint``."""
        return worker_pb2_grpc.PrefillServiceStub(self._channel(endpoint))

    def decode(self, endpoint: str) -> worker_pb2_grpc.DecodeServiceStub:
        """DecodeService stub for ``endpoint``."""
        return worker_pb2_grpc.DecodeServiceStub(self._channel(endpoint))

    def control(self, endpoint: str) -> worker_pb2_grpc.WorkerControlStub:
        """WorkerControl stub for ``endpoint`` (an operator's drain)."""
        return worker_pb2_grpc.WorkerControlStub(self._channel(endpoint))

    async def lora_adapter(self, endpoint: str, method: str, name: str, path: str,
                           timeout: float) -> str:
        """LoraAdapters ``method`` ("Load" or "Unload") of adapter ``name`` on ``endpoint``;
        returns the adapter's identity there. Raises WorkerCallError (the worker's status)."""
        stub = worker_pb2_grpc.LoraAdaptersStub(self._channel(endpoint))
        try:
            reply = await getattr(stub, method)(
                worker_pb2.LoraAdapterRequest(name=name, path=path), timeout=timeout)
        except grpc.aio.AioRpcError as err:
            raise WorkerCallError(endpoint, f"LoraAdapters/{method}", err.code().name,
                                  err.details() or "") from err
        return str(reply.identity)

    def membership(self, endpoint: str) -> worker_pb2_grpc.MembershipStub:
        """Membership stub for ``endpoint`` (the proof a discovered worker gives)."""
        return worker_pb2_grpc.MembershipStub(self._channel(endpoint))

    def health(self, endpoint: str) -> health_pb2_grpc.HealthStub:
        """grpc.health.v1 stub for ``endpoint``."""
        return health_pb2_grpc.HealthStub(self._channel(endpoint))

    def endpoints(self) -> list[str]:
        """Endpoints with a channel open now."""
        return list(self._channels)

    async def forget(self, endpoint: str) -> None:
        """Close the channel to a worker that left the pool."""
        channel = self._channels.pop(endpoint, None)
        if channel is not None:
            await channel.close()

    async def close(self) -> None:
        """Close every channel."""
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
