"""The Kubernetes actuator against an API server double that speaks the real HTTP protocol.

The double is a small aiohttp app on localhost serving what the ``kubernetes`` client calls
for Deployments: ``GET .../deployments?labelSelector=`` (a DeploymentList), ``GET`` and
``PATCH .../deployments/{name}/scale`` (an autoscaling/v1 Scale; merge or strategic-merge
patch bodies), and Status errors. The real client talks to it over HTTP.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from tandem.autoscaler.actuators.k8s_actuator import KubernetesActuator, KubernetesActuatorError
from tandem.autoscaler.config import AutoscaleConfig, Cooldown, FixedCounts
from tandem.autoscaler.controller import Controller, ScrapeTarget

NS = "serving"
PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json")


def _deployment(name: str, role: str, release: str, replicas: int) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "tandem", "app.kubernetes.io/instance": release,
              "app.kubernetes.io/component": role}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NS, "labels": labels, "uid": f"uid-{name}"},
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels},
                         "spec": {"containers": [{"name": role, "image": "tandem:test"}]}},
        },
        "status": {"replicas": replicas},
    }


class ApiDouble:
    """Deployments of one namespace and the requests made against them."""

    def __init__(self) -> None:
        self.deployments: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, str]] = []  # (method, path, content type)
        self.forbid_patch = False

    def add(self, name: str, role: str, release: str = "a", replicas: int = 1) -> None:
        self.deployments[name] = _deployment(name, role, release, replicas)

    def replicas(self, name: str) -> int:
        return int(self.deployments[name]["spec"]["replicas"])

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record])
        base = "/apis/apps/v1/namespaces/{ns}/deployments"
        app.router.add_get(base, self._list)
        app.router.add_get(base + "/{name}/scale", self._get_scale)
        app.router.add_patch(base + "/{name}/scale", self._patch_scale)
        return app

    @web.middleware
    async def _record(self, request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
        self.requests.append((request.method, request.path, request.content_type))
        return await handler(request)

    async def _list(self, request: web.Request) -> web.Response:
        self._check_ns(request)
        terms = [t.split("=", 1) for t in request.query.get("labelSelector", "").split(",") if t]
        items = [d for d in self.deployments.values()
                 if all(d["metadata"]["labels"].get(k) == v for k, v in terms)]
        return web.json_response({"apiVersion": "apps/v1", "kind": "DeploymentList",
                                  "metadata": {"resourceVersion": "1"}, "items": items})

    async def _get_scale(self, request: web.Request) -> web.Response:
        return web.json_response(self._scale(self._find(request)))

    async def _patch_scale(self, request: web.Request) -> web.Response:
        dep = self._find(request)
        if request.content_type not in PATCH_TYPES:
            raise _status(415, "UnsupportedMediaType", f"{request.content_type} not supported")
        if self.forbid_patch:
            raise _status(403, "Forbidden", "deployments.apps/scale is forbidden")
        body = await request.json()
        replicas = body.get("spec", {}).get("replicas")
        if not isinstance(replicas, int) or replicas < 0:
            raise _status(422, "Invalid", "spec.replicas must be a non-negative integer")
        dep["spec"]["replicas"] = replicas
        return web.json_response(self._scale(dep))

    def _check_ns(self, request: web.Request) -> None:
        if request.match_info["ns"] != NS:
            raise _status(404, "NotFound", f"namespace {request.match_info['ns']} not found")

    def _find(self, request: web.Request) -> dict[str, Any]:
        self._check_ns(request)
        dep = self.deployments.get(request.match_info["name"])
        if dep is None:
            raise _status(404, "NotFound", f"deployments.apps {request.match_info['name']!r}")
        return dep

    @staticmethod
    def _scale(dep: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": dep["metadata"]["name"], "namespace": NS},
                "spec": {"replicas": dep["spec"]["replicas"]},
                "status": {"replicas": dep["status"]["replicas"]}}


def _status(code: int, reason: str, message: str) -> web.HTTPException:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}
    exc = web.HTTPException(text=json.dumps(body), content_type="application/json")
    exc.set_status(code)
    return exc


@asynccontextmanager
async def served(api: ApiDouble) -> AsyncIterator[Any]:
    """The double on a free localhost port and a real kubernetes ApiClient pointed at it."""
    from kubernetes import client

    runner = web.AppRunner(api.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    cfg = client.Configuration(host=f"http://127.0.0.1:{port}")
    api_client = client.ApiClient(cfg)
    try:
        yield api_client
    finally:
        api_client.close()
        await runner.cleanup()


def _two_releases() -> ApiDouble:
    api = ApiDouble()
    api.add("a-prefill", "prefill", "a", 1)
    api.add("a-decode", "decode", "a", 2)
    api.add("b-prefill", "prefill", "b", 5)
    api.add("b-decode", "decode", "b", 5)
    return api


def test_reads_and_patches_the_scale_subresource() -> None:
    async def run() -> None:
        api = _two_releases()
        async with served(api) as api_client:
            act = KubernetesActuator(api_client, NS, "app.kubernetes.io/instance=a")
            assert await act.replicas() == {"prefill": 1, "decode": 2}
            await act.scale("prefill", 3)
            assert api.replicas("a-prefill") == 3
            assert api.replicas("b-prefill") == 5  # the other release is untouched
            assert await act.replicas() == {"prefill": 3, "decode": 2}
        patches = [r for r in api.requests if r[0] == "PATCH"]
        assert patches == [(
            "PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/a-prefill/scale", patches[0][2])]
        assert patches[0][2] in PATCH_TYPES

    asyncio.run(run())


def test_missing_ambiguous_and_refused_are_typed_errors() -> None:
    async def run() -> None:
        api = _two_releases()
        async with served(api) as api_client:
            with pytest.raises(KubernetesActuatorError, match="found \\['a-prefill', 'b-pre"):
                await KubernetesActuator(api_client, NS).replicas()  # no release selector
            with pytest.raises(KubernetesActuatorError, match="none"):
                await KubernetesActuator(api_client, NS, "app.kubernetes.io/instance=c").scale(
                    "decode", 1)
            with pytest.raises(KubernetesActuatorError, match="HTTP 404"):
                await KubernetesActuator(api_client, "elsewhere").replicas()
            api.forbid_patch = True
            act = KubernetesActuator(api_client, NS, "app.kubernetes.io/instance=a")
            with pytest.raises(KubernetesActuatorError, match="HTTP 403"):
                await act.scale("decode", 4)
            assert api.replicas("a-decode") == 2

    asyncio.run(run())


def test_controller_drives_the_deployments() -> None:
    """The control loop with a fixed policy sets both Deployments and exports what it did."""

    async def run() -> None:
        api = _two_releases()
        cfg = AutoscaleConfig(policy="fixed", interval_s=0.05, cooldown=Cooldown(0, 0),
                              stabilization_s=0, fixed=FixedCounts(prefill=3, decode=1))

        async def no_workers() -> list[ScrapeTarget]:
            return []

        async with served(api) as api_client:
            act = KubernetesActuator(api_client, NS, "app.kubernetes.io/instance=a")
            controller = Controller(cfg, act, no_workers)
            for _ in range(3):
                await controller.step()
            await controller.close()
        assert api.replicas("a-prefill") == 3 and api.replicas("a-decode") == 1
        assert api.replicas("b-prefill") == 5
        metrics = controller.exporter.text()
        assert 'tandem_autoscaler_desired_replicas{role="prefill"} 3.0' in metrics
        assert 'tandem_autoscaler_actual_replicas{role="prefill"} 3.0' in metrics
        changed = [(d.role, d.current, d.desired) for d in controller.changes]
        assert ("prefill", 1, 3) in changed and ("decode", 2, 1) in changed

    asyncio.run(run())
