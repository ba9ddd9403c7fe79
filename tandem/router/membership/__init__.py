"""Who is in the worker pool, how loaded each member is, and the channels to them.

A worker's life in the pool::

    join:   flag (--prefill/--decode) | Register RPC | Ready pod (Kubernetes discovery)
      -> registry          routable while healthy and not draining; load from
                           heartbeats and Stats, plus the router's own active count
      -> health_monitor    grpc.health.v1 + Stats every interval: unhealthy leaves routing
                           until a probe passes; silent past its heartbeat lease: forgotten
    leave:  lease expired | pod not Ready or deleted
      -> registry.remove / expire, affinity forgotten, worker_clients channel closed
         (a lease that expired on a worker that still answers its health check: its
         calls in flight go on, the channel closes after them)

- ``registry``: pool membership and load, keyed by endpoint (injected clock).
- ``registry_service``: the ``tandem.v1.Registry`` gRPC service workers register with.
- ``health_monitor``: the probe loop; ``probes``: its worker calls (health check, Stats).
- ``k8s_discovery`` and ``k8s_pods``: the Kubernetes list/watch loop and its pure pod rules.
- ``worker_clients``: one gRPC channel per member, opened on first use, closed when it leaves.

The registry hands out ``WorkerView`` snapshots (tandem/placement/worker_view.py), what the
routing policies read. Imports those and the router's shared leaf modules (errors, status):
never the handoff package (what remembers workers beyond the registry, such as the
prefix-affinity map, is handed in as ``ForgetsWorkers``) and never the front door.
"""
