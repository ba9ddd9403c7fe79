"""Torch-free pieces every Tandem process shares; imports nothing else of the project.

    obs/         logs, metrics and traces (log_format, log_context, metrics_export, histogram,
                 tracing, tracing_setup)
    security/    the cluster credential, the gRPC interceptors that carry it, PEM/TLS files
    text/        incremental detokenization and stop-string hold-back
    wire         constants both ends of a channel must agree on: the READY line, retry hints
    grpc_keepalive  the keepalive options both ends of every gRPC channel set
    arg_parser   every command's argparse parser: no abbreviations, values never echoed
    config_file  ``--config FILE.yaml`` -> argv in front of the command line's (the CLI wins)
    block_hash   the hash chain of KV blocks (prefix caching and KV-aware routing agree on it)
    model_spec   a model as users name it (alias, GGUF file, directory) and its served name
    gguf_metadata  a GGUF file's metadata without loading its tensors (the router's tokenizer)
    step_costs   a step's fitted cost (the engine fits it; placement and the simulator read it)
    warmup_plan  the synthetic warm-up steps (the engine runs them; the simulator mirrors them)
    request_shapes  request kinds and length mixes (the load generator and the planner share them)
"""
