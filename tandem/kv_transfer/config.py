"""Frozen, validated configuration for the sender and the receiver.

Built by the workers from CLI flags or YAML (docs/design.md section 6) and passed down explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem.kv_transfer.errors import ConfigError

KIB = 1 << 10
MIB = 1 << 20


def _positive(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if value <= 0:
            raise ConfigError(f"{type(owner).__name__}.{name} must be > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Limits:
    """What a peer may send: bounds on frame sizes and on the msgpack decoder."""

    max_header_bytes: int = 64 * KIB
    max_payload_bytes: int = 64 * MIB
    max_array_len: int = 65_536
    max_map_len: int = 32
    max_str_len: int = 4_096
    max_bin_len: int = 1_024

    def __post_init__(self) -> None:
        _positive(self, "max_header_bytes", "max_payload_bytes", "max_array_len",
                  "max_map_len", "max_str_len", "max_bin_len")
        if self.max_header_bytes >= 1 << 31:
            raise ConfigError("Limits.max_header_bytes must be < 2**31")


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """PEM files for TLS on the TCP transport; with ``ca_file`` the peer's certificate is checked.

    ``server_name`` is the name the sender checks in the receiver's certificate (None: no
    hostname check, the CA still applies).
    """

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    server_name: str | None = None


def _check_codecs(owner: object, names: tuple[str, ...]) -> None:
    """Every name a codec whose package is installed (codecs.codec raises ConfigError)."""
    from tandem.kv_transfer.codecs import codec  # codecs imports this module's errors only

    if not isinstance(names, tuple):
        raise ConfigError(f"{type(owner).__name__}: codecs must be a tuple of names")
    for name in names:
        codec(name)


def _check_secret(owner: object, secret: bytes) -> None:
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise ConfigError(f"{type(owner).__name__}.secret must be at least 16 bytes")


@dataclass(frozen=True, slots=True)
class ReceiverConfig:
    """Decode-side settings: where to listen, what to accept, and how much."""

    secret: bytes
    host: str = "127.0.0.1"
    port: int = 0
    advertise_host: str | None = None
    enable_tcp: bool = True
    enable_shm: bool = True
    tls: TlsConfig | None = None
    socket_dir: str | None = None
    limits: Limits = field(default_factory=Limits)
    # Authenticated senders (member slots). Connections that have not proven themselves yet
    # wait in a separate pool of max_pending_handshakes, each for at most handshake_timeout_s;
    # when it is full the longest waiting one is closed for the newcomer, so strangers can
    # neither take member slots nor keep a member's handshake out.
    max_connections: int = 64
    max_pending_handshakes: int = 16
    max_active_transfers: int = 1_024
    handshake_timeout_s: float = 5.0
    idle_timeout_s: float = 300.0
    frame_timeout_s: float = 30.0
    # A bound transfer's lease is renewed by each BEGIN, KV and KEEPALIVE frame for this long
    # (senders are asked for a KEEPALIVE every quarter of it), never past its sender's
    # deadline, and never longer than max_transfer_s after its BEGIN.
    progress_timeout_s: float = 10.0
    max_transfer_s: float = 600.0
    socket_buffer_bytes: int = 4 * MIB
    # The shm segment each connection gets: slots of a sender's whole frame (frame_bytes), so a
    # bulk push moves in few frames (each costs a sealed header, a CREDIT and its bookkeeping).
    shm_slots: int = 4
    shm_slot_bytes: int = 8 * MIB
    # Hash each shm slot on both sides (xxh3, folded into the copies; transport/shm.py): it
    # catches a sender that reuses a slot before its CREDIT. Not authentication (the sealed
    # header is), so a deployment may trade it for throughput. Told to senders in the ACK.
    shm_checksum: bool = True
    # KV payload codecs (codecs.py) this receiver accepts on TCP besides raw: "zstd"
    # (lossless), "int8" (lossy). A sender asking for one not listed gets raw.
    codecs: tuple[str, ...] = ()
    # The most TCP connections one transfer may be striped over (its sender's
    # SenderConfig.stripes; 1: no striping). Told to senders in the handshake ACK.
    max_stripes: int = 4

    def __post_init__(self) -> None:
        _check_secret(self, self.secret)
        _check_codecs(self, self.codecs)
        _positive(self, "max_stripes")
        _positive(self, "max_connections", "max_pending_handshakes", "max_active_transfers",
                  "handshake_timeout_s",
                  "idle_timeout_s", "frame_timeout_s", "progress_timeout_s", "max_transfer_s",
                  "socket_buffer_bytes", "shm_slots", "shm_slot_bytes")
        if not 0 <= self.port < 65_536:
            raise ConfigError(f"ReceiverConfig.port out of range: {self.port}")

    @property
    def keepalive_s(self) -> float:
        """How often a sender must show progress on a quiet bound transfer (KEEPALIVE)."""
        return self.progress_timeout_s / 4


@dataclass(frozen=True, slots=True)
class SenderConfig:
    """Prefill-side settings: frame size, pooling, timeouts, transport preference."""

    secret: bytes
    frame_bytes: int = 8 * MIB
    max_connections_per_endpoint: int = 2
    connect_timeout_s: float = 5.0
    prefer_shm: bool = True
    tls: TlsConfig | None = None
    limits: Limits = field(default_factory=Limits)
    socket_buffer_bytes: int = 4 * MIB
    # The KV payload codec asked of each receiver over TCP (codecs.py: "raw", "zstd",
    # "int8"); a receiver that does not allow it answers raw.
    codec: str = "raw"
    # TCP connections each transfer is striped over (for links one connection cannot fill),
    # up to the receiver's max_stripes; shm and CUDA IPC transfers use one.
    stripes: int = 1

    def __post_init__(self) -> None:
        _check_secret(self, self.secret)
        _check_codecs(self, (self.codec,))
        _positive(self, "frame_bytes", "max_connections_per_endpoint", "connect_timeout_s",
                  "socket_buffer_bytes", "stripes")
