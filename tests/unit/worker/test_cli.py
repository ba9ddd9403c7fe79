"""Worker command lines and the process runtime's startup checks (no model is loaded)."""

from __future__ import annotations

import asyncio
import io
import json
import socket
from pathlib import Path

import pytest

from tandem.common.security.credential import ClusterCredential, generate_secret_file
from tandem.common.wire import READY_MARKER, parse_ready_line
from tandem.engine.cli_args import engine_config_from_args
from tandem.worker.cli import load_credential
from tandem.worker.config import ServeConfig, StartupError
from tandem.worker.decode import cli as decode_cli
from tandem.worker.prefill import cli as prefill_cli
from tandem.worker.process import announce, serve


@pytest.mark.parametrize("main,argv", [
    (decode_cli.main, ["--kv-port", "0"]),  # --port missing
    (decode_cli.main, ["--port", "70000", "--kv-port", "0"]),
    (decode_cli.main, ["--port", "0", "--kv-port", "0", "--dtype", "int4"]),
    (prefill_cli.main, ["--port", "-1"]),
    (prefill_cli.main, ["--port", "0", "--transfer-timeout-s", "0"]),
    *[(decode_cli.main, ["--port", "0", "--kv-port", "0", "--kv-advertise-host", host])
      for host in ("", "10.0.0.7:7100", "0.0.0.0", "::", "a,b", "h|x", "[::1]", "a b")],
])
def test_bad_flags_exit_2(main, argv, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_an_advertised_address_must_be_host_port(capsys) -> None:
    for bad in ("nohost", "host:", "host:70000", ":8000"):
        assert prefill_cli.main(["--port", "0", "--insecure", "--advertise-address", bad]) == 2
        assert "--advertise-address" in capsys.readouterr().err


def test_bad_engine_values_exit_2(capsys) -> None:
    assert prefill_cli.main(["--port", "0", "--insecure", "--block-size", "3"]) == 2
    assert "block_size must be a power of two" in capsys.readouterr().err
    assert prefill_cli.main(["--port", "0", "--insecure", "--stop-grace-s", "-1"]) == 2
    assert "--stop-grace-s must be >= 0" in capsys.readouterr().err


def test_no_credential_no_worker(tmp_path: Path, capsys) -> None:
    """There is no built-in secret: without a credential (or --insecure) a worker exits 2."""
    assert decode_cli.main(["--port", "0", "--kv-port", "0"]) == 2
    assert "no cluster credential" in capsys.readouterr().err
    secret = generate_secret_file(tmp_path / "secret")
    both = ["--port", "0", "--cluster-secret-file", str(secret), "--insecure"]
    assert prefill_cli.main(both) == 2
    assert "exclude each other" in capsys.readouterr().err
    shared = generate_secret_file(tmp_path / "shared")
    shared.chmod(0o644)
    assert prefill_cli.main(["--port", "0", "--cluster-secret-file", str(shared)]) == 2
    assert "other users" in capsys.readouterr().err


def test_credential_flags(tmp_path: Path) -> None:
    parser = prefill_cli.build_parser()
    insecure = load_credential(parser.parse_args(["--port", "0", "--insecure"]))
    assert insecure.insecure
    secret = generate_secret_file(tmp_path / "secret")
    cred = load_credential(parser.parse_args(["--port", "0", "--cluster-secret-file",
                                              str(secret)]))
    assert not cred.insecure
    assert cred.kv_secret == ClusterCredential.from_file(secret).kv_secret
    with pytest.raises(StartupError, match="cannot read"):
        load_credential(parser.parse_args(["--port", "0", "--cluster-secret-file",
                                           str(tmp_path / "missing")]))


def test_busy_port_fails_before_building() -> None:
    built = []

    async def build():
        built.append(True)
        raise AssertionError("must not be reached")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(StartupError, match="cannot listen"):
            asyncio.run(serve(ServeConfig(ClusterCredential.insecure_default(), port=port), build))
    assert not built


def test_ready_line() -> None:
    out = io.StringIO()
    announce("decode", "127.0.0.1:5", {"kv": "127.0.0.1:6"}, out)
    line = out.getvalue()
    assert line.startswith(READY_MARKER + " ") and line.endswith("\n")
    assert json.loads(line[len(READY_MARKER):]) == {
        "role": "decode", "grpc": "127.0.0.1:5", "kv": "127.0.0.1:6"}
    assert parse_ready_line(line) == {"role": "decode", "grpc": "127.0.0.1:5", "kv": "127.0.0.1:6"}


def test_flags_become_frozen_role_configs(tmp_path: Path) -> None:
    secret = generate_secret_file(tmp_path / "secret")
    decode = decode_cli.config_from_args(decode_cli.build_parser().parse_args([
        "--port", "7", "--kv-port", "8", "--kv-host", "127.0.0.2", "--default-lease-s", "5",
        "--cluster-secret-file", str(secret), "--no-kv-shm", "--worker-id", "d0",
        "--router", "r:1", "--kv-advertise-host", "kv.example"]))
    assert (decode.kv_port, decode.kv_host, decode.default_lease_s) == (8, "127.0.0.2", 5.0)
    assert decode.kv_advertise_host == "kv.example"
    wc = decode.worker
    assert (wc.serve.port, wc.serve.router, wc.worker_id, wc.kv_shm) == (7, "r:1", "d0", False)
    assert wc.kv_secret == ClusterCredential.from_file(secret).kv_secret
    assert secret.read_text().strip()[:16] not in repr(decode)
    with pytest.raises(AttributeError):
        decode.kv_port = 9  # type: ignore[misc]
    prefill = prefill_cli.config_from_args(prefill_cli.build_parser().parse_args(
        ["--port", "0", "--transfer-timeout-s", "2.5", "--insecure", "--drain-timeout-s",
         "0.5", "--stop-grace-s", "0.25", "--step-log", str(tmp_path / "steps.jsonl"),
         "--skip-warmup"]))
    assert prefill.transfer_timeout_s == 2.5
    assert (prefill.worker.step_log, wc.step_log) == (str(tmp_path / "steps.jsonl"), None)
    assert (prefill.worker.warmup, wc.warmup) == (False, True)
    assert (prefill.worker.serve.drain_timeout_s, prefill.worker.serve.stop_grace_s) == (
        0.5, 0.25)
    assert prefill.worker.kv_secret == ClusterCredential.insecure_default().kv_secret
    assert prefill.worker.kv_shm and prefill.worker.resolved_worker_id("prefill").startswith(
        "prefill-")


@pytest.mark.parametrize("host", ["kv.example", "10.0.0.7", "127.0.0.2", "fd00::7"])
def test_an_advertise_host_is_a_dialable_host(host: str) -> None:
    assert decode_cli.advertise_host_error(host) is None


@pytest.mark.parametrize("parser,argv", [
    (decode_cli.build_parser, ["--port", "0", "--kv-port", "0"]),
    (prefill_cli.build_parser, ["--port", "0"]),
])
def test_default_flags_make_a_valid_engine_config(parser, argv) -> None:
    config = engine_config_from_args(parser().parse_args(argv))
    assert config.cache.block_size == 16 and config.cache.kv_cache_memory_gb > 0


def test_an_otlp_endpoint_without_the_exporter_exits_2_before_the_model_loads(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The exporter's module blocked: this holds whether or not the otlp extra is installed
    # (and the failure comes before any tracer provider is installed in this process).
    import sys

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                        None)
    with pytest.raises(SystemExit) as exc:
        prefill_cli.main(["--port", "0", "--insecure", "--model", "/nonexistent",
                          "--otlp-endpoint", "http://127.0.0.1:1", "--otlp-protocol", "http"])
    assert exc.value.code == 2
    assert "opentelemetry-exporter-otlp-proto-http" in capsys.readouterr().err


def test_kv_codec_flag_reaches_both_roles(tmp_path: Path, monkeypatch) -> None:
    """--kv-codec: the same flag on both roles (prefill asks, decode accepts); one whose
    package is missing is refused at startup with what to install."""
    from tandem.kv_transfer import codecs

    decode = decode_cli.config_from_args(decode_cli.build_parser().parse_args(
        ["--port", "0", "--kv-port", "0", "--insecure", "--kv-codec", "int8"]))
    prefill = prefill_cli.config_from_args(prefill_cli.build_parser().parse_args(
        ["--port", "0", "--insecure", "--kv-codec", "int8"]))
    assert decode.worker.kv_codec == prefill.worker.kv_codec == "int8"
    striped = prefill_cli.config_from_args(prefill_cli.build_parser().parse_args(
        ["--port", "0", "--insecure", "--kv-stripes", "3"]))
    assert striped.worker.kv_stripes == 3 and decode.worker.kv_stripes is None
    with pytest.raises(ValueError, match="kv-stripes"):
        prefill_cli.config_from_args(prefill_cli.build_parser().parse_args(
            ["--port", "0", "--insecure", "--kv-stripes", "0"]))
    default = prefill_cli.config_from_args(prefill_cli.build_parser().parse_args(
        ["--port", "0", "--insecure"]))
    assert default.worker.kv_codec == "raw"
    monkeypatch.setattr(codecs, "available", lambda name: name != "zstd")
    with pytest.raises(ValueError, match="kv-compress"):
        prefill_cli.config_from_args(prefill_cli.build_parser().parse_args(
            ["--port", "0", "--insecure", "--kv-codec", "zstd"]))
