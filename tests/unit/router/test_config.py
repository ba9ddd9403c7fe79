"""RouterConfig's client limits and admission budgets: their defaults, their flags, how they
resolve, and out-of-range values refused."""

from __future__ import annotations

import pytest

from tandem.router.cli import build_parser, config_from_args
from tandem.router.config import RouterConfig
from tandem.router.cost import Cost
from tandem.router.request_caps import RequestCaps

BASE = {"tokenizer_dir": "x", "model_name": "m", "max_model_len": 64}


def test_limit_defaults_and_flags() -> None:
    config = RouterConfig(**BASE)
    assert (config.max_stop_strings, config.max_stop_chars, config.max_stop_token_ids) == (
        4, 256, 64)
    assert config.max_request_bytes == 4 * 1024 * 1024 and config.tokenizer_threads == 2
    assert (config.max_inflight_per_connection, config.max_inflight_per_key) == (128, -1)
    assert config.http_read_timeout_s == 75.0
    args = build_parser().parse_args([
        "--tokenizer", "x", "--max-model-len", "64", "--max-stop-strings", "8",
        "--max-stop-chars", "64", "--max-stop-token-ids", "4", "--max-request-bytes", "65536",
        "--tokenizer-threads", "3", "--max-inflight-per-connection", "0",
        "--max-inflight-per-key", "16", "--http-read-timeout", "5",
    ])
    flagged = config_from_args(args)
    assert (flagged.max_stop_strings, flagged.max_stop_chars, flagged.max_stop_token_ids) == (
        8, 64, 4)
    assert flagged.max_request_bytes == 65536 and flagged.tokenizer_threads == 3
    assert (flagged.max_inflight_per_connection, flagged.max_inflight_per_key) == (0, 16)
    assert flagged.http_read_timeout_s == 5.0


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_stop_strings", -1), ("max_stop_chars", 0), ("max_request_bytes", 10),
     ("tokenizer_threads", 0), ("max_inflight_per_connection", -1),
     ("max_inflight_per_key", -2), ("http_read_timeout_s", 0.0)],
)
def test_out_of_range_limits_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        RouterConfig(**BASE, **{field: value})


def test_worker_call_bounds_defaults_and_flags() -> None:
    config = RouterConfig(**BASE)
    assert (config.rpc_timeout_s, config.prefill_timeout_s) == (30.0, 600.0)
    args = build_parser().parse_args([
        "--tokenizer", "x", "--max-model-len", "64", "--rpc-timeout-s", "5",
        "--prefill-timeout-s", "120",
    ])
    flagged = config_from_args(args)
    assert (flagged.rpc_timeout_s, flagged.prefill_timeout_s) == (5.0, 120.0)


@pytest.mark.parametrize("field", ["rpc_timeout_s", "prefill_timeout_s"])
@pytest.mark.parametrize("value", [0.0, -1.0, float("inf"), float("nan"), 1e9])
def test_worker_call_bounds_out_of_range_are_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        RouterConfig(**BASE, **{field: value})


def test_metrics_flags() -> None:
    """vLLM's names are on by default; the scrape key's file is a path like the API keys'."""
    config = RouterConfig(**BASE)
    assert (config.metrics_compat, config.metrics_key_file) == ("vllm", "")
    args = build_parser().parse_args(["--tokenizer", "x", "--max-model-len", "64",
                                      "--metrics-compat", "none", "--metrics-key-file", "/k"])
    flagged = config_from_args(args)
    assert (flagged.metrics_compat, flagged.metrics_key_file) == ("none", "/k")
    with pytest.raises(ValueError, match="metrics_compat"):
        RouterConfig(**BASE, metrics_compat="sglang")


def test_admission_budgets_defaults_flags_and_resolution() -> None:
    config = RouterConfig(**BASE)
    assert config.admission_budget == Cost(256, 1 << 21)
    assert config.connection_budget == Cost(128, 1 << 20)
    assert config.key_budget == config.admission_budget  # -1: as the router's running budget
    assert config.request_caps == RequestCaps(128, 2048, 64)
    assert (config.max_connections_per_address, config.http_parse_threads,
            config.http_parse_queue) == (512, 2, 32)
    args = build_parser().parse_args([
        "--tokenizer", "x", "--max-model-len", "4096", "--max-inflight", "32",
        "--max-inflight-tokens", "100", "--max-inflight-tokens-per-connection", "0",
        "--max-inflight-per-key", "8", "--max-inflight-tokens-per-key", "9000",
        "--max-fanout", "16", "--max-messages", "50", "--max-connections-per-address", "0",
        "--http-parse-threads", "1", "--http-parse-queue", "0",
    ])
    flagged = config_from_args(args)
    assert flagged.admission_budget == Cost(32, 4096)  # raised to one full-length prompt
    assert flagged.connection_budget == Cost(128, 0)  # 0: tokens unbounded
    assert flagged.key_budget == Cost(8, 9000)
    assert flagged.request_caps == RequestCaps(16, 50, 4096)
    assert (flagged.max_connections_per_address, flagged.http_parse_threads,
            flagged.http_parse_queue) == (0, 1, 0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_inflight_tokens", -1), ("max_inflight_tokens_per_connection", -1),
     ("max_inflight_tokens_per_key", -2), ("max_fanout", 0), ("max_messages", 0),
     ("max_connections_per_address", -1), ("http_parse_threads", 0), ("http_parse_queue", -1)],
)
def test_out_of_range_admission_flags_are_refused(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        RouterConfig(**BASE, **{field: value})
