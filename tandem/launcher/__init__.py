"""The Ray launcher: ``tandem up`` / ``status`` / ``down`` and the actors they manage.

    up.py               the command: flags -> LaunchSpec -> pool actor -> endpoints
    spec.py             LaunchSpec and the actor names (one Ray namespace per cluster)
    pool.py             the named pool/registry actor: starts, scales, supervises, stops
    placement.py        pairs packed per node, replicas spread, control plane at home
    argv.py             the standalone commands' flags for the actors
    router_actor.py     the router's gRPC/HTTP server inside an actor
    worker_actor.py     a prefill/decode worker's server inside an actor (drains on request)
    signals.py          per-worker latency windows the autoscaler reads
    controller_actor.py the autoscaler's control loop inside an actor
    status.py, down.py  the other two commands; connect.py joins or starts Ray
"""
