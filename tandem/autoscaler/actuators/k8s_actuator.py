"""Scale the Helm chart's prefill and decode Deployments through the Kubernetes API.

For clusters installed without Ray's autoscaler: the chart creates one Deployment per role,
labelled ``app.kubernetes.io/component: prefill|decode`` (plus the release's own labels, see
``selector``). ``replicas()`` reads each one's ``spec.replicas`` (what was asked, so pods
still starting are not asked for twice); ``scale`` patches the ``scale`` subresource.

Scale-down is a replica count change: Kubernetes sends SIGTERM to the removed pods and the
worker process drains (no new work, finishes what it has) before exiting, within the pod's
``terminationGracePeriodSeconds`` (the chart sets it above the workers' drain timeout).
The client is synchronous; calls run in a thread so the control loop never blocks.

Role flips: not supported (``can_flip`` is false, so the autoscaler plans none). A worker can
switch roles at runtime (tandem/worker/dual/), but here each role is its own Deployment: a
flipped pod would still count in its old Deployment's replicas (so a scale of either role
would act on the wrong pods), its role label (which the router's discovery reads) would
disagree with what it serves, and a restart would bring it back in the old role. Making that
consistent (a pod relabelled and moved between ReplicaSets) is not done; ``flip`` refuses
with that reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from tandem.autoscaler.flips import FlipUnsupportedError
from tandem.autoscaler.roles import ROLES, RoleName

COMPONENT_LABEL = "app.kubernetes.io/component"


class KubernetesActuatorError(RuntimeError):
    """The Deployment of a role is missing, ambiguous, or the API refused a call."""


class KubernetesActuator:
    """An ``tandem.autoscaler.controller.Actuator`` over the apps/v1 Deployment scale endpoints."""

    def __init__(self, api_client: Any, namespace: str, selector: str = "",
                 timeout_s: float = 10.0) -> None:
        """``api_client``: a ``kubernetes.client.ApiClient``; ``selector``: extra label terms
        (e.g. ``app.kubernetes.io/instance=my-release``) that pick this release's workloads."""
        from kubernetes import client

        self._apps = client.AppsV1Api(api_client)
        self._namespace = namespace
        self._selector = selector
        self._timeout = timeout_s

    async def replicas(self) -> dict[RoleName, int]:
        """``spec.replicas`` of each role's Deployment."""
        out: dict[RoleName, int] = {}
        for role in ROLES:
            name = await self._deployment(role)
            scale = await self._call(self._apps.read_namespaced_deployment_scale, name,
                                     self._namespace)
            out[role] = int(scale.spec.replicas or 0)
        return out

    async def scale(self, role: RoleName, replicas: int, victims: Sequence[str] = ()) -> None:
        """Set the role's Deployment to ``replicas``. ``victims`` are not honoured: the
        ReplicaSet controller picks the pods to remove (each drains on SIGTERM)."""
        if replicas < 0:
            raise KubernetesActuatorError(f"cannot scale {role} to {replicas}")
        name = await self._deployment(role)
        await self._call(self._apps.patch_namespaced_deployment_scale, name, self._namespace,
                         {"spec": {"replicas": replicas}})

    @property
    def can_flip(self) -> bool:
        """False: pods cannot switch roles (see the module docstring)."""
        return False

    async def flip(self, worker: str, to_role: RoleName) -> None:
        """Refused: a pod belongs to its role's Deployment (the module docstring)."""
        raise FlipUnsupportedError(
            f"cannot flip {worker} to {to_role}: Kubernetes pods belong to one role's "
            "Deployment, which a runtime role switch would leave counting them")

    async def _deployment(self, role: RoleName) -> str:
        selector = f"{COMPONENT_LABEL}={role}" + (f",{self._selector}" if self._selector else "")
        found = await self._call(self._apps.list_namespaced_deployment, self._namespace,
                                 label_selector=selector)
        names = sorted(d.metadata.name for d in found.items)
        if len(names) != 1:
            raise KubernetesActuatorError(
                f"expected one Deployment matching {selector!r} in {self._namespace}, "
                f"found {names or 'none'}")
        return str(names[0])

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return await asyncio.to_thread(fn, *args, _request_timeout=self._timeout, **kwargs)
        except ApiException as exc:
            raise KubernetesActuatorError(
                f"{fn.__name__}: HTTP {exc.status} {exc.reason}") from exc
