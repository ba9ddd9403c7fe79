"""The LoraAdapters service of both worker roles: load or unload a LoRA adapter at runtime.

    Load(name, path)  -> the engine registers the PEFT directory (checked against the base
                         model: tandem/engine/lora/adapter.py) between two steps
    Unload(name)      -> refused while a request runs under it

Off unless the worker was started with ``--allow-runtime-lora-updates`` (PERMISSION_DENIED,
saying so); the call itself is a cluster member's (the cluster credential, like every
internal call): the router reaches it only from its admin API. A bad adapter is
INVALID_ARGUMENT with the reason, an unknown one NOT_FOUND; the worker keeps serving.
"""

from __future__ import annotations

import grpc

from tandem.engine.async_engine import AsyncEngine
from tandem.engine.llm_engine import LLMEngine
from tandem.engine.lora.adapter import LoraError
from tandem.engine.lora.manager import LoraManager
from tandem.protos.v1 import worker_pb2, worker_pb2_grpc

Context = grpc.aio.ServicerContext


def add_to_server(engine: AsyncEngine, server: grpc.aio.Server) -> None:
    """Serve the LoraAdapters service of ``engine``."""
    worker_pb2_grpc.add_LoraAdaptersServicer_to_server(LoraAdaptersServicer(engine), server)


class LoraAdaptersServicer(worker_pb2_grpc.LoraAdaptersServicer):
    """Runtime LoRA updates over one engine."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._ae = engine

    async def _check(self, context: Context, request: worker_pb2.LoraAdapterRequest) -> None:
        lora = self._ae.engine.config.lora
        if not lora.enabled or not lora.runtime_updates:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                "runtime LoRA updates are off on this worker (start it with "
                                "--enable-lora --allow-runtime-lora-updates)")
        if not request.name or len(request.name) > 128:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "name: 1-128 characters")

    async def Load(  # noqa: N802 (gRPC method names)
        self, request: worker_pb2.LoraAdapterRequest, context: Context
    ) -> worker_pb2.LoraAdapterResponse:
        await self._check(context, request)
        if not request.path or len(request.path) > 4096:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "path: 1-4096 characters")
        try:
            adapter = await self._ae.call(lambda e: _loras(e).register(request.name, request.path))
        except LoraError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        return worker_pb2.LoraAdapterResponse(identity=adapter.identity)

    async def Unload(  # noqa: N802
        self, request: worker_pb2.LoraAdapterRequest, context: Context
    ) -> worker_pb2.LoraAdapterResponse:
        await self._check(context, request)
        try:
            identity = await self._ae.call(lambda e: _unload(e, request.name))
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"LoRA adapter {request.name!r} is not loaded here")
        except LoraError as err:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(err))
        return worker_pb2.LoraAdapterResponse(identity=identity)


def _loras(engine: LLMEngine) -> LoraManager:
    assert engine.loras is not None  # _check: LoRA is enabled
    return engine.loras


def _unload(engine: LLMEngine, name: str) -> str:
    """Unregister ``name`` unless a request the engine holds runs under it (engine thread)."""
    loras = _loras(engine)
    identity = loras.get(name).identity if name in loras.adapters else ""
    loras.unregister(name, lambda n: engine.runs_adapter(n))
    return identity
