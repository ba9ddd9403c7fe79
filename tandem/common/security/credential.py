"""The cluster credential: the one secret every member of a Tandem cluster holds.

    secret file (0600, one line, >= 32 random bytes as hex) ──ClusterCredential.from_file──>
        grpc_token(method, audience, digest)  per call: "v2.<unix s>.<nonce>.<MAC>", the MAC
            (HMAC-SHA256 under k_grpc) over the method, the audience (the callee: the address
            the caller dials, or "router") and a digest of the request message
        verify(token, method, audiences, digest)  the callee: the MAC for one of the names it
            answers to, a bounded clock skew, no replay (a bounded nonce cache)
        member_proof(nonce, audience, role)  a worker's answer to the router's challenge
            (discovered pods prove they hold the secret before they get traffic)
        kv_secret  HMAC(secret, "tandem/kv/v1"): the KV handshake's key

Members are the router, the workers and the autoscaler (docs/design.md section 8); clients never
hold it. Each use gets its own derived key, so a key seen by one channel opens no other. The
secret itself never leaves the file it came from: it is never logged, and tokens carry a MAC,
not the secret. A token opens one call: the method, the callee and the request it was minted
for, once, within ``MAX_SKEW_S`` of its timestamp; a captured token replayed to another worker,
another method or with another request is refused, and so is the same token twice.

``ClusterCredential.insecure()`` is the explicit "no credential" of ``--insecure``: it
accepts every caller and its KV key is public. Nothing uses it unless told to, and every
process that runs with it says so at start.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import os
import re
import secrets
import stat
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

MIN_SECRET_BYTES = 32
TOKEN_VERSION = "v2"  # v2: the MAC covers the audience and the request digest too
MAX_SKEW_S = 120.0  # a token older or newer than this is refused (clocks of one cluster)
ROUTER_AUDIENCE = "router"  # the audience of calls to the router (its Registry)
STREAMED = "stream"  # the digest of a call whose request is a stream (bound at call start)
_NONCE_BYTES = 12
_REPLAY_CAPACITY = 200_000  # nonces remembered for 2 * MAX_SKEW_S (bounded memory)
# The only shape a token has; anything else (another version, a non-ASCII digit, a field
# too long or missing) is refused before any arithmetic on it.
_TOKEN = re.compile(rf"v2\.([0-9]{{1,12}})\.([0-9a-f]{{{2 * _NONCE_BYTES}}})\.([0-9a-f]{{64}})")
_INSECURE = b"tandem-insecure-cluster-credential: anyone can act with this"


class CredentialError(ValueError):
    """The credential file is missing, unreadable, too short or readable by others."""


def _derive(secret: bytes, label: str) -> bytes:
    return hmac.new(secret, label.encode(), hashlib.sha256).digest()


class ClusterCredential:
    """Mints and checks the per-call tokens of internal gRPC, and keys the KV handshake."""

    def __init__(
        self, secret: bytes, *, insecure: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not insecure and len(secret) < MIN_SECRET_BYTES:
            raise CredentialError(f"the cluster secret must be at least {MIN_SECRET_BYTES} bytes")
        self.insecure = insecure
        self._grpc_key = _derive(secret, "tandem/grpc/v2")
        self._member_key = _derive(secret, "tandem/member/v1")
        self.kv_secret = _derive(secret, "tandem/kv/v1")
        self._clock = clock
        self._seen: OrderedDict[str, int] = OrderedDict()  # nonce -> its token's timestamp
        self._floor = -1  # tokens stamped at or before this are refused (the cache overflowed)

    def __repr__(self) -> str:  # never the key material
        return f"ClusterCredential(insecure={self.insecure})"

    @classmethod
    def insecure_default(cls) -> ClusterCredential:
        """The credential of ``--insecure``: every caller accepted, a public KV key."""
        return cls(_INSECURE, insecure=True)

    @classmethod
    def from_hex(cls, secret_hex: str) -> ClusterCredential:
        """The credential of a secret given as hex (a launcher hands it to its actors)."""
        try:
            secret = bytes.fromhex(secret_hex)
        except ValueError as exc:
            raise CredentialError(f"the cluster secret is not hex: {exc}") from exc
        return cls(secret)

    @classmethod
    def from_file(cls, path: str | Path) -> ClusterCredential:
        """Read a secret file; raises CredentialError (missing, unreadable, short, or readable
        by users other than its owner and group)."""
        p = Path(path)
        try:
            mode = p.stat().st_mode
            text = p.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CredentialError(f"cannot read the cluster secret file {str(p)!r}: {exc}") from exc
        if mode & (stat.S_IROTH | stat.S_IWOTH):
            raise CredentialError(f"the cluster secret file {str(p)!r} is readable or writable "
                                  "by other users: chmod 600 it")
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            raise CredentialError(f"the cluster secret in {str(p)!r} is not hex (make one "
                                  "with: python -c 'import secrets; print(secrets.token_hex(32))')"
                                  ) from None
        if len(secret) < MIN_SECRET_BYTES:
            raise CredentialError(f"the cluster secret in {str(p)!r} must be at least "
                                  f"{MIN_SECRET_BYTES} bytes ({2 * MIN_SECRET_BYTES} hex digits)")
        return cls(secret)

    # -- gRPC tokens -----------------------------------------------------------------------
    def grpc_token(self, method: str, audience: str, digest: str) -> str:
        """The token one call carries: of ``method`` (e.g. "/tandem.v1.DecodeService/Reserve")
        to ``audience`` (the address dialed, or ``ROUTER_AUDIENCE``) with a request whose
        ``request_digest`` is ``digest``."""
        ts = str(int(self._clock()))
        nonce = secrets.token_hex(_NONCE_BYTES)
        return f"{TOKEN_VERSION}.{ts}.{nonce}.{self._mac(ts, nonce, method, audience, digest)}"

    def verify(self, token: object, method: str, audiences: Iterable[str], digest: str) -> bool:
        """Whether ``token`` was minted by a holder of this credential for ``method``, one of
        ``audiences`` (the names the callee answers to) and a request of ``digest``, within
        the allowed skew, and not seen before. Never raises: whatever ``token`` is, a token
        that is not one is False."""
        if self.insecure:
            return True
        match = _TOKEN.fullmatch(token) if isinstance(token, str) else None
        if match is None:
            return False
        ts, nonce, mac = match.groups()
        now = self._clock()
        if abs(now - int(ts)) > MAX_SKEW_S:
            return False
        if not any(hmac.compare_digest(mac, self._mac(ts, nonce, method, name, digest))
                   for name in audiences):
            return False
        return self._first_use(nonce, int(ts), now)

    def _mac(self, ts: str, nonce: str, method: str, audience: str, digest: str) -> str:
        # Fields are joined with "\n", which none of them may hold (a method and an address
        # never do; digests are hex), so no two calls share a MAC input.
        msg = "\n".join((TOKEN_VERSION, ts, nonce, method, audience, digest)).encode()
        return hmac.new(self._grpc_key, msg, hashlib.sha256).hexdigest()

    def _first_use(self, nonce: str, ts: int, now: float) -> bool:
        """Remember ``nonce`` until its token can no longer pass the skew check. When the
        cache is full the oldest entry goes and every token stamped at or before it is
        refused from then on: a flood narrows the window, it never reopens a replay."""
        seen = self._seen
        if ts <= self._floor or nonce in seen:
            return False
        while seen and (next(iter(seen.values())) < now - MAX_SKEW_S
                        or len(seen) >= _REPLAY_CAPACITY):
            _, old_ts = seen.popitem(last=False)
            if old_ts >= now - MAX_SKEW_S:  # evicted while it could still be replayed
                self._floor = max(self._floor, old_ts)
        seen[nonce] = ts
        return True

    # -- membership proofs ------------------------------------------------------------------
    def member_proof(self, nonce: bytes, audience: str, role: str) -> bytes:
        """A worker's answer to the router's challenge ``nonce``, sent to it at ``audience``
        as a worker of ``role``: only a holder of the secret can make it, and it is good for
        that challenge, that address and that role only."""
        msg = b"\n".join((b"tandem-member/1", nonce, audience.encode(), role.encode()))
        return hmac.new(self._member_key, msg, hashlib.sha256).digest()

    def check_member_proof(self, proof: bytes, nonce: bytes, audience: str, role: str) -> bool:
        """Whether ``proof`` answers ``member_proof(nonce, audience, role)``."""
        if self.insecure:
            return True
        return hmac.compare_digest(proof, self.member_proof(nonce, audience, role))


def request_digest(message: bytes) -> str:
    """The digest a token binds: SHA-256 of the request's serialized bytes, as hex."""
    return hashlib.sha256(message).hexdigest()


def new_secret() -> str:
    """A fresh random cluster secret, as hex."""
    return secrets.token_hex(MIN_SECRET_BYTES)


def generate_secret_file(path: str | Path, secret_hex: str | None = None) -> Path:
    """Write ``secret_hex`` (default: a new random secret) to ``path``, created 0600 and never
    overwriting a file that exists; returns the path."""
    p = Path(path)
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write((secret_hex or new_secret()) + "\n")
    return p


def private_secret_file(secret_hex: str) -> Path:
    """``secret_hex`` in a new file only this user can read (a fresh 0700 temporary folder):
    how a launcher hands a process the credential without putting it on a command line."""
    import tempfile

    return generate_secret_file(Path(tempfile.mkdtemp(prefix="tandem-credential-")) / "secret",
                                secret_hex)


def add_credential_args(p: argparse.ArgumentParser, guards: str) -> None:
    """``--cluster-secret-file`` / ``--insecure``: how a member gets the credential."""
    p.add_argument("--cluster-secret-file", default=None,
                   help=f"the cluster credential (a 0600 file, >= 32 random bytes as hex); it "
                   f"guards {guards}")
    p.add_argument("--insecure", action="store_true",
                   help="run without a cluster credential: anyone who reaches the internal "
                   "ports can act on the cluster (warned about at every start)")


def credential_from_flags(secret_file: str | None, insecure: bool, who: str) -> ClusterCredential:
    """The credential those flags name. Raises CredentialError when there is none: no
    built-in secret exists, and running without one must be asked for (``--insecure``)."""
    if secret_file and insecure:
        raise CredentialError("--cluster-secret-file and --insecure exclude each other")
    if secret_file:
        return ClusterCredential.from_file(secret_file)
    if insecure:
        log.warning("--insecure: this %s runs without a cluster credential; anyone who can "
                    "reach its internal ports can act on the cluster", who)
        return ClusterCredential.insecure_default()
    raise CredentialError("no cluster credential: pass --cluster-secret-file (tandem local and "
                          "tandem up make one per cluster) or, on a trusted machine, --insecure")
