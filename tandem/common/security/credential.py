"""The cluster credential: the one secret every member of a Tandem cluster holds.

    secret file (0600, one line, >= 32 random bytes as hex) ──ClusterCredential.from_file──>
        grpc_token(method)   per call: "v1.<unix s>.<nonce>.<HMAC(k_grpc, v1|s|nonce|method)>"
        verify(token, method) the receiving side: the MAC, a bounded clock skew, no replay
        kv_secret            HMAC(secret, "tandem/kv/v1"): the KV handshake's key

Members are the router, the workers and the autoscaler (docs/design.md section 8); clients never
hold it. Each use gets its own derived key, so a key seen by one channel opens no other. The
secret itself never leaves the file it came from: it is never logged, and the tokens carry a
MAC, not the secret, so a token captured on one method cannot call another.

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
import secrets
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

MIN_SECRET_BYTES = 32
TOKEN_VERSION = "v1"
MAX_SKEW_S = 120.0  # a token older or newer than this is refused (clocks of one cluster)
_NONCE_BYTES = 12
_REPLAY_CAPACITY = 200_000  # nonces remembered for MAX_SKEW_S (bounded memory)
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
        self._grpc_key = _derive(secret, "tandem/grpc/v1")
        self.kv_secret = _derive(secret, "tandem/kv/v1")
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> when it was accepted

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
    def grpc_token(self, method: str) -> str:
        """The token one call of ``method`` (e.g. "/tandem.v1.DecodeService/Reserve") carries."""
        ts = str(int(self._clock()))
        nonce = secrets.token_hex(_NONCE_BYTES)
        return f"{TOKEN_VERSION}.{ts}.{nonce}.{self._mac(ts, nonce, method)}"

    def verify(self, token: str | None, method: str) -> bool:
        """Whether ``token`` was minted for ``method`` by a holder of this credential, within
        the allowed skew, and not seen before (a captured token cannot be replayed)."""
        if self.insecure:
            return True
        if not token:
            return False
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != TOKEN_VERSION or not parts[1].isdigit():
            return False
        _, ts, nonce, mac = parts
        now = self._clock()
        if abs(now - int(ts)) > MAX_SKEW_S or len(nonce) != 2 * _NONCE_BYTES:
            return False
        if not hmac.compare_digest(mac, self._mac(ts, nonce, method)):
            return False
        return self._first_use(nonce, now)

    def _mac(self, ts: str, nonce: str, method: str) -> str:
        msg = f"{TOKEN_VERSION}|{ts}|{nonce}|{method}".encode()
        return hmac.new(self._grpc_key, msg, hashlib.sha256).hexdigest()

    def _first_use(self, nonce: str, now: float) -> bool:
        seen = self._seen
        while seen and (next(iter(seen.values())) < now - 2 * MAX_SKEW_S
                        or len(seen) >= _REPLAY_CAPACITY):
            seen.popitem(last=False)
        if nonce in seen:
            return False
        seen[nonce] = now
        return True


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
