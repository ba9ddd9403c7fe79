"""ClientConfig and TLSConfig validate at construction; channel options and metadata follow."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.sdk._channel import call_metadata, channel_credentials, channel_options
from tandem.sdk.client_config import (
    API_KEY_ENV,
    DEFAULT_TARGET,
    TARGET_ENV,
    ClientConfig,
    TLSConfig,
    call_timeout,
    resolve_config,
)
from tandem.sdk.retry import RetryPolicy


def test_defaults_are_valid_and_frozen() -> None:
    cfg = ClientConfig()
    assert cfg.target == "127.0.0.1:50051" and cfg.api_key is None
    with pytest.raises(AttributeError):
        cfg.target = "x:1"  # type: ignore[misc]


@pytest.mark.parametrize(
    "fields",
    [
        {"target": ""},
        {"target": "host :1"},
        {"api_key": ""},
        {"api_key": "has space"},
        {"api_key": "line\nbreak"},
        {"api_key": "ключ"},
        {"timeout_s": 0},
        {"timeout_s": -1.0},
        {"keepalive_s": 0},
        {"keepalive_s": float("inf")},
        {"keepalive_timeout_s": 0},
        {"max_message_bytes": 10},
        {"retry": "often"},
    ],
)
def test_bad_fields_are_refused(fields) -> None:
    with pytest.raises(ValueError):
        ClientConfig(**fields)


def test_tls_paths_must_exist_and_cert_key_go_together(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"CA")
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    cert.write_bytes(b"CERT")
    key.write_bytes(b"KEY")
    with pytest.raises(ValueError, match="ca_cert"):
        TLSConfig(ca_cert=str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match="together"):
        TLSConfig(client_cert=str(cert))
    with pytest.raises(ValueError, match="server_name"):
        TLSConfig(server_name="")
    tls = TLSConfig(ca_cert=str(ca), client_cert=str(cert), client_key=str(key),
                    server_name="router.local")
    assert tls.read() == (b"CA", b"KEY", b"CERT")
    cfg = ClientConfig(tls=tls)
    assert channel_credentials(cfg) is not None
    assert ("grpc.ssl_target_name_override", "router.local") in channel_options(cfg)


def test_plaintext_has_no_credentials() -> None:
    assert channel_credentials(ClientConfig()) is None


def test_api_key_travels_as_a_bearer_token() -> None:
    assert call_metadata(ClientConfig()) == ()
    assert call_metadata(ClientConfig(api_key="sk-123")) == (("authorization", "Bearer sk-123"),)


def test_keepalive_options() -> None:
    opts = dict(channel_options(ClientConfig(keepalive_s=5, keepalive_timeout_s=2)))
    assert opts["grpc.keepalive_time_ms"] == 5000 and opts["grpc.keepalive_timeout_ms"] == 2000
    assert "grpc.keepalive_time_ms" not in dict(channel_options(ClientConfig(keepalive_s=None)))


def test_resolve_config_applies_target_and_overrides() -> None:
    base = ClientConfig(api_key="a", retry=RetryPolicy(max_attempts=2))
    cfg = resolve_config("h:1", base, {"timeout_s": 3.0})
    assert (cfg.target, cfg.api_key, cfg.timeout_s, cfg.retry.max_attempts) == ("h:1", "a", 3.0, 2)
    assert resolve_config(None, base, {}) is base
    with pytest.raises(TypeError, match="apikey"):
        resolve_config(None, None, {"apikey": "x"})
    with pytest.raises(ValueError):
        resolve_config(None, None, {"timeout_s": -1})


def test_call_timeout() -> None:
    cfg = ClientConfig(timeout_s=30.0)
    assert call_timeout(cfg, None) == 30.0
    assert call_timeout(cfg, 2.5) == 2.5
    assert call_timeout(cfg, float("inf")) is None
    assert call_timeout(ClientConfig(timeout_s=None), None) is None
    with pytest.raises(ValueError):
        call_timeout(cfg, 0)


@pytest.fixture()
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No TANDEM_* variable from the developer's shell leaks into a test."""
    monkeypatch.delenv(TARGET_ENV, raising=False)
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    return monkeypatch


def test_environment_fills_target_and_key_when_not_given(env: pytest.MonkeyPatch) -> None:
    assert resolve_config(None, None, {}) == ClientConfig()
    env.setenv(TARGET_ENV, "router.example:6000")
    env.setenv(API_KEY_ENV, " sk-env \n")  # surrounding whitespace is not part of a key
    cfg = resolve_config(None, None, {})
    assert (cfg.target, cfg.api_key) == ("router.example:6000", "sk-env")
    assert call_metadata(cfg) == (("authorization", "Bearer sk-env"),)
    env.setenv(TARGET_ENV, "")  # empty: unset
    assert resolve_config(None, None, {}).target == DEFAULT_TARGET


def test_explicit_arguments_win_over_the_environment(env: pytest.MonkeyPatch) -> None:
    env.setenv(TARGET_ENV, "from-env:1")
    env.setenv(API_KEY_ENV, "sk-env")
    cfg = resolve_config("given:2", None, {"api_key": "sk-given"})
    assert (cfg.target, cfg.api_key) == ("given:2", "sk-given")
    # An explicit None sends no key, whatever the environment says.
    assert resolve_config(None, None, {"api_key": None}).api_key is None
    # A config passed in is used as built: its defaults are constants, not the environment.
    assert resolve_config(None, ClientConfig(), {}) == ClientConfig()
    assert ClientConfig.from_env(timeout_s=5.0).api_key == "sk-env"
    # A bad variable that an explicit field replaces is not even read.
    env.setenv(TARGET_ENV, "bad target")
    assert resolve_config("ok:1", None, {}).target == "ok:1"


def test_bad_environment_values_name_the_variable_not_the_key(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv(TARGET_ENV, "two words:1")
    with pytest.raises(ValueError, match=TARGET_ENV):
        resolve_config(None, None, {})
    env.delenv(TARGET_ENV)
    env.setenv(API_KEY_ENV, "sk-sécret")
    with pytest.raises(ValueError, match=API_KEY_ENV) as info:
        resolve_config(None, None, {})
    assert "sécret" not in str(info.value)


def test_the_key_is_never_in_a_repr(env: pytest.MonkeyPatch) -> None:
    env.setenv(API_KEY_ENV, "sk-very-secret")
    assert "sk-very-secret" not in repr(resolve_config(None, None, {}))
    assert "sk-abc" not in repr(ClientConfig(api_key="sk-abc"))
