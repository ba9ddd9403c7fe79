"""Can the router serve a request now? Readiness, as opposed to liveness (the process runs).

    ready  <=>  not draining
           and  at least one decode worker routable (healthy, not draining)
           and  while a cluster that has prefill workers starts: one of them routable too

"Routable" needs a worker that serves: a worker registers (or, named on the command line,
is probed) only once its model is loaded and warmed up, and the router reads its tokenizer
before it listens, so a ready router serves a request sent now.

Prefill workers: a cluster run without them (colocated) is ready on a decode worker alone.
One run with them (``RouterConfig.expects_prefill``: ``--prefill`` endpoints given or
``--expect-prefill``) is not ready until one of them is routable too, so a client polling
``/health`` while the cluster starts sends its first request to the cluster it asked for.
After that a decode worker alone keeps the router ready (it prefills itself: slower, but
served), so losing every prefill worker degrades the cluster instead of taking its front
door out of a load balancer.

HTTP ``/health`` and ``/ready`` both answer from ``reason()`` (the same handler: vLLM's
``/health`` means "a request sent now is served", and so does ours); the gRPC health service's
overall status and the ``tandem.v1.Tandem`` service's follow it too (RouterServer publishes
every change the registry reports). HTTP ``/livez`` and the gRPC ``liveness`` service say only
that the process is up and its event loop answers.
"""

from __future__ import annotations

from tandem.placement.worker_view import Role
from tandem.router.admission import AdmissionGate
from tandem.router.membership.registry import Registry

# A grpc.health.v1 service name that is SERVING for as long as the router runs (a liveness
# probe must not restart a router just because its decode workers are still loading).
LIVENESS_SERVICE = "liveness"


class Readiness:
    """Reads readiness off the registry and the admission gate (one per router: it
    remembers whether the prefill workers it waits for at the start have come)."""

    def __init__(self, registry: Registry, gate: AdmissionGate, expects_prefill: bool) -> None:
        self._registry = registry
        self._gate = gate
        self._awaiting_prefill = expects_prefill  # until a prefill worker is first routable
        registry.watch(self._note)
        self._note()

    def _note(self) -> None:
        if self._awaiting_prefill and self._registry.routable(Role.PREFILL):
            self._awaiting_prefill = False

    def reason(self) -> str | None:
        """None when the router can serve now, else why not (for a 503's body)."""
        if self._gate.closed:
            return "draining: the router takes no new requests"
        if not self._registry.routable(Role.DECODE):
            known = self._registry.count(Role.DECODE)
            if known == 0:
                return "no decode worker registered"
            return f"no healthy decode worker ({known} known, none healthy and accepting work)"
        if self._awaiting_prefill:
            known = self._registry.count(Role.PREFILL)
            return ("waiting for a prefill worker: the cluster runs with prefill workers and "
                    f"none is routable yet ({known} known)")
        return None

    @property
    def ready(self) -> bool:
        """Whether the router can serve now."""
        return self.reason() is None
