"""RouterConfig's client limits: their defaults, their flags, and out-of-range values refused."""

from __future__ import annotations

import pytest

from tandem.router.cli import build_parser, config_from_args
from tandem.router.config import RouterConfig

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
