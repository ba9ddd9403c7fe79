"""PEM files named by flags: read once, refused with the flag's name when unusable."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.common.security.tls import TlsConfigError, read_pem


def test_read_pem(tmp_path: Path) -> None:
    good = tmp_path / "cert.pem"
    good.write_bytes(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    assert read_pem(str(good), "--tls-cert") == good.read_bytes()
    text = tmp_path / "notes.txt"
    text.write_bytes(b"not a certificate")
    with pytest.raises(TlsConfigError, match="--tls-key: .* is not a PEM file"):
        read_pem(str(text), "--tls-key")
    with pytest.raises(TlsConfigError, match="--router-ca: cannot read"):
        read_pem(str(tmp_path / "missing.pem"), "--router-ca")
