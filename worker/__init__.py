"""The role-neutral worker runtime that ``prefill_worker`` and ``decode_worker`` stand on.

    role cli ──worker.cli──> WorkerConfig (worker.config) ──worker.process.serve──> gRPC server
        + health + reflection, TANDEM_READY line, registration and heartbeats
        (worker.registration), /metrics (worker.metrics, worker.metrics_http), drain on SIGTERM
    role app = worker.app.WorkerAppShell + the role's servicer
    role servicer ──worker.convert──> protos <-> engine values; typed errors ──worker.errors──>
        gRPC status codes; TLS/mTLS on the gRPC port (worker.tls); each RPC's span and log
        context (worker.rpc_context); one host's prefill worker lending its idle cores to
        the decode worker (worker.core_lending)

The two roles never import each other; what both need lives here.
"""
