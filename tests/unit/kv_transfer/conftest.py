"""Fixtures for kv_transfer tests: a throwaway TLS certificate."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tandem.kv_transfer import TlsConfig


@pytest.fixture(scope="session")
def tls_config(tmp_path_factory: pytest.TempPathFactory) -> TlsConfig:
    """A self-signed EC certificate for 127.0.0.1, used as both sides' cert and CA (mutual TLS)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    d: Path = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30)
    return TlsConfig(cert_file=str(cert), key_file=str(key), ca_file=str(cert),
                     server_name="localhost")
