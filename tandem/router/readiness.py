"""Can the router serve a request now? Readiness, as opposed to liveness (the process runs).

    ready  <=>  not draining  and  at least one decode worker routable (healthy, not draining)

Prefill workers are optional (a decode worker prefills itself), so they do not count. HTTP
``/ready`` answers from ``reason()``; the gRPC health service's overall status and the
``tandem.v1.Tandem`` service's follow it (RouterServer publishes every change the registry
reports). ``/health`` and the gRPC ``liveness`` service say only that the process is up.
"""

from __future__ import annotations

from tandem.placement.worker_view import Role
from tandem.router.admission import AdmissionGate
from tandem.router.membership.registry import Registry

# A grpc.health.v1 service name that is SERVING for as long as the router runs (a liveness
# probe must not restart a router just because its decode workers are still loading).
LIVENESS_SERVICE = "liveness"


class Readiness:
    """Reads readiness off the registry and the admission gate."""

    def __init__(self, registry: Registry, gate: AdmissionGate) -> None:
        self._registry = registry
        self._gate = gate

    def reason(self) -> str | None:
        """None when the router can serve now, else why not (for a 503's body)."""
        if self._gate.closed:
            return "draining: the router takes no new requests"
        if self._registry.routable(Role.DECODE):
            return None
        known = self._registry.count(Role.DECODE)
        if known == 0:
            return "no decode worker registered"
        return f"no healthy decode worker ({known} known, none healthy and accepting work)"

    @property
    def ready(self) -> bool:
        """Whether the router can serve now."""
        return self.reason() is None
