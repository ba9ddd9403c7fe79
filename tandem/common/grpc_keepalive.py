"""HTTP/2 keepalive for every internal gRPC channel: what clients send, what servers accept.

    client (router -> worker, worker -> router's Registry)
      PING every KEEPALIVE_TIME_MS, even with no call open; no ACK in KEEPALIVE_TIMEOUT_MS:
      the transport is closed and every call on it fails UNAVAILABLE
    server (worker, router)
      accepts PINGs as often as every MIN_PING_INTERVAL_MS without data (gRPC's default is
      one per 5 minutes: faster pings earn a GOAWAY "too_many_pings"), and pings its own
      clients on the same schedule, so a stream to a peer that vanished without a FIN (a
      partition, a powered-off host) ends within time + timeout on both sides

Both ends import these lists, so the client's ping interval can never drift below what the
server permits. Plain tuples: this module imports nothing (not even grpc).
"""

from __future__ import annotations

KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
# Half the client's interval: pings a little early (timer jitter, a busy loop) are no strike.
MIN_PING_INTERVAL_MS = KEEPALIVE_TIME_MS // 2

ChannelOptions = tuple[tuple[str, int], ...]

CLIENT_OPTIONS: ChannelOptions = (
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    # gRPC core (1.85 measured) waits for a keepalive PING's ACK this long, not
    # keepalive_timeout_ms: left at its 60 s default, a partition is found after ~70 s.
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),  # no cap on pings between data frames
)

SERVER_OPTIONS: ChannelOptions = (
    # Accepting the clients' pings:
    ("grpc.http2.min_recv_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
    ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    # Pinging them, so the server side of a dead connection is found out too:
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.max_pings_without_data", 0),
)

# Seconds within which keepalive finds a silent peer: one interval plus the timeout.
KEEPALIVE_BOUND_S = (KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS) / 1000
