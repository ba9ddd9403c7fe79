"""The role-neutral worker runtime that ``prefill_worker`` and ``decode_worker`` stand on.

    role cli ──tandem.worker.cli──> WorkerConfig (tandem.worker.config) ──tandem.worker.process.serve──> gRPC server
        + health + reflection, TANDEM_READY line, registration and heartbeats
        (tandem.worker.registration), /metrics (tandem.worker.metrics, tandem.worker.metrics_http), drain on SIGTERM
    role app = tandem.worker.app.WorkerAppShell + the role's servicer
    role servicer ──tandem.worker.convert──> protos <-> plain values (the only place they
        meet: past the servicers and the registration client, workers speak dataclasses:
        tandem.worker.first_token, tandem.worker.layout, tandem.worker.reports, the engine's
        own); typed errors ──tandem.worker.errors──> gRPC status codes; TLS/mTLS on the gRPC port (tandem.worker.tls); each RPC's span and log
        context (tandem.worker.rpc_context); one host's prefill worker lending its idle cores to
        the decode worker (tandem.worker.core_lending)

The two roles never import each other; what both need lives here.
"""
