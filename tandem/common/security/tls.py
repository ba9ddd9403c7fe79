"""Reading the PEM files that TLS flags name, with one error type for every process.

Files are read once at startup, so a missing or unreadable one is a clear start-up error
(exit 2) naming the flag, never a refused connection later.
"""

from __future__ import annotations

from pathlib import Path


class TlsConfigError(ValueError):
    """A TLS flag is incomplete or names a file that cannot be read."""


def read_pem(path: str, flag: str) -> bytes:
    """The bytes of the PEM file ``flag`` names; raises TlsConfigError."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise TlsConfigError(f"{flag}: cannot read {path!r}: {err}") from err
    if b"-----BEGIN" not in data:
        raise TlsConfigError(f"{flag}: {path!r} is not a PEM file")
    return data
