"""The router's edge flags: HTTP port defaults, key and TLS files checked before binding."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tandem.router.cli import build_parser, config_from_args, main
from tandem.router.security import RouterSecurity
from tests.unit.router.fakes import SECRET_FILE


@pytest.fixture(scope="module")
def tok_dir() -> str:
    from tandem.engine.loader import resolve_model

    return str(resolve_model("smollm2"))


@pytest.mark.parametrize(
    ("flags", "http_port"),
    [
        (["--port", "0"], 0),  # a free gRPC port: a free HTTP port too
        (["--port", "50051"], 8000),
        (["--port", "0", "--http-port", "9001"], 9001),
        (["--http-port", "-1"], -1),
    ],
)
def test_http_port_defaults(tok_dir: str, flags: list[str], http_port: int) -> None:
    config = config_from_args(build_parser().parse_args(["--tokenizer", tok_dir, *flags]))
    assert config.http_port == http_port
    assert config.http_enabled == (http_port >= 0)


def test_edge_files_are_checked_before_binding(
    tok_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    empty_keys = tmp_path / "keys"
    empty_keys.write_text("# none\n")
    cases = [
        (["--api-key-file", str(tmp_path / "missing")], "cannot read"),
        (["--api-key-file", str(empty_keys)], "holds no key"),
        (["--tls-cert", str(not_pem)], "go together"),
        (["--tls-cert", str(not_pem), "--tls-key", str(not_pem)], "not a PEM file"),
        (["--worker-cert", str(not_pem), "--worker-key", str(not_pem)], "--worker-ca"),
        (["--http-port", "70000"], "http_port"),
        (["--insecure"], "exclude each other"),
    ]
    member = ["--cluster-secret-file", str(SECRET_FILE)]
    for flags, message in cases:
        assert main(["--tokenizer", tok_dir, "--port", "0", *member, *flags]) == 2, flags
        assert message in capsys.readouterr().err, flags


def test_busy_http_port_exits_1(tok_dir: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert main(["--tokenizer", tok_dir, "--port", "0", "--http-port", str(port),
                     "--cluster-secret-file", str(SECRET_FILE)]) == 1
    assert "cannot bind HTTP" in capsys.readouterr().err


def test_a_public_bind_without_keys_must_be_allowed(tok_dir: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Loopback needs nothing; a non-loopback public API needs API keys or an explicit
    --allow-unauthenticated (checked before anything binds)."""
    member = ["--cluster-secret-file", str(SECRET_FILE)]
    assert main(["--tokenizer", tok_dir, "--host", "0.0.0.0", "--port", "0", *member]) == 2
    assert "without API keys" in capsys.readouterr().err
    assert main(["--tokenizer", tok_dir, "--port", "0", "--http-host", "0.0.0.0",
                 "--http-port", "0", *member]) == 2
    assert "'0.0.0.0' without API keys" in capsys.readouterr().err
    args = build_parser().parse_args(["--tokenizer", tok_dir, "--host", "0.0.0.0", *member,
                                      "--allow-unauthenticated"])
    assert RouterSecurity.from_config(config_from_args(args)).keys is None
    keys = tmp_path / "keys"
    keys.write_text("k1\n")
    args = build_parser().parse_args(["--tokenizer", tok_dir, "--host", "0.0.0.0", *member,
                                      "--api-key-file", str(keys)])
    assert RouterSecurity.from_config(config_from_args(args)).keys is not None
