"""vLLM's runtime LoRA routes, served only with ``--allow-runtime-lora-updates`` and only to
a caller presenting an admin key (``--admin-key-file``; API keys do not open them):

    POST /v1/load_lora_adapter    {"lora_name": "sql", "lora_path": "/adapters/sql"}
    POST /v1/unload_lora_adapter  {"lora_name": "sql"}

The router holds no adapters: each call goes to every routable worker (both roles) through
their LoraAdapters service (tandem/worker/lora_admin.py), and the adapter is served once the
workers' next stats report it (tandem/router/adapters.py). A load that some worker refuses is
undone on the workers that took it, so the pool never serves an adapter only partly; the
answer is the first refusal's status (400 a bad adapter, 404 an unknown one, 409 in use).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from tandem.placement.worker_view import Role
from tandem.router.errors import InvalidRequestError, NoWorkerError, WorkerCallError
from tandem.router.frontend import Frontend
from tandem.router.http.errors import HttpRefusal, error_body

LOAD_PATH = "/v1/load_lora_adapter"
UNLOAD_PATH = "/v1/unload_lora_adapter"
PATHS = frozenset({LOAD_PATH, UNLOAD_PATH})
_MAX_BODY = 16 * 1024
_STATUS = {"INVALID_ARGUMENT": 400, "NOT_FOUND": 404, "FAILED_PRECONDITION": 409,
           "PERMISSION_DENIED": 403}


class LoraAdmin:
    """The two routes over a frontend's worker pool."""

    def __init__(self, frontend: Frontend) -> None:
        self._frontend = frontend

    def add_routes(self, app: web.Application) -> None:
        """Register the load and unload routes."""
        app.router.add_post(LOAD_PATH, self.load)
        app.router.add_post(UNLOAD_PATH, self.unload)

    async def load(self, request: web.Request) -> web.StreamResponse:
        """Load an adapter on every worker (undone everywhere if one refuses)."""
        body = await _body(request)
        name, path = _field(body, "lora_name"), _field(body, "lora_path")
        results = await self._each("Load", name, path)
        failed = [r for r in results if isinstance(r, WorkerCallError)]
        if failed:
            await self._each("Unload", name, only=[e for e, r in zip(
                self._endpoints(), results, strict=True) if not isinstance(r, BaseException)])
            return _refused(failed[0])
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: web.Request) -> web.StreamResponse:
        """Unload an adapter from every worker that holds it."""
        name = _field(await _body(request), "lora_name")
        results = await self._each("Unload", name)
        errors = [r for r in results if isinstance(r, WorkerCallError)]
        if errors and all(e.code_name == "NOT_FOUND" for e in errors) \
                and len(errors) < len(results):
            errors = []  # held by some workers only: unloaded where it was
        if errors:
            return _refused(errors[0])
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    def _endpoints(self) -> list[str]:
        registry = self._frontend.deps.registry
        return [w.endpoint for role in (Role.PREFILL, Role.DECODE)
                for w in registry.routable(role)]

    async def _each(self, method: str, name: str, path: str = "",
                    only: list[str] | None = None) -> list[Any]:
        """``method`` on every routable worker (or ``only`` those), results in order."""
        deps = self._frontend.deps
        endpoints = self._endpoints() if only is None else only
        if only is not None and not only:
            return []
        if not endpoints:
            raise NoWorkerError("no worker to load or unload the adapter on")
        results = await asyncio.gather(
            *(deps.clients.lora_adapter(e, method, name, path, deps.config.rpc_timeout_s)
              for e in endpoints), return_exceptions=True)
        for r in results:  # a worker's refusal is an answer; anything else is a bug
            if isinstance(r, BaseException) and not isinstance(r, WorkerCallError):
                raise r
        return results


async def _body(request: web.Request) -> dict[str, Any]:
    # (a body of no stated length is bounded by the app's --max-request-bytes)
    if request.content_length is not None and request.content_length > _MAX_BODY:
        raise HttpRefusal(413, "body over 16 KiB", "body", "request_too_large", close=True)
    try:
        body = json.loads(await request.text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InvalidRequestError("body", f"not JSON: {err}") from err
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    return body


def _field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value or len(value) > 4096:
        raise InvalidRequestError(name, "must be a string of 1-4096 characters")
    return value


def _refused(err: WorkerCallError) -> web.Response:
    status = _STATUS.get(err.code_name, 502)
    return web.json_response(error_body(status, err.details or err.code_name), status=status)
