"""A worker's TLS flags: complete sets load, incomplete or unreadable ones are refused, and
``--router-ca`` lets registration reach a TLS router."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import grpc
import pytest

from tandem.protos.v1 import worker_pb2_grpc
from tandem.worker.decode.cli import build_parser
from tandem.worker.registration import RegistrationConfig, RegistryClient
from tandem.worker.reports import WorkerStatus
from tandem.worker.tls import (
    TlsConfigError,
    kv_tls_from_args,
    router_credentials_from_args,
    server_tls_from_args,
)
from tests.integration.tls_certs import make_certs
from tests.unit.worker.harness import until
from tests.unit.worker.test_registration import FakeRouter, registration, worker_status


def _args(*flags: str):  # noqa: ANN202 - argparse.Namespace
    return build_parser().parse_args(["--port", "0", "--kv-port", "0", *flags])


def test_no_flags_is_plaintext() -> None:
    args = _args()
    assert server_tls_from_args(args) is None and router_credentials_from_args(args) is None


def test_complete_sets_load(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    tls = server_tls_from_args(_args("--tls-cert", str(certs.server_cert),
                                     "--tls-key", str(certs.server_key)))
    assert tls is not None and tls.client_ca is None
    assert isinstance(tls.credentials(), grpc.ServerCredentials)
    mtls = server_tls_from_args(_args("--tls-cert", str(certs.server_cert), "--tls-key",
                                      str(certs.server_key), "--tls-client-ca", str(certs.ca)))
    assert mtls is not None and mtls.client_ca == certs.ca.read_bytes()
    creds = router_credentials_from_args(_args("--router-ca", str(certs.ca)))
    assert isinstance(creds, grpc.ChannelCredentials)


def test_incomplete_or_unreadable_sets_are_refused(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    text = tmp_path / "plain.txt"
    text.write_text("not a certificate")
    cases = [
        (("--tls-cert", str(certs.server_cert)), "both required"),
        (("--tls-client-ca", str(certs.ca)), "both required"),
        (("--tls-cert", str(text), "--tls-key", str(certs.server_key)), "not a PEM"),
        (("--tls-cert", str(tmp_path / "missing"), "--tls-key", str(certs.server_key)),
         "cannot read"),
    ]
    for flags, message in cases:
        with pytest.raises(TlsConfigError, match=message):
            server_tls_from_args(_args(*flags))


def test_kv_tls_flags(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    assert kv_tls_from_args(_args(), "decode") is None
    served = kv_tls_from_args(_args("--kv-tls-cert", str(certs.server_cert), "--kv-tls-key",
                                    str(certs.server_key), "--kv-tls-ca", str(certs.ca)),
                              "decode")
    assert served is not None and served.cert_file == str(certs.server_cert)
    checked = kv_tls_from_args(_args("--kv-tls-ca", str(certs.ca)), "prefill")
    assert checked is not None and checked.ca_file == str(certs.ca) and checked.cert_file is None
    text = tmp_path / "notes.txt"
    text.write_text("not a certificate")
    for flags, role, message in (
        (("--kv-tls-ca", str(certs.ca)), "decode", "needs --kv-tls-cert"),
        (("--kv-tls-cert", str(certs.server_cert), "--kv-tls-key", str(certs.server_key)),
         "prefill", "needs --kv-tls-ca"),
        (("--kv-tls-cert", str(certs.server_cert)), "decode", "go together"),
        (("--kv-tls-ca", str(text)), "prefill", "not a PEM"),
    ):
        with pytest.raises(TlsConfigError, match=message):
            kv_tls_from_args(_args(*flags), role)


def test_registration_reaches_a_tls_router_only_with_its_ca(tmp_path: Path) -> None:
    """``--router-ca``: the worker's Register/Heartbeat channel speaks TLS to the router."""
    certs = make_certs(tmp_path)

    async def scenario() -> None:
        router = FakeRouter()
        server = grpc.aio.server()
        worker_pb2_grpc.add_RegistryServicer_to_server(router, server)
        creds = grpc.ssl_server_credentials(
            [(certs.server_key.read_bytes(), certs.server_cert.read_bytes())])
        port = server.add_secure_port("127.0.0.1:0", creds)
        await server.start()
        try:
            for credentials in (None, router_credentials_from_args(
                    _args("--router-ca", str(certs.ca)))):
                client = RegistryClient(
                    RegistrationConfig(f"127.0.0.1:{port}", min_backoff_s=0.01,
                                       max_backoff_s=0.05, credentials=credentials),
                    registration,
                    _stats,
                )
                task = asyncio.create_task(client.run())
                if credentials is None:  # plaintext to a TLS port: refused, retried
                    await until(_counter(client, "failures"), lambda n: n >= 2)
                    assert client.registrations == 0
                else:
                    await until(_counter(client, "heartbeats"), lambda n: n >= 1)
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert [r.worker_id for r in router.registered] == ["w1"]
        finally:
            await server.stop(0)

    asyncio.run(scenario())


async def _stats() -> WorkerStatus:
    return worker_status(free_blocks=8)


def _counter(client: RegistryClient, name: str):  # noqa: ANN202 - an async getter
    async def read() -> int:
        return int(getattr(client, name))

    return read
