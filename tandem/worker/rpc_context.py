"""One worker RPC's span and log context, the same for every servicer method of both roles.

    router's call span ──traceparent (gRPC metadata)──> serving(context, name, leg id)
        a SERVER span, child of the router's call span (a new trace when none came)
        every log line in the call (and in the tasks it starts) names the leg id

The leg id is the router-minted ``request_id`` of the call (``rid`` or ``rid.N``): the only id
a worker ever sees (DESIGN.md section 8).
"""

from __future__ import annotations

from types import TracebackType

import grpc

from tandem.common.obs import log_context, tracing


class serving:  # noqa: N801 - used as a function: ``with serving(...) as span``
    """The span of the RPC ``name`` ("DecodeService/Reserve") for ``request_id`` while the
    ``with`` block runs, with the log context bound; the span ends (failed, on an exception)
    with the block, unless the block ended it already."""

    __slots__ = ("_scope", "_token")  # _token: (leg id, trace ids), then bind()'s token

    def __init__(self, context: grpc.aio.ServicerContext, name: str, request_id: str) -> None:
        metadata = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        service, _, method = name.partition("/")
        span = tracing.start_span(name, tracing.extract(metadata), kind=tracing.SERVER,
                                  attributes={"rpc.system": "grpc",
                                              "rpc.service": f"tandem.v1.{service}",
                                              "rpc.method": method,
                                              "tandem.leg_id": request_id})
        self._scope = tracing.ended(span)
        self._token = (request_id, tracing.ids(span))

    def __enter__(self) -> tracing.Span:
        request_id, ids = self._token
        self._token = log_context.bind(request_id, trace_ids=ids)
        return self._scope.__enter__()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        log_context.unbind(self._token)
        self._scope.__exit__(kind, exc, tb)
