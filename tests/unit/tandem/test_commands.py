"""The client commands' pure parts: flags -> ClientConfig and sampling options, the chat
conversation, and ``tandem top``'s frame."""

from __future__ import annotations

import argparse
import io
import math
from pathlib import Path

import pytest

from tandem.cli import top
from tandem.cli.chat import Conversation
from tandem.cli.common import (
    add_client_args,
    add_sampling_args,
    client_config_from_args,
    sampling_from_args,
)
from tandem.cli.generate import stats_line
from tandem.protos.v1 import worker_pb2
from tandem.sdk.results import StreamChunk, Timings, Usage


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_client_args(p)
    add_sampling_args(p)
    return p.parse_args(argv)


def test_flags_to_client_config(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("# mine\nsk-abc\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    cfg = client_config_from_args(_parse("--target", "h:1", "--api-key-file", str(key_file),
                                         "--tls-ca", str(ca), "--timeout", "5"))
    assert (cfg.target, cfg.api_key, cfg.timeout_s) == ("h:1", "sk-abc", 5.0)
    assert cfg.tls is not None and cfg.tls.ca_cert == str(ca)
    plain = client_config_from_args(_parse("--api-key", "k"))
    assert plain.tls is None and plain.api_key == "k"
    assert client_config_from_args(_parse("--tls")).tls is not None  # system roots
    with pytest.raises(ValueError):
        client_config_from_args(_parse("--tls-ca", str(tmp_path / "missing.pem")))
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError):
        client_config_from_args(_parse("--api-key-file", str(empty)))


def test_flags_to_sampling_options() -> None:
    assert sampling_from_args(_parse()) == {"max_tokens": 256}
    opts = sampling_from_args(_parse("--temperature", "0", "--stop", "a", "--stop", "b",
                                     "--ignore-eos", "--seed", "4", "--model", "m"))
    assert opts == {"max_tokens": 256, "temperature": 0.0, "stop": ["a", "b"],
                    "ignore_eos": True, "seed": 4, "model": "m"}


def test_structured_output_flags(tmp_path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}')
    assert sampling_from_args(_parse("--json-schema", f"@{schema}"))["structured"] == {
        "json_schema": '{"type": "object"}'}
    assert sampling_from_args(_parse("--choice", "yes", "--choice", "no"))["structured"] == {
        "choice": ["yes", "no"]}
    assert sampling_from_args(_parse("--json-object"))["structured"] == {"json_object": True}
    assert "structured" not in sampling_from_args(_parse())
    with pytest.raises(SystemExit):  # one structured output at a time
        _parse("--regex", "a+", "--grammar", "root ::= \"a\"")
    with pytest.raises(ValueError, match="--grammar: cannot read"):
        sampling_from_args(_parse("--grammar", f"@{tmp_path / 'missing.ebnf'}"))


def test_conversation_keeps_turns_and_resets() -> None:
    c = Conversation(system="be brief")
    assert c.ask("hi") == [{"role": "system", "content": "be brief"},
                           {"role": "user", "content": "hi"}]
    assert len(c.messages) == 1  # asking alone keeps nothing
    c.commit("hi", "hello")
    assert [m["role"] for m in c.ask("more")] == ["system", "user", "assistant", "user"]
    c.reset()
    assert c.messages == [{"role": "system", "content": "be brief"}]


def test_chat_loop_handles_commands_without_a_server() -> None:
    from tandem.cli.chat import run

    out = io.StringIO()
    # Only commands and blank lines: the loop never calls the client.
    rc = run(None, Conversation(), {}, io.StringIO("\n/reset\n/exit\nignored\n"), out,  # type: ignore[arg-type]
             interactive=True)
    assert rc == 0 and out.getvalue() == "> > > "


def test_stats_line() -> None:
    last = StreamChunk("r", (), "", finished=True, finish_reason="length",
                       usage=Usage(5, 3, 2), timings=Timings(first_token_s=0.012, total_s=0.5))
    assert stats_line(last) == ("[length; prompt 5 tokens (2 cached), completion 3 tokens; "
                                "TTFT 12 ms; total 0.50 s]")


def _stats(role: int, **kw: object) -> worker_pb2.WorkerStats:
    base = {"num_blocks": 100, "num_free_blocks": 75, "kv_cache_usage": 0.25}
    return worker_pb2.WorkerStats(role=role, **{**base, **kw})


def test_top_frame() -> None:
    rows = [
        top.WorkerRow("10.0.0.1:7001", _stats(
            worker_pb2.ROLE_PREFILL, num_running=2, num_waiting=3, prefix_cache_queries=10,
            prefix_cache_hits=4, ttft_p50_s=0.012, ttft_p90_s=0.05,
            kv_transfer_bytes_per_s=2.5e6)),
        top.WorkerRow("10.0.0.2:7002", _stats(
            worker_pb2.ROLE_DECODE, num_reserved=1, num_leased_blocks=8, itl_p50_s=0.02,
            itl_p90_s=0.031, draining=True, num_preemptions=7)),
        top.WorkerRow("10.0.0.3:7003", None, "UNAVAILABLE: connection refused"),
    ]
    frame = top.render(rows, title="tandem top")
    lines = frame.splitlines()
    assert lines[0] == "tandem top"
    assert lines[1].split()[:3] == ["WORKER", "ROLE", "STATE"]
    prefill, decode, down = (line.split() for line in lines[2:5])
    assert prefill[:6] == ["10.0.0.1:7001", "prefill", "ok", "2", "3", "0"]
    assert "25%" in prefill and "25/100" in prefill and "40%" in prefill
    assert "12/50" in prefill and "2.5" in prefill and "MB" in prefill
    assert decode[1:3] == ["decode", "draining"] and "20/31" in decode and decode[-1] == "7"
    assert down[:3] == ["10.0.0.3:7003", "?", "down"]
    assert lines[-1] == "10.0.0.3:7003: UNAVAILABLE: connection refused"
    assert top.render(rows, title="tandem top") == frame  # pure: same rows, same frame


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    from tandem.cli.router_view import histogram_quantile

    buckets = [(0.1, 2.0), (0.2, 6.0), (0.5, 10.0), (float("inf"), 10.0)]
    assert histogram_quantile(buckets, 0.5) == pytest.approx(0.175)  # rank 5 of (2, 6] in 0.1-0.2
    assert histogram_quantile(buckets, 0.1) == pytest.approx(0.05)  # rank 1 inside (0, 0.1]
    assert histogram_quantile(buckets, 1.0) == pytest.approx(0.5)
    assert histogram_quantile([(0.1, 0.0), (float("inf"), 4.0)], 0.5) == 0.1  # only +Inf
    assert math.isnan(histogram_quantile([(0.1, 0.0), (float("inf"), 0.0)], 0.5))
    assert math.isnan(histogram_quantile([], 0.5))


def test_router_line_from_prometheus_text() -> None:
    from tandem.cli.router_view import parse_router_metrics, render_router

    text = "\n".join([
        "# TYPE tandem_requests_total counter",
        'tandem_requests_total{role="router",outcome="ok"} 7',
        'tandem_requests_total{role="router",outcome="cancelled"} 1',
        'tandem_requests_total{role="router",outcome="error"} 0',
        "# TYPE tandem_num_requests_running gauge",
        'tandem_num_requests_running{role="router"} 3',
        "# TYPE tandem_time_to_first_token_seconds histogram",
        'tandem_time_to_first_token_seconds_bucket{role="router",le="0.01"} 0',
        'tandem_time_to_first_token_seconds_bucket{role="router",le="0.1"} 8',
        'tandem_time_to_first_token_seconds_bucket{role="router",le="+Inf"} 8',
        'tandem_time_to_first_token_seconds_count{role="router"} 8',
        'tandem_time_to_first_token_seconds_sum{role="router"} 0.4',
        "",
    ])
    f = parse_router_metrics(text)
    assert f.running == 3 and f.waiting == 0
    assert f.outcomes == {"ok": 7, "cancelled": 1, "error": 0}
    assert f.ttft_p50_s == pytest.approx(0.055) and math.isnan(f.itl_p50_s)
    line = render_router("h:8000", f)
    assert line == ("router h:8000: running 3, waiting 0; requests: cancelled 1, ok 7; "
                    "TTFT p50/p90 55/91 ms, ITL p50/p90 -/- ms (since start)")


def test_flags_fall_back_to_the_environment_and_win_over_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TANDEM_TARGET", "env-router:7")
    monkeypatch.setenv("TANDEM_API_KEY", "sk-env")
    cfg = client_config_from_args(_parse())
    assert (cfg.target, cfg.api_key) == ("env-router:7", "sk-env")
    key_file = tmp_path / "key"
    key_file.write_text("sk-file\n")
    for flags, expected in ((("--target", "flag:1", "--api-key", "sk-flag"), "sk-flag"),
                            (("--target", "flag:1", "--api-key-file", str(key_file)), "sk-file")):
        cfg = client_config_from_args(_parse(*flags))
        assert (cfg.target, cfg.api_key) == ("flag:1", expected)


def test_help_names_the_variables_never_their_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_API_KEY", "sk-do-not-print")
    p = argparse.ArgumentParser()
    add_client_args(p)
    text = p.format_help()
    assert "$TANDEM_TARGET" in text and "$TANDEM_API_KEY" in text
    assert "sk-do-not-print" not in text
