"""``python -m tandem.router``: parse flags, serve, print TANDEM_READY, drain on SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from tandem.common.arg_parser import ArgParser
from tandem.common.model_spec import served_name
from tandem.common.obs.log_format import add_log_args, setup_logging
from tandem.common.obs.metrics_export import add_metrics_compat_arg
from tandem.common.obs.tracing_setup import (
    TracingSetupError,
    add_tracing_args,
    setup_tracing,
    tracing_config_from_args,
)
from tandem.common.router_ports import router_http_port
from tandem.common.security.credential import add_credential_args
from tandem.common.wire import ready_line
from tandem.placement.log import PlacementLog
from tandem.router.config import PLACEMENTS, RouterConfig
from tandem.router.limit_flags import (
    add_admission_args,
    add_grammar_limit_args,
    add_limit_args,
    grammar_limit_fields,
)
from tandem.router.model_files import router_model_dir
from tandem.router.security import RouterSecurity
from tandem.router.server import BindError, RouterServer
from tandem.router.tokenizer import RouterTokenizer, TokenizerLoadError

log = logging.getLogger("router")


def build_parser() -> argparse.ArgumentParser:
    """The router's flags."""
    p = ArgParser(prog="python -m tandem.router", description="Tandem's router", config_file=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=50051, help="gRPC port (0 picks a free one)")
    p.add_argument("--prefill", default="", help="prefill workers, HOST:PORT,...")
    p.add_argument("--decode", default="", help="decode workers, HOST:PORT,...")
    p.add_argument("--expect-prefill", action="store_true",
                   help="the cluster has prefill workers that register themselves: /health "
                   "(readiness) waits for one as well as for a decode worker (implied by "
                   "--prefill; tandem up sets it)")
    p.add_argument("--model", default="",
                   help="alias (smollm2), checkpoint directory or .gguf file, found as the "
                   "workers find it; the router reads its tokenizer and config only")
    p.add_argument("--tokenizer", default="", metavar="DIR",
                   help="read the tokenizer and config from this directory instead of "
                   "--model's")
    p.add_argument("--model-name", "--served-model-name", dest="model_name", default="",
                   help="served model id (default: the alias, the .gguf file's stem or the "
                   "directory's name)")
    p.add_argument("--quantization", default=None, metavar="METHOD",
                   help="accepted so a vLLM command line works unchanged, and ignored: "
                   "weights live on the workers (give it to them)")
    p.add_argument(
        "--max-model-len",
        type=int,
        default=0,
        help="context length (default: max_position_embeddings of config.json)",
    )
    p.add_argument("--max-inflight", type=int, default=256,
                   help="sequences the router runs at once (a prompt forked into n is n)")
    p.add_argument("--max-queue", type=int, default=512,
                   help="sequences that may wait for admission (429 beyond it)")
    p.add_argument(
        "--placement-log", default=None, metavar="FILE",
        help="append a line per placement decision to FILE: the prompt, the decision and its "
        "reason, both options' predicted TTFT and the inputs behind them (the workers' "
        "step-cost fits, queues, learnt remote overheads; tandem/placement/log.py; "
        "default: off)",
    )
    p.add_argument(
        "--local-prefill-threshold",
        type=int,
        default=0,
        help="override placement: prompts shorter than this prefill on the decode worker, "
        "the rest on a prefill worker (0: placement decides)",
    )
    p.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="adaptive",
        help="where prompts are prefilled: adaptive (per request, predicted TTFT and decode "
        "token gap against the SLO; tandem/placement/cost_model.py) or remote (always on a "
        "prefill worker when there is one)",
    )
    p.add_argument("--slo-ttft-s", type=float, default=2.0,
                   help="TTFT target adaptive placement keeps requests inside")
    p.add_argument("--slo-tpot-s", type=float, default=0.1,
                   help="token-gap (TPOT) target for the streams already decoding")
    p.add_argument("--link-prior-gbps", type=float, default=10.0,
                   help="adaptive placement: the link (Gb/s) a KV push is priced at between a "
                   "prefill and a decode worker before its own pushes have measured it")
    p.add_argument("--link-prior-rtt-ms", type=float, default=0.5,
                   help="adaptive placement: the fixed cost (ms) of a KV push on such a link")
    p.add_argument("--block-size", type=int, default=16, help="KV block size (affinity hashing)")
    p.add_argument(
        "--prefill-attempts",
        type=int,
        default=2,
        help="prefill workers tried before prefilling on the decode worker",
    )
    p.add_argument(
        "--max-migrations", type=int, default=2, help="decode-worker failures one request survives"
    )
    p.add_argument(
        "--affinity-max-queue",
        type=int,
        default=8,
        help="queue depth above which a prefill worker loses prefix affinity",
    )
    p.add_argument(
        "--decode-affinity-slack",
        type=int,
        default=4,
        help="requests beyond the least busy decode worker's queue that the one holding a "
        "prompt's cached prefix may have and still be chosen",
    )
    p.add_argument("--lease-s", type=float, default=30.0, help="reservation lease")
    p.add_argument("--live-move-precopy-blocks", type=int, default=1,
                   help="a live move pushes a stream's full KV blocks while it decodes on "
                   "(pre-copy) once it has at least this many; 0: never")
    p.add_argument("--heartbeat-interval", type=float, default=2.0)
    p.add_argument("--health-interval", type=float, default=2.0)
    p.add_argument("--drain-timeout", type=float, default=60.0)
    p.add_argument(
        "--rpc-timeout-s",
        type=float,
        default=30.0,
        help="bound on a worker control call (Reserve, Abort) when the client's deadline "
        "is later or unset",
    )
    p.add_argument(
        "--prefill-timeout-s",
        type=float,
        default=600.0,
        help="bound on a prefill call (Prefill, PrefillLocal) when the client's deadline "
        "is later or unset",
    )
    p.add_argument(
        "--discovery",
        choices=["static", "kubernetes"],
        default="static",
        help="static: --prefill/--decode and self-registration; kubernetes: worker pods by label",
    )
    p.add_argument("--k8s-namespace", default="", help="namespace to watch (default: own)")
    p.add_argument(
        "--k8s-selector",
        default="app.kubernetes.io/component in (prefill,decode)",
        help="label selector of worker pods",
    )
    add_edge_args(p)
    add_limit_args(p)
    add_grammar_limit_args(p)
    add_admission_args(p)
    add_credential_args(p, "the Registry (workers joining) and every call to a worker")
    p.add_argument("--allow-unauthenticated", action="store_true",
                   help="serve the public API on a non-loopback address without API keys")
    add_metrics_compat_arg(p)
    add_log_args(p)
    add_tracing_args(p)
    return p


def setup_observability(args: argparse.Namespace) -> None:
    """The router process's logging (--log-format, --log-level) and tracing (--otlp-endpoint,
    --trace-file); raises TracingSetupError."""
    setup_logging(args.log_format, args.log_level, service="router")
    setup_tracing(tracing_config_from_args(args), "tandem-router")


def add_edge_args(p: argparse.ArgumentParser) -> None:
    """The public edge's flags: the HTTP API, API keys, TLS, and mTLS to workers."""
    p.add_argument("--http-host", default="", help="HTTP listen address (default: --host)")
    p.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="OpenAI-compatible HTTP port (default 8000, or a free one when --port is 0; "
        "0 picks a free one; -1 disables)",
    )
    p.add_argument("--api-key-file", default="", help="accepted API keys, one per line")
    p.add_argument("--api-key", dest="api_keys", action="append", default=[], metavar="KEY",
                   help="an accepted API key (repeat for several; a command line is visible "
                   "to other local users: prefer --api-key-file or --config)")
    p.add_argument("--metrics-key-file", default="",
                   help="keys that open GET /metrics only, one per line (a Prometheus "
                   "scraper's bearer token; API keys open it too)")
    p.add_argument("--admin-key-file", default="",
                   help="keys that open the admin routes only, one per line")
    p.add_argument("--allow-runtime-lora-updates", action="store_true",
                   help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
                   "(behind --admin-key-file; vLLM: VLLM_ALLOW_RUNTIME_LORA_UPDATING)")
    p.add_argument("--tls-cert", default="", help="PEM certificate chain for gRPC and HTTP")
    p.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    p.add_argument("--worker-ca", default="", help="CA that signed the workers' certificates")
    p.add_argument("--worker-cert", default="", help="client certificate shown to workers")
    p.add_argument("--worker-key", default="", help="private key of --worker-cert")


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    """Flags -> RouterConfig; raises ValueError with a clear message (or TokenizerLoadError:
    a GGUF whose tokenizer cannot be read)."""
    tok_dir, default_name = model_files(args.model, args.tokenizer)
    max_model_len = args.max_model_len or _config_max_len(tok_dir)
    if max_model_len <= 0:
        raise ValueError("--max-model-len is required (no max_position_embeddings in config.json)")
    return RouterConfig(
        tokenizer_dir=str(tok_dir),
        model_name=args.model_name or default_name,
        max_model_len=max_model_len,
        host=args.host,
        port=args.port,
        prefill_endpoints=_split(args.prefill),
        decode_endpoints=_split(args.decode),
        expect_prefill=args.expect_prefill,
        max_inflight=args.max_inflight,
        max_queue=args.max_queue,
        local_prefill_threshold=args.local_prefill_threshold,
        placement_log=args.placement_log,
        placement=args.placement,
        slo_ttft_s=args.slo_ttft_s,
        slo_tpot_s=args.slo_tpot_s,
        link_prior_gbps=args.link_prior_gbps,
        link_prior_rtt_s=args.link_prior_rtt_ms / 1000.0,
        block_size=args.block_size,
        prefill_attempts=args.prefill_attempts,
        max_migrations=args.max_migrations,
        affinity_max_queue=args.affinity_max_queue,
        decode_affinity_slack=args.decode_affinity_slack,
        lease_s=args.lease_s,
        live_move_precopy_blocks=args.live_move_precopy_blocks,
        heartbeat_interval_s=args.heartbeat_interval,
        health_interval_s=args.health_interval,
        drain_timeout_s=args.drain_timeout,
        rpc_timeout_s=args.rpc_timeout_s,
        prefill_timeout_s=args.prefill_timeout_s,
        http_host=args.http_host,
        http_port=_http_port(args),
        cluster_secret_file=args.cluster_secret_file or "",
        insecure=args.insecure,
        allow_unauthenticated=args.allow_unauthenticated,
        api_key_file=args.api_key_file,
        api_keys=tuple(args.api_keys),
        metrics_key_file=args.metrics_key_file,
        admin_key_file=args.admin_key_file,
        allow_runtime_lora_updates=args.allow_runtime_lora_updates,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        worker_ca=args.worker_ca,
        worker_cert=args.worker_cert,
        worker_key=args.worker_key,
        discovery=args.discovery,
        k8s_namespace=args.k8s_namespace,
        k8s_selector=args.k8s_selector,
        max_stop_strings=args.max_stop_strings,
        max_stop_chars=args.max_stop_chars,
        max_stop_token_ids=args.max_stop_token_ids,
        max_request_bytes=args.max_request_bytes,
        tokenizer_threads=args.tokenizer_threads,
        max_inflight_per_connection=args.max_inflight_per_connection,
        max_inflight_per_key=args.max_inflight_per_key,
        http_read_timeout_s=args.http_read_timeout,
        max_inflight_tokens=args.max_inflight_tokens,
        max_inflight_tokens_per_connection=args.max_inflight_tokens_per_connection,
        max_inflight_tokens_per_key=args.max_inflight_tokens_per_key,
        max_fanout=args.max_fanout,
        max_messages=args.max_messages,
        max_connections_per_address=args.max_connections_per_address,
        http_parse_threads=args.http_parse_threads,
        http_parse_queue=args.http_parse_queue,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        metrics_compat=args.metrics_compat,
        **grammar_limit_fields(args),
    )


def model_files(model: str, tokenizer: str) -> tuple[Path, str]:
    """(the directory the router reads, the default served name) for ``--model`` and
    ``--tokenizer``: ``--tokenizer`` wins for the files; the name is ``--model``'s (its alias,
    file stem or directory name), else the ``--tokenizer`` directory's name."""
    if tokenizer:
        directory = Path(tokenizer)
        return directory, served_name(model) if model else directory.resolve().name
    if not model:
        raise ValueError("--model is required: an alias (smollm2), a checkpoint directory or "
                         "a .gguf file")
    return router_model_dir(model), served_name(model)


def main(argv: list[str] | None = None) -> int:
    """Run the router until SIGTERM/SIGINT; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        setup_observability(args)
        config = config_from_args(args)
        security = RouterSecurity.from_config(config)  # key and TLS files: fail before binding
        check_placement_log(config.placement_log)
        tokenizer = RouterTokenizer(config.tokenizer_dir)
    except (ValueError, TokenizerLoadError, TracingSetupError) as err:
        print(f"router: error: {err}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(config, tokenizer, security))
    except BindError as err:
        print(f"router: error: {err}", file=sys.stderr)
        return 1


def check_placement_log(path: str | None) -> None:
    """ValueError unless ``--placement-log``'s file (when given) can be opened to append."""
    if path:
        try:
            PlacementLog(path).close()
        except OSError as exc:
            raise ValueError(f"cannot open --placement-log {path}: {exc}") from exc


async def _serve(
    config: RouterConfig, tokenizer: RouterTokenizer, security: RouterSecurity
) -> int:
    server = RouterServer(config, tokenizer, security)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before READY: a prompt SIGTERM still drains
        loop.add_signal_handler(sig, stop.set)
    port = await server.start()
    discovery = await _start_discovery(config, server)
    info = {"role": "router", "grpc": f"{_reachable(config.host)}:{port}"}
    if server.http is not None:
        info["http"] = f"{_reachable(config.http_host or config.host)}:{server.http_port}"
    print(ready_line(info), end="", flush=True)
    await stop.wait()
    log.info("draining: no new requests, waiting for %d in flight", server.gate.ledger.running)
    drained = await server.drain()
    if discovery is not None:
        watch, sink = discovery
        await watch.stop()
        await sink.close()
    await server.stop()
    return 0 if drained else 1


async def _start_discovery(config: RouterConfig, server: RouterServer) -> Any:
    """Watch worker pods when ``--discovery kubernetes`` (the client is imported only then)."""
    if config.discovery != "kubernetes":
        return None
    from tandem.router.membership import k8s_discovery as kd
    from tandem.router.membership.member_proof import MemberProver

    prover = MemberProver(server.clients, server.security.credential)
    sink = kd.RegistrySink(server.registry, server.clients, server.affinity,
                          server.inflight, prover=prover)
    discovery = kd.KubernetesDiscovery(
        kd.DiscoveryConfig(kd.namespace_or_own(config.k8s_namespace), config.k8s_selector),
        kd.api_client_from_environment(),
        sink.apply,
    )
    await discovery.start()
    return discovery, sink


def _reachable(host: str) -> str:
    """A wildcard listen address as the address a local client dials."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "[::]", "") else host


def _http_port(args: argparse.Namespace) -> int:
    """The HTTP port (tandem/common/router_ports.py's rule: a router on a free gRPC port takes a
    free HTTP port too, and so does one whose gRPC port is the HTTP default)."""
    if args.http_port is not None and args.http_host and args.http_host != args.host:
        return int(args.http_port)  # another address: the same port number is free there
    port, notice = router_http_port(args.port, args.http_port)
    if notice:
        log.warning("%s", notice)
    return port


def _split(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.split(",") if p.strip())


def _config_max_len(directory: Path) -> int:
    config = directory / "config.json"
    if not config.is_file():
        return 0
    value = json.loads(config.read_text()).get("max_position_embeddings", 0)
    return int(value) if isinstance(value, int) else 0
