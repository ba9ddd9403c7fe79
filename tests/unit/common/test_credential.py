"""The cluster credential: file checks, per-call tokens bound to a method, an audience and a
request, skew and replay (bounded), membership proofs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tandem.common.security import credential as credential_module
from tandem.common.security.credential import (
    MAX_SKEW_S,
    ClusterCredential,
    CredentialError,
    generate_secret_file,
    request_digest,
)

METHOD = "/tandem.v1.DecodeService/Reserve"
A, B = "10.0.0.1:5001", "10.0.0.2:5001"  # two workers' addresses
DIGEST = request_digest(b"\x08\x01")


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


def test_token_verifies_once_for_its_method_audience_and_request_only() -> None:
    clock = Clock()
    a = ClusterCredential(b"s" * 32, clock=clock)
    same = ClusterCredential(b"s" * 32, clock=clock)
    other = ClusterCredential(b"t" * 32, clock=clock)
    token = a.grpc_token(METHOD, A, DIGEST)
    assert not other.verify(token, METHOD, [A], DIGEST)  # another cluster's secret
    assert not same.verify(token, "/tandem.v1.DecodeService/Abort", [A], DIGEST)  # method
    assert not same.verify(token, METHOD, [B], DIGEST)  # another worker
    assert not same.verify(token, METHOD, [A], request_digest(b"\x08\x02"))  # request
    assert same.verify(token, METHOD, [B, A], DIGEST)  # A answers to several names
    assert not same.verify(token, METHOD, [A], DIGEST)  # replayed


def test_malformed_tokens_are_refused_never_raised() -> None:
    cred = ClusterCredential(b"s" * 32, clock=Clock())
    token = cred.grpc_token(METHOD, A, DIGEST)
    _, ts, nonce, mac = token.split(".")
    bad_tokens: list[object] = [
        None, "", 5, b"v2", ["v2"], "v1", "v2.x.y.z", "v1" + token[2:], token[:-1],
        token + "0", token.upper(), f"v2.\u00b2.{nonce}.{mac}",  # a digit int() refuses
        f"v2.{ts}.{nonce}.{mac}.extra", f"v2.{'9' * 40}.{nonce}.{mac}", f"v2.-{ts}.{nonce}.{mac}",
        f"v2.{ts}.{nonce[:-1]}.{mac}", f"v2.{ts}.{nonce}.{mac[:-2]}\u00e9", "\x00" * 200,
    ]
    for bad in bad_tokens:
        assert not cred.verify(bad, METHOD, [A], DIGEST), bad
    assert cred.verify(token, METHOD, [A], DIGEST)  # the good one still passes


def test_skew_is_bounded() -> None:
    clock = Clock()
    cred = ClusterCredential(b"s" * 32, clock=clock)
    old = cred.grpc_token(METHOD, A, DIGEST)
    clock.now += MAX_SKEW_S + 1
    assert not cred.verify(old, METHOD, [A], DIGEST)
    assert cred.verify(cred.grpc_token(METHOD, A, DIGEST), METHOD, [A], DIGEST)


def test_replay_cache_is_bounded_and_never_reopens_a_replay(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its capacity the cache forgets its oldest nonces; tokens as old as those are
    refused from then on, so none of the forgotten ones can be replayed."""
    monkeypatch.setattr(credential_module, "_REPLAY_CAPACITY", 4)
    clock = Clock()
    minter = ClusterCredential(b"s" * 32, clock=clock)
    cred = ClusterCredential(b"s" * 32, clock=clock)
    first = minter.grpc_token(METHOD, A, DIGEST)
    assert cred.verify(first, METHOD, [A], DIGEST)
    clock.now += 1
    later = [minter.grpc_token(METHOD, A, DIGEST) for _ in range(4)]
    assert all(cred.verify(t, METHOD, [A], DIGEST) for t in later)
    assert len(cred._seen) == 4  # bounded
    assert not cred.verify(first, METHOD, [A], DIGEST)  # forgotten, still refused
    clock.now += 1
    assert cred.verify(minter.grpc_token(METHOD, A, DIGEST), METHOD, [A], DIGEST)  # new ones pass
    clock.now += 3 * MAX_SKEW_S  # everything expired: the cache empties as it goes
    assert cred.verify(minter.grpc_token(METHOD, A, DIGEST), METHOD, [A], DIGEST)
    assert len(cred._seen) == 1


def test_member_proof_is_bound_to_challenge_address_and_role() -> None:
    cred = ClusterCredential(b"s" * 32)
    stranger = ClusterCredential(b"t" * 32)
    proof = cred.member_proof(b"n" * 16, A, "decode")
    assert cred.check_member_proof(proof, b"n" * 16, A, "decode")
    assert not cred.check_member_proof(stranger.member_proof(b"n" * 16, A, "decode"),
                                       b"n" * 16, A, "decode")
    for nonce, audience, role in ((b"m" * 16, A, "decode"), (b"n" * 16, B, "decode"),
                                  (b"n" * 16, A, "prefill")):
        assert not cred.check_member_proof(proof, nonce, audience, role)


def test_insecure_accepts_anyone_and_says_so() -> None:
    cred = ClusterCredential.insecure_default()
    assert cred.insecure and cred.verify(None, METHOD, [A], DIGEST)
    assert "insecure=True" in repr(cred)
