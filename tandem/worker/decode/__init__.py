"""Tandem's decode worker: ``DecodeService`` over one engine and a KV receiver.

A request's life here (DESIGN.md section 2):

    Reserve ──> blocks allocated, lease running ──> KV pushed in by a prefill worker
        ──> COMMIT(first token) ──> joins the running batch at the next step
        ──> Decode streams the tokens after the first, then finish reason and usage
    (or PrefillLocal: prefill here instead; Abort / lease expiry: blocks freed)

Modules: ``service`` (logic), ``streams`` (one request's messages), ``results`` (what the calls
return), ``servicer`` (gRPC edge), ``app``/``cli`` (the process, on ``worker``'s runtime).
Run with ``python -m tandem.worker.decode --port P --kv-port Q ...``.
"""
