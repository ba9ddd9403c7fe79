"""The client commands against a real local cluster (tiny model): ``tandem generate`` and
``tandem chat`` print exactly what the SDK's greedy generate returns, their structured-output,
tool, logit-bias and logprobs flags work end to end, ``tandem top --once`` shows every
worker's Stats, ``tandem bench`` runs a handful of requests end to end."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

import tandem
from tandem.cli import bench as bench_cmd
from tandem.cli import chat as chat_cmd
from tandem.cli import generate as generate_cmd
from tandem.cli import top as top_cmd
from tandem.launcher.local_cluster import ROOT
from tests.integration.sdk_cluster import LocalCluster, assert_idle, start_router_on
from tests.integration.served_model import TinyWorkers

GREEDY_FLAGS = ["--temperature", "0", "--ignore-eos", "--max-tokens", "12"]
GREEDY = {"temperature": 0.0, "ignore_eos": True, "max_tokens": 12}


@pytest.fixture(scope="module")
def local(tiny_workers: TinyWorkers) -> Iterator[LocalCluster]:
    """A router of this module's own on the shared tiny workers (stopped with the module)."""
    lc = start_router_on(tiny_workers)
    try:
        yield lc
    finally:
        lc.cluster.stop()


def _tandem(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """The installed entry point, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "tandem.cli.main", *args], input=stdin,
                          capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_generate_prints_the_sdks_greedy_text(local: LocalCluster) -> None:
    prompt = "The history of the city begins"
    with tandem.Client(local.target) as client:
        expected = client.generate(prompt, **GREEDY).text
        expected_chat = client.generate(
            messages=[{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": prompt}], **GREEDY).text
    assert expected and expected_chat != expected
    out = _tandem("generate", "--target", local.target, *GREEDY_FLAGS, "--stats", prompt)
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected + "\n"
    assert "[length; prompt" in out.stderr and "completion 12 tokens" in out.stderr
    chat = _tandem("generate", "--target", local.target, *GREEDY_FLAGS,
                   "--system", "Be brief.", prompt)
    assert chat.returncode == 0, chat.stderr
    assert chat.stdout == expected_chat + "\n"
    assert_idle(local)


def test_generate_reports_service_errors(local: LocalCluster, capsys) -> None:
    rc = generate_cmd.main(["--target", local.target, "--temperature", "-1", "hi"])
    assert rc == 1
    assert "INVALID_ARGUMENT" in capsys.readouterr().err


def test_chat_keeps_the_conversation(local: LocalCluster) -> None:
    turns = ["Hello! Who are you?", "Tell me more."]
    history: list[dict[str, str]] = []
    replies = []
    with tandem.Client(local.target) as client:
        for turn in turns:
            history.append({"role": "user", "content": turn})
            reply = client.generate(messages=history, **GREEDY).text
            history.append({"role": "assistant", "content": reply})
            replies.append(reply)
        alone = client.generate(messages=[{"role": "user", "content": turns[1]}], **GREEDY).text
    assert alone != replies[1]  # the second reply depends on the first turn
    out = _tandem("chat", "--target", local.target, *GREEDY_FLAGS,
                  stdin="\n".join(turns) + "\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "".join(r + "\n" for r in replies)
    # /reset forgets: the same second question alone gets the context-free reply.
    reset = _tandem("chat", "--target", local.target, *GREEDY_FLAGS,
                    stdin=f"{turns[0]}\n/reset\n{turns[1]}\n/exit\nnot sent\n")
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout == replies[0] + "\n" + alone + "\n"
    assert_idle(local)


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}},
    "required": ["city"], "additionalProperties": False}}}


def test_generation_flags_end_to_end(local: LocalCluster, tmp_path: Path, capsys,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """--json-schema FILE output validates; --tools + --tool-choice required prints a call
    whose arguments validate; --logit-bias steers greedy decoding and --logprobs reports each
    token; chat prints a turn's calls too."""
    schema_file, tools_file = tmp_path / "person.json", tmp_path / "tools.json"
    schema_file.write_text(json.dumps(SCHEMA))
    tools_file.write_text(json.dumps([WEATHER]))
    sampled = ["--target", local.target, "--temperature", "1", "--seed", "3",
               "--max-tokens", "150"]
    out = _tandem("generate", *sampled, "--json-schema", str(schema_file), "A person:")
    assert out.returncode == 0, out.stderr
    jsonschema.validate(json.loads(out.stdout), SCHEMA)
    assert generate_cmd.main([*sampled, "--tools", str(tools_file), "--tool-choice",
                              "required", "Weather in Paris?"]) == 0
    captured = capsys.readouterr()
    text, *call_lines = captured.out.splitlines()
    assert text == "" and call_lines and captured.err == "[tool_calls]\n"
    for line in call_lines:  # parallel calls allowed: one line each
        call = json.loads(line)
        assert call["type"] == "function" and call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]),
                            WEATHER["function"]["parameters"])
    token = 1000
    assert generate_cmd.main(["--target", local.target, *GREEDY_FLAGS[:3], "--max-tokens",
                              "4", "--logit-bias", f"{token}=100", "--logprobs",
                              "--top-logprobs", "2", "Hello"]) == 0
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines()[1:]]
    assert [lp["token_id"] for lp in lines] == [token] * 4
    assert all(len(lp["top_logprobs"]) == 2 for lp in lines)
    assert captured.err == "[length]\n"
    monkeypatch.setattr("sys.stdin", io.StringIO("Weather in Oslo?\n"))
    assert chat_cmd.main([*sampled, "--tools", json.dumps([WEATHER]),
                          "--tool-choice", "get_weather"]) == 0
    captured = capsys.readouterr()
    call = json.loads(captured.out.splitlines()[-1])
    assert call["function"]["name"] == "get_weather" and "[tool_calls]" in captured.err
    assert_idle(local)


def test_top_once_shows_every_worker(local: LocalCluster, capsys) -> None:
    with tandem.Client(local.target) as client:
        client.generate("warm up the latency windows", **GREEDY)
    workers = f"{local.prefill.grpc},{local.decode.grpc}"
    assert local.router is not None
    http = local.router.info["http"]
    assert top_cmd.main(["--workers", workers, "--once"]) == 1  # not a member: refused
    assert "UNAUTHENTICATED" in capsys.readouterr().out.upper()
    member = list(local.cluster.credential_flags or ())
    assert top_cmd.main(["--workers", workers, "--router-http", http, "--once", *member]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"router {http}: running 0, waiting 0; requests: ")
    assert " ok " in lines[0] and "TTFT p50/p90 -/-" not in lines[0]
    assert lines[1].split()[:3] == ["WORKER", "ROLE", "STATE"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows[local.prefill.grpc][1:3] == ["prefill", "ok"]
    assert rows[local.decode.grpc][1:3] == ["decode", "ok"]
    decode_row = lines[[ln.split()[0] for ln in lines].index(local.decode.grpc)]
    assert "ms" in decode_row  # ITL percentiles after the request above
    dead = "127.0.0.1:1"
    assert top_cmd.main(["--workers", f"{workers},{dead}", "--once", *member]) == 1
    out = capsys.readouterr().out
    assert any(line.split()[:3] == [dead, "?", "down"] for line in out.splitlines())


def test_bench_runs_a_few_requests(local: LocalCluster, tmp_path: Path, capsys) -> None:
    png, report = tmp_path / "latency.png", tmp_path / "run.json"
    rc = bench_cmd.main([
        "--target", local.target, "--mix", "chat", "--scale", "0.1", "--num-requests", "4",
        "--rate", "20", "--plot", str(png), "--json", str(report),
    ])
    captured = capsys.readouterr()
    assert rc == 0, captured
    assert "| TTFT p50 (ms) |" in captured.out and "| completed | 4 |" in captured.out
    assert "4/4" in captured.err  # the progress bar reached the end
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads(report.read_text())["summary"]
    assert summary["completed"] == 4 and summary["failed"] == 0
    assert_idle(local)
