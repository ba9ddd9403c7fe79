"""Worker pods as discovery sees them: role, endpoint, readiness, and what changed.

Pure bookkeeping over pod dicts as the Kubernetes API returns them (no client, no I/O), so the
rules are tested without a server: a pod serves when it has the worker role label, an IP and a
gRPC port, its Ready condition is True and it is not being deleted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tandem.placement.worker_view import Role

ROLE_LABEL = "app.kubernetes.io/component"
PORT_ANNOTATION = "tandem.dev/grpc-port"


@dataclass(frozen=True, slots=True)
class PodState:
    """What discovery keeps of one pod: its endpoint (if it has one) and whether it serves."""

    role: Role
    endpoint: str | None
    ready: bool


@dataclass(slots=True)
class Membership:
    """One change to announce: endpoints that joined, left routing, and whose pod is gone."""

    joined: list[tuple[Role, str]] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.joined or self.left or self.gone)


def pod_state(pod: Mapping[str, Any], port_name: str = "grpc") -> PodState | None:
    """A pod's role, endpoint and readiness; None when it is not a Tandem worker."""
    meta = pod.get("metadata") or {}
    role_name = (meta.get("labels") or {}).get(ROLE_LABEL)
    if role_name not in (Role.PREFILL.value, Role.DECODE.value):
        return None
    status = pod.get("status") or {}
    ip, port = status.get("podIP"), _grpc_port(pod, port_name)
    endpoint = f"{ip}:{port}" if ip and port else None
    ready = endpoint is not None and not meta.get("deletionTimestamp") and any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return PodState(Role(role_name), endpoint, ready)


def _grpc_port(pod: Mapping[str, Any], port_name: str) -> int | None:
    annotated = ((pod.get("metadata") or {}).get("annotations") or {}).get(PORT_ANNOTATION)
    if annotated is not None:
        return int(annotated) if str(annotated).isdigit() else None
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == port_name and port.get("containerPort"):
                return int(port["containerPort"])
    return None


class PodTracker:
    """Pods by name, and the diff between their state and what was last announced."""

    def __init__(self, port_name: str) -> None:
        self._port_name = port_name
        self._pods: dict[str, PodState] = {}
        self._announced: dict[str, Role] = {}  # endpoint -> role, currently in the pool
        self._known: set[str] = set()  # endpoints of every pod that exists

    def replace(self, pods: list[Mapping[str, Any]]) -> Membership:
        """A LIST result: the whole state."""
        self._pods = {}
        for pod in pods:
            self._put(pod)
        return self._diff()

    def event(self, kind: str, pod: Mapping[str, Any]) -> Membership:
        """One watch event (ADDED, MODIFIED or DELETED)."""
        if kind == "DELETED":
            self._pods.pop(_name(pod), None)
        else:
            self._put(pod)
        return self._diff()

    def _put(self, pod: Mapping[str, Any]) -> None:
        state = pod_state(pod, self._port_name)
        if state is None:
            self._pods.pop(_name(pod), None)
        else:
            self._pods[_name(pod)] = state

    def _diff(self) -> Membership:
        ready = {p.endpoint: p.role for p in self._pods.values() if p.ready and p.endpoint}
        known = {p.endpoint for p in self._pods.values() if p.endpoint}
        change = Membership(
            joined=[(role, ep) for ep, role in ready.items() if self._announced.get(ep) != role],
            left=[ep for ep, role in self._announced.items() if ready.get(ep) != role],
            gone=sorted(self._known - known),
        )
        self._announced, self._known = ready, known
        return change


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))
