"""The shared keepalive options: clients ping no faster than servers accept, both sides of
every internal channel use them, and the module stays import-free."""

from __future__ import annotations

import ast
import inspect

from tandem.common import grpc_keepalive as ka


def test_clients_ping_no_faster_than_servers_accept() -> None:
    client, server = dict(ka.CLIENT_OPTIONS), dict(ka.SERVER_OPTIONS)
    assert client["grpc.keepalive_time_ms"] == ka.KEEPALIVE_TIME_MS == 10_000
    assert client["grpc.keepalive_timeout_ms"] == ka.KEEPALIVE_TIMEOUT_MS == 5_000
    assert client["grpc.keepalive_permit_without_calls"] == 1
    assert client["grpc.http2.max_pings_without_data"] == 0
    # gRPC core waits for a keepalive ACK by the ping timeout (60 s unless set).
    assert client["grpc.http2.ping_timeout_ms"] == server["grpc.http2.ping_timeout_ms"] == 5_000
    accepted = server["grpc.http2.min_recv_ping_interval_without_data_ms"]
    assert accepted <= client["grpc.keepalive_time_ms"] // 2  # room for an early ping
    assert server["grpc.keepalive_permit_without_calls"] == 1
    assert server["grpc.keepalive_time_ms"] >= accepted
    assert ka.KEEPALIVE_BOUND_S == 15.0


def test_every_internal_channel_uses_them() -> None:
    from tandem.router.membership import worker_clients
    from tandem.worker import process, registration

    assert set(ka.CLIENT_OPTIONS) <= set(worker_clients._CHANNEL_OPTIONS)
    assert "CLIENT_OPTIONS" in inspect.getsource(registration)
    assert "SERVER_OPTIONS" in inspect.getsource(process)
    from tandem.router import server

    assert "SERVER_OPTIONS" in inspect.getsource(server)


def test_the_module_imports_nothing() -> None:
    tree = ast.parse(inspect.getsource(ka))
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [getattr(n, "module", None) for n in imports] == ["__future__"]
