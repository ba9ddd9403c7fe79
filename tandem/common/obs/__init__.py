"""Observability every process shares: logs, metrics and traces.

    log_format      ``--log-format text|json`` and ``--log-level``: one logging setup for all
    log_context     the request a log line belongs to (a context variable and a logging filter)
    metrics_export  what /metrics serves: model_name on every series, vLLM's names as aliases
    histogram       quantiles and differences of Prometheus' cumulative histograms
    tracing         OpenTelemetry spans and W3C ``traceparent`` propagation over plain dicts
    tracing_setup   ``--otlp-endpoint`` / ``--trace-file``: the SDK installed when asked
"""
