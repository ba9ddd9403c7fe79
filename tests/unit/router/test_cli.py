"""The router's command line: bad flags, busy port, TANDEM_READY and a clean SIGTERM drain."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.common.wire import parse_ready_line
from tandem.router.cli import main
from tests.unit.router.fakes import SECRET_FILE


@pytest.fixture(scope="module")
def tok_dir() -> str:
    from tandem.engine.loader import resolve_model

    return str(resolve_model("smollm2"))


def test_bad_flag_value_exits_2(tok_dir: str) -> None:
    with pytest.raises(SystemExit) as err:
        main(["--tokenizer", tok_dir, "--port", "abc"])
    assert err.value.code == 2


def test_no_model_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "--model is required" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra",
    [["--decode", "nocolon"], ["--max-inflight", "0"], ["--port", "70000"]],
    ids=["endpoint", "max-inflight", "port"],
)
def test_bad_config_exits_2(
    tok_dir: str, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--tokenizer", tok_dir, *extra]) == 2
    assert "router: error:" in capsys.readouterr().err


def test_an_unwritable_placement_log_exits_2(tok_dir: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tokenizer", tok_dir, "--cluster-secret-file", str(SECRET_FILE),
                 "--placement-log", str(tmp_path / "no" / "such" / "dir.jsonl")]) == 2
    assert "cannot open --placement-log" in capsys.readouterr().err


def test_missing_tokenizer_dir_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tokenizer", str(tmp_path / "nope"), "--max-model-len", "64",
                 "--cluster-secret-file", str(SECRET_FILE)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_busy_port_exits_nonzero(tok_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert main(["--tokenizer", tok_dir, "--port", str(port),
                     "--cluster-secret-file", str(SECRET_FILE)]) == 1
    assert "cannot bind" in capsys.readouterr().err


def test_no_cluster_credential_exits_2(tok_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No built-in secret: a router without one (or an explicit --insecure) refuses to start."""
    assert main(["--tokenizer", tok_dir, "--port", "0"]) == 2
    assert "no cluster credential" in capsys.readouterr().err


def test_ready_line_and_sigterm_exit_0(tok_dir: str) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tandem.router",
            "--port",
            "0",
            "--tokenizer",
            tok_dir,
            "--decode",
            "127.0.0.1:1",
            "--log-level",
            "WARNING",
            "--cluster-secret-file",
            str(SECRET_FILE),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        ready = parse_ready_line(line)
        assert ready is not None, line + (proc.stderr.read() if proc.stderr else "")
        assert ready["role"] == "router" and ready["grpc"].startswith("127.0.0.1:")
        assert int(ready["grpc"].rsplit(":", 1)[1]) > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_an_otlp_endpoint_without_the_exporter_exits_2_saying_what_to_install(
        tok_dir: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The exporter's module blocked: this holds whether or not the otlp extra is installed
    # (and the failure comes before any tracer provider is installed in this process).
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
                        None)
    assert main(["--tokenizer", tok_dir, "--port", "0", "--cluster-secret-file",
                 str(SECRET_FILE), "--otlp-endpoint", "http://127.0.0.1:1"]) == 2
    assert "pip install opentelemetry-exporter-otlp-proto-grpc" in capsys.readouterr().err
