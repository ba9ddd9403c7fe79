"""Tandem's prefill worker: ``PrefillService`` over one engine and a KV sender.

    Prefill(prompt, sampling, reservation) ──> chunked prefill (prefix cache reused)
        ──> KV pushed into the decode worker's reserved blocks layer by layer
        ──> COMMIT(first token) ──> blocks released (kept prefix-cached) ──> reply

Modules: ``service`` (logic), ``push`` (one request's layer-wise push), ``servicer`` (gRPC
edge), ``app``/``cli`` (the process). Run with ``python -m prefill_worker --port P ...``.

Import rule exception (documented here and in ``decode_worker``): this package imports
``decode_worker.convert``, ``decode_worker.errors`` and ``decode_worker.process`` (+ its
``registration``), the single definitions of the proto <-> engine conversions, the error ->
status mapping and the worker-process runtime shared by both roles.
"""
