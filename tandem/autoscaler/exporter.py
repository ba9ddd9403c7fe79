"""Autoscaler decisions as Prometheus metrics (``tandem_autoscaler_*``, ``role`` label).

    tandem_autoscaler_desired_replicas{role}            what the last decision asked for
    tandem_autoscaler_actual_replicas{role}             what the actuator reported
    tandem_autoscaler_signal_value{role,signal}         the driving signal's observed value
    tandem_autoscaler_signal_target{role,signal}        ... and its target
    tandem_autoscaler_decisions_total{role,direction,signal}  decisions that changed a count
    tandem_autoscaler_flips_total{source,target}        workers told to switch roles

Each exporter owns its registry (no global state): serve it with ``serve(port)`` or read it
with ``text()``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import start_http_server

from tandem.autoscaler.decision import Decision
from tandem.autoscaler.flips import Flip


class DecisionExporter:
    """Prometheus gauges and counters for one controller."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.desired = Gauge("tandem_autoscaler_desired_replicas", "Replicas the autoscaler "
                             "wants", ["role"], registry=self.registry)
        self.actual = Gauge("tandem_autoscaler_actual_replicas", "Replicas the actuator "
                            "reports", ["role"], registry=self.registry)
        self.value = Gauge("tandem_autoscaler_signal_value", "Observed value of the signal "
                           "that drove the last decision", ["role", "signal"],
                           registry=self.registry)
        self.target = Gauge("tandem_autoscaler_signal_target", "Target of that signal",
                            ["role", "signal"], registry=self.registry)
        self.changes = Counter("tandem_autoscaler_decisions", "Decisions that changed a "
                               "replica count", ["role", "direction", "signal"],
                               registry=self.registry)
        self.flips = Counter("tandem_autoscaler_flips", "Workers told to switch roles",
                             ["source", "target"], registry=self.registry)
        self._signal: dict[str, str] = {}  # role -> the signal its gauges show now

    def record(self, decision: Decision, actual: int) -> None:
        """Export one decision and the actual count it was made against."""
        role, p = decision.role, decision.proposal
        self.desired.labels(role).set(decision.desired)
        self.actual.labels(role).set(actual)
        old = self._signal.get(role)
        if old is not None and old != p.signal:  # show only the signal driving it now
            self.value.remove(role, old)
            self.target.remove(role, old)
        self._signal[role] = p.signal
        self.value.labels(role, p.signal).set(p.value)
        self.target.labels(role, p.signal).set(p.target)
        if decision.changed:
            self.changes.labels(role, decision.direction, p.signal).inc()

    def record_flip(self, flip: Flip) -> None:
        """Count one role flip."""
        self.flips.labels(flip.source, flip.target).inc()

    def text(self) -> str:
        """The exposition text (what /metrics serves)."""
        return generate_latest(self.registry).decode()

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Serve /metrics on ``port`` from a daemon thread."""
        start_http_server(port, addr=host, registry=self.registry)
