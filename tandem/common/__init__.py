"""Torch-free pieces every Tandem process shares; imports nothing else of the project.

    wire         constants both ends of a channel must agree on: the READY line, retry hints
    tls          reading PEM files named by flags (one error type for every process)
    detokenizer  incremental decoding of output ids (tokenizers' DecodeStream) into text deltas
    stop_strings stop-string matching and hold-back over text chunks (the detokenizer's text side)
    credential   the cluster credential (secret file, derived keys) every internal channel uses
    grpc_auth    the gRPC interceptors that put the credential on calls and check it
    grpc_keepalive  the keepalive options both ends of every gRPC channel set
    arg_parser   every command's argparse parser: no abbreviations, values never echoed
    config_file  ``--config FILE.yaml`` -> argv in front of the command line's (the CLI wins)
    metrics_export  what /metrics serves: model_name on every series, vLLM's names as aliases
    log_context  the request a log line belongs to (a context variable and a logging filter)
    log_format   ``--log-format text|json`` and ``--log-level``: one logging setup for all
    tracing      OpenTelemetry spans and W3C ``traceparent`` propagation over plain dicts
    tracing_setup  ``--otlp-endpoint`` / ``--trace-file``: the SDK installed when asked
    async_merge  several async streams as one, in arrival order (a request's fanned-out legs)
    request_shapes  the serving workloads' request kinds, mixes and chat shape: what the load
                 generator sends and the planner's simulator replays
"""
