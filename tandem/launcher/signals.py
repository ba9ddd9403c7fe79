"""A worker's recent latency and token counts, measured at its gRPC edge for the autoscaler.

    Prefill RPC:  arrival ──(queue + compute + KV push)──> reply   = the worker's TTFT share
    Decode RPC:   message ──gap──> message ──gap──> ...           = inter-token latency

The worker's own services are registered through ``TimingServer``, a thin proxy over the
``grpc.aio`` server that wraps those two handlers; nothing in the worker changes. Figures are
kept for ``window_s`` seconds and read by the controller with ``SignalRecorder.snapshot``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

PREFILL_METHOD = "/tandem.v1.PrefillService/Prefill"
DECODE_METHOD = "/tandem.v1.DecodeService/Decode"


class SignalRecorder:
    """Prefill durations, inter-token gaps and token totals over a sliding window."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self._clock = clock
        self._prefills: deque[tuple[float, float]] = deque()  # (end time, duration)
        self._gaps: deque[tuple[float, float]] = deque()  # (time, gap between messages)
        self.queued_prompt_tokens = 0
        self.prompt_tokens_total = 0
        self.output_tokens_total = 0

    def prefill_started(self, n_tokens: int) -> float:
        """A Prefill call arrived; returns its start time."""
        self.queued_prompt_tokens += n_tokens
        return self._clock()

    def prefill_ended(self, n_tokens: int, started: float, ok: bool) -> None:
        """A Prefill call ended (successful ones count toward latency and throughput)."""
        now = self._clock()
        self.queued_prompt_tokens -= n_tokens
        if ok:
            self.prompt_tokens_total += n_tokens
            self._prefills.append((now, now - started))

    def streamed(self, n_tokens: int, gap_s: float | None) -> None:
        """A decode stream sent ``n_tokens``; ``gap_s`` since its previous message (or None)."""
        self.output_tokens_total += n_tokens
        if gap_s is not None and n_tokens > 0:
            self._gaps.append((self._clock(), gap_s / n_tokens))

    def snapshot(self) -> dict[str, Any]:
        """Window figures for ``tandem.autoscaler.controller.sample_of``."""
        now = self._clock()
        for q in (self._prefills, self._gaps):
            while q and now - q[0][0] > self.window_s:
                q.popleft()
        durations = sorted(d for _, d in self._prefills)
        gaps = [g for _, g in self._gaps]
        return {
            "ttft_p90_s": _p90(durations),
            "itl_mean_s": sum(gaps) / len(gaps) if gaps else None,
            "queued_prompt_tokens": self.queued_prompt_tokens,
            "prompt_tokens_total": self.prompt_tokens_total,
            "output_tokens_total": self.output_tokens_total,
        }


def _p90(sorted_values: list[float]) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(0.9 * len(sorted_values)) - 1)]


class TimingServer:
    """Stands in for a ``grpc.aio.Server`` while a worker app registers its service."""

    def __init__(self, server: grpc.aio.Server, recorder: SignalRecorder) -> None:
        self._server = server
        self._rec = recorder

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self._server.add_generic_rpc_handlers(tuple(_Generic(h, self._wrap) for h in handlers))

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        wrapped = {name: self._wrap(f"/{service}/{name}", h) for name, h in handlers.items()}
        self._server.add_registered_method_handlers(service, wrapped)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    def _wrap(self, method: str, handler: Any) -> Any:
        if handler is None:
            return None
        rec = self._rec
        if method == PREFILL_METHOD and handler.unary_unary is not None:
            inner = handler.unary_unary

            async def prefill(request: Any, context: Any) -> Any:
                n = len(request.token_ids)
                started, ok = rec.prefill_started(n), False
                try:
                    reply = await inner(request, context)
                    ok = True
                    return reply
                finally:
                    rec.prefill_ended(n, started, ok)

            return handler._replace(unary_unary=prefill)
        if method == DECODE_METHOD and handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def decode(request: Any, context: Any) -> AsyncIterator[Any]:
                last: float | None = None
                async for msg in inner_stream(request, context):
                    now = time.monotonic()
                    rec.streamed(len(msg.token_ids), None if last is None else now - last)
                    last = now
                    yield msg

            return handler._replace(unary_stream=decode)
        return handler


class _Generic(grpc.GenericRpcHandler):
    """A generic handler whose method handlers pass through ``wrap``."""

    def __init__(self, inner: grpc.GenericRpcHandler,
                 wrap: Callable[[str, Any], Any]) -> None:
        self._inner = inner
        self._wrapfn = wrap

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        handler = self._inner.service(handler_call_details)
        return self._wrapfn(handler_call_details.method, handler)  # type: ignore[attr-defined]
