"""Tandem's prefill worker: ``PrefillService`` over one engine and a KV sender.

    Prefill(prompt, sampling, reservation) ──> chunked prefill (prefix cache reused)
        ──> KV pushed into the decode worker's reserved blocks layer by layer
        ──> COMMIT(first token) ──> blocks released (kept prefix-cached) ──> reply

Modules: ``service`` (logic), ``push`` (one request's layer-wise push), ``errors`` and
``metrics`` (what only a pusher has), ``servicer`` (gRPC edge), ``app``/``cli`` (the process,
on ``worker``'s runtime). Run with ``python -m tandem.worker.prefill --port P ...``.
"""
