"""The cluster credential: file checks, per-call tokens bound to a method, skew and replay."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tandem.common.security.credential import (
    MAX_SKEW_S,
    ClusterCredential,
    CredentialError,
    generate_secret_file,
)

METHOD = "/tandem.v1.DecodeService/Reserve"


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_generated_file_is_private_and_loads(tmp_path: Path) -> None:
    path = generate_secret_file(tmp_path / "secret")
    assert os.stat(path).st_mode & 0o777 == 0o600
    cred = ClusterCredential.from_file(path)
    assert not cred.insecure and len(cred.kv_secret) == 32
    assert path.read_text().strip() not in repr(cred)
    with pytest.raises(FileExistsError):  # never overwritten
        generate_secret_file(path)


def test_bad_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(CredentialError, match="cannot read"):
        ClusterCredential.from_file(tmp_path / "missing")
    short = tmp_path / "short"
    short.write_text("abcd\n")
    short.chmod(0o600)
    with pytest.raises(CredentialError, match="at least 32 bytes"):
        ClusterCredential.from_file(short)
    shared = generate_secret_file(tmp_path / "shared")
    shared.chmod(0o644)
    with pytest.raises(CredentialError, match="other users"):
        ClusterCredential.from_file(shared)


def test_token_verifies_once_for_its_method_only() -> None:
    clock = Clock()
    a = ClusterCredential(b"s" * 32, clock=clock)
    same = ClusterCredential(b"s" * 32, clock=clock)
    other = ClusterCredential(b"t" * 32, clock=clock)
    token = a.grpc_token(METHOD)
    assert not other.verify(token, METHOD)  # another cluster's secret
    assert not same.verify(token, "/tandem.v1.DecodeService/Abort")  # another method
    assert same.verify(token, METHOD)
    assert not same.verify(token, METHOD)  # replayed
    for bad in (None, "", "v1", "v1.x.y.z", "v2" + token[2:], token[:-1] + "0"):
        assert not same.verify(bad, METHOD), bad


def test_skew_is_bounded() -> None:
    clock = Clock()
    cred = ClusterCredential(b"s" * 32, clock=clock)
    old = cred.grpc_token(METHOD)
    clock.now += MAX_SKEW_S + 1
    assert not cred.verify(old, METHOD)
    assert cred.verify(cred.grpc_token(METHOD), METHOD)


def test_insecure_accepts_anyone_and_says_so() -> None:
    cred = ClusterCredential.insecure_default()
    assert cred.insecure and cred.verify(None, METHOD)
    assert "insecure=True" in repr(cred)
