"""The router's configuration: one frozen, validated dataclass built from CLI flags."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.common.obs.metrics_export import COMPAT_CHOICES
from tandem.router.cost import Cost
from tandem.router.grammar_limits import GrammarLimits
from tandem.router.reasoning import PARSERS as REASONING_PARSERS
from tandem.router.request_caps import RequestCaps

# The longest a worker call may be bounded by (a day): "no bound" is not a setting.
_MAX_TIMEOUT_S = 86_400.0
PLACEMENTS = ("adaptive", "remote")


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """Everything the router needs to know, passed down explicitly.

    ``placement``: how a prompt's prefill is placed: "adaptive" (per request, from the
    workers' measured step costs against ``slo_ttft_s``/``slo_tpot_s``:
    tandem/placement/cost_model.py) or "remote" (always on a prefill worker when one exists).
    ``local_prefill_threshold`` > 0 overrides both: prompts shorter than this many tokens are
    prefilled on the decode worker itself, the rest remotely. ``affinity_max_queue``: a sticky
    prefill worker with more queued work than this loses its affinity to the least loaded one.
    ``decode_affinity_slack``: the decode worker holding a prompt's longest cached prefix is
    chosen unless its queue is deeper than this many requests beyond the least busy one's.
    ``link_prior_gbps``/``link_prior_rtt_s``: the link adaptive placement prices a KV push at
    between a prefill and a decode worker it has not measured yet (tandem/placement/link.py).
    """

    tokenizer_dir: str
    model_name: str
    max_model_len: int
    host: str = "127.0.0.1"
    port: int = 50051
    prefill_endpoints: tuple[str, ...] = field(default_factory=tuple)
    decode_endpoints: tuple[str, ...] = field(default_factory=tuple)
    # The cluster has prefill workers that register themselves: readiness waits for one
    # (tandem/router/readiness.py); ``prefill_endpoints`` imply it.
    expect_prefill: bool = False
    max_inflight: int = 256
    max_queue: int = 512
    retry_after_ms: int = 200
    local_prefill_threshold: int = 0
    placement: str = "adaptive"
    placement_log: str | None = None  # a line per placement decision (tandem/placement/log.py)
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.1
    link_prior_gbps: float = 10.0
    link_prior_rtt_s: float = 0.0005
    block_size: int = 16
    affinity_max_queue: int = 8
    decode_affinity_slack: int = 4
    affinity_entries: int = 65536
    prefill_attempts: int = 2
    max_migrations: int = 2
    lease_s: float = 30.0
    # A live move pre-copies a stream's full blocks while it decodes on once it has at least
    # this many (0: never; tandem/router/handoff/leg_precopy.py)
    live_move_precopy_blocks: int = 1
    heartbeat_interval_s: float = 2.0
    missed_heartbeats: int = 3
    health_interval_s: float = 2.0
    health_timeout_s: float = 1.0
    drain_timeout_s: float = 60.0
    # Bounds on worker calls when the client set no deadline (or a longer one): short control
    # calls (Reserve; Abort takes at most 2 s of it) and prefills (Prefill, PrefillLocal: may
    # queue behind long prompts; matches the KV transfer's max_transfer_s). The decode stream
    # has only the client's deadline; keepalive and the health monitor find a silent worker.
    rpc_timeout_s: float = 30.0
    prefill_timeout_s: float = 600.0
    # What one client may cost (tandem/router/validation.py, tandem/router/client_limits.py, tandem/router/http/):
    # stop strings per request and their length, stop token ids; request size (HTTP body and
    # gRPC message); tokenizer threads (prompts are tokenized there, after admission);
    # requests in flight per client connection and per API key (0: no bound); how long an
    # HTTP client may take to send a request's head (from connecting, or from its previous
    # response: idle keep-alive connections close then too) and, again, its body.
    max_stop_strings: int = 4
    max_stop_chars: int = 256
    max_stop_token_ids: int = 64
    max_request_bytes: int = 4 * 1024 * 1024
    tokenizer_threads: int = 2
    max_inflight_per_connection: int = 128
    max_inflight_per_key: int = -1  # -1: as max_inflight
    http_read_timeout_s: float = 75.0
    # How complex a structured output's grammar may be (tandem/router/grammar_limits.py:
    # GrammarLimits' fields of the same names, without the prefix); refused with 400 /
    # INVALID_ARGUMENT naming the limit, before any worker compiles it.
    grammar_max_properties: int = 256
    grammar_max_schema_nodes: int = 4096
    grammar_max_enum: int = 1024
    grammar_max_branches: int = 128
    grammar_max_depth: int = 64
    grammar_max_regex_chars: int = 4096
    grammar_max_rules: int = 1024
    # Admission by cost (tandem/router/cost.py): the running budget's prompt tokens, and each
    # client's (0: no bound; -1: the global one's; a nonzero bound below max_model_len is
    # raised to it, so one full-length prompt always fits); sequences one request may fan out
    # into (prompts x max(n, best_of)), messages in one chat, HTTP connections one address
    # may hold open (0: no bound), and the pool that parses large HTTP bodies off the event
    # loop (its threads; requests waiting for one beyond the threads, then 429).
    max_inflight_tokens: int = 1 << 21
    max_inflight_tokens_per_connection: int = 1 << 20
    max_inflight_tokens_per_key: int = -1
    max_fanout: int = 128
    max_messages: int = 2048
    max_connections_per_address: int = 512
    http_parse_threads: int = 2
    http_parse_queue: int = 32
    # Which markup chat outputs with tools are parsed as (tandem/router/tools/select.py): "auto"
    # picks it from the chat template.
    tool_call_parser: str = "auto"
    # Which model family's thinking chat outputs are split from their answer
    # (tandem/router/reasoning.py; "" none: the thinking stays in the text).
    reasoning_parser: str = ""
    # /metrics: "vllm" also exports vLLM's names for the figures that mean the same
    # (tandem/common/obs/metrics_export.py); "none": tandem_* only.
    metrics_compat: str = "vllm"
    # Where workers come from: "static" (flags + self-registration) or "kubernetes" (pods by
    # label, tandem/router/k8s_discovery.py); "" namespace means the router pod's own.
    discovery: str = "static"
    k8s_namespace: str = ""
    k8s_selector: str = "app.kubernetes.io/component in (prefill,decode)"
    # OpenAI-compatible HTTP API: "" host means the gRPC host; port 0 picks one, -1 (the
    # default here; the CLI's is 8000) disables it.
    http_host: str = ""
    http_port: int = -1
    # Security: file paths, read once at startup (tandem/router/security.py); "" means off. The
    # cluster credential is required (``insecure`` runs without one, explicitly).
    cluster_secret_file: str = ""
    insecure: bool = False
    # The public API on a non-loopback address needs API keys unless this is set.
    allow_unauthenticated: bool = False
    api_key_file: str = ""
    # Keys given inline (--api-key): secrets, so left out of the repr (never logged).
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    # Keys that open GET /metrics only (a scraper's credential; API keys open it too).
    metrics_key_file: str = ""
    # Keys that open the admin routes only (runtime LoRA updates); API keys never do.
    admin_key_file: str = ""
    # /v1/load_lora_adapter and /v1/unload_lora_adapter exist (behind an admin key).
    allow_runtime_lora_updates: bool = False
    tls_cert: str = ""
    tls_key: str = ""
    worker_ca: str = ""
    worker_cert: str = ""
    worker_key: str = ""

    def __post_init__(self) -> None:
        checks = {
            "max_model_len": self.max_model_len >= 1,
            "port": 0 <= self.port <= 65535,
            "http_port": -1 <= self.http_port <= 65535,
            "max_inflight": self.max_inflight >= 1,
            "max_queue": self.max_queue >= 0,
            "retry_after_ms": self.retry_after_ms >= 1,
            "local_prefill_threshold": self.local_prefill_threshold >= 0,
            "placement": self.placement in PLACEMENTS,
            "slo_ttft_s": 0 < self.slo_ttft_s <= _MAX_TIMEOUT_S,
            "slo_tpot_s": 0 < self.slo_tpot_s <= _MAX_TIMEOUT_S,
            "link_prior_gbps": 0 < self.link_prior_gbps < 1e6,
            "link_prior_rtt_s": 0 <= self.link_prior_rtt_s <= _MAX_TIMEOUT_S,
            "block_size": self.block_size >= 1,
            "affinity_max_queue": self.affinity_max_queue >= 0,
            "decode_affinity_slack": self.decode_affinity_slack >= 0,
            "affinity_entries": self.affinity_entries >= 1,
            "prefill_attempts": self.prefill_attempts >= 1,
            "max_migrations": self.max_migrations >= 0,
            "lease_s": self.lease_s > 0,
            "live_move_precopy_blocks": self.live_move_precopy_blocks >= 0,
            "heartbeat_interval_s": self.heartbeat_interval_s > 0,
            "missed_heartbeats": self.missed_heartbeats >= 1,
            "health_interval_s": self.health_interval_s > 0,
            "health_timeout_s": self.health_timeout_s > 0,
            "drain_timeout_s": self.drain_timeout_s >= 0,
            "rpc_timeout_s": 0 < self.rpc_timeout_s <= _MAX_TIMEOUT_S,
            "prefill_timeout_s": 0 < self.prefill_timeout_s <= _MAX_TIMEOUT_S,
        }
        checks["discovery"] = self.discovery in ("static", "kubernetes")
        checks["metrics_compat"] = self.metrics_compat in COMPAT_CHOICES
        checks["reasoning_parser"] = self.reasoning_parser in ("", *REASONING_PARSERS)
        checks.update({
            "max_stop_strings": self.max_stop_strings >= 0,
            "max_stop_chars": self.max_stop_chars >= 1,
            "max_stop_token_ids": self.max_stop_token_ids >= 0,
            "max_request_bytes": self.max_request_bytes >= 1024,
            "tokenizer_threads": self.tokenizer_threads >= 1,
            "max_inflight_per_connection": self.max_inflight_per_connection >= 0,
            "max_inflight_per_key": self.max_inflight_per_key >= -1,
            "http_read_timeout_s": self.http_read_timeout_s > 0,
        })
        checks.update({name: getattr(self, name) >= 1 for name in _GRAMMAR_FIELDS})
        checks.update({
            "max_inflight_tokens": self.max_inflight_tokens >= 0,
            "max_inflight_tokens_per_connection": self.max_inflight_tokens_per_connection >= 0,
            "max_inflight_tokens_per_key": self.max_inflight_tokens_per_key >= -1,
            "max_fanout": self.max_fanout >= 1,
            "max_messages": self.max_messages >= 1,
            "max_connections_per_address": self.max_connections_per_address >= 0,
            "http_parse_threads": self.http_parse_threads >= 1,
            "http_parse_queue": self.http_parse_queue >= 0,
        })
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid router config: {', '.join(bad)} out of range")
        for endpoint in (*self.prefill_endpoints, *self.decode_endpoints):
            host, _, port = endpoint.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"invalid worker endpoint {endpoint!r}: expected HOST:PORT")

    @property
    def grammar_limits(self) -> GrammarLimits:
        """The ``grammar_max_*`` fields as the validator takes them."""
        return GrammarLimits(**{name.removeprefix("grammar_"): getattr(self, name)
                                for name in _GRAMMAR_FIELDS})

    @property
    def admission_budget(self) -> Cost:
        """What the router runs at once (tandem/router/admission.py)."""
        return Cost(self.max_inflight, self._tokens(self.max_inflight_tokens))

    @property
    def connection_budget(self) -> Cost:
        """What one client connection may hold (tandem/router/client_limits.py)."""
        return Cost(self.max_inflight_per_connection,
                    self._tokens(self.max_inflight_tokens_per_connection))

    @property
    def key_budget(self) -> Cost:
        """What one API key may hold, where keys are configured (-1s resolved)."""
        sequences = self.max_inflight_per_key
        tokens = self.max_inflight_tokens_per_key
        return Cost(self.max_inflight if sequences < 0 else sequences,
                    self._tokens(self.max_inflight_tokens if tokens < 0 else tokens))

    @property
    def request_caps(self) -> RequestCaps:
        """Caps on a request's shape, checked before its plain types are built."""
        return RequestCaps(self.max_fanout, self.max_messages, self.max_model_len)

    def _tokens(self, bound: int) -> int:
        return max(bound, self.max_model_len) if bound else 0

    @property
    def expects_prefill(self) -> bool:
        """Whether the router is not ready until a prefill worker is routable (at the start)."""
        return self.expect_prefill or bool(self.prefill_endpoints)

    @property
    def http_enabled(self) -> bool:
        """Whether the router serves the OpenAI-compatible HTTP API."""
        return self.http_port >= 0


_GRAMMAR_FIELDS = tuple(f"grammar_{name}" for name in GrammarLimits.__slots__)
