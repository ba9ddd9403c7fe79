"""API keys, TLS on the router's public ports and mTLS between router and workers, with real
processes: a router holding keys, a server certificate and a client certificate for the
workers, in front of a prefill and a decode worker that require client certificates.

    test CA ──> server cert (router :grpc/:http, both workers)
            └─> client cert (the router, to the workers)
"""

from __future__ import annotations

import asyncio
import atexit
import http.client
import json
import shutil
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.common.security.credential import ClusterCredential, new_secret, private_secret_file
from tandem.common.security.grpc_auth import sync_channel
from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc
from tests.integration.served_model import start_workers, tiny_served_model
from tests.integration.tls_certs import Certs, make_certs

KEY = "sk-tandem-test-key"
GOOD = (("authorization", f"Bearer {KEY}"),)
BAD = (("authorization", "Bearer sk-wrong"),)

# The module's cluster credential (the processes and the in-process router share it).
SECRET = private_secret_file(new_secret())
atexit.register(shutil.rmtree, SECRET.parent, True)  # its private folder goes with the run
CREDENTIAL = ClusterCredential.from_file(SECRET)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def model(tiny_dir: Callable[..., Path], smollm2_dir: Path) -> Path:
    return tiny_served_model(tiny_dir, smollm2_dir)


@pytest.fixture(scope="module")
def cluster(model: Path, certs: Certs, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[dict[str, Proc]]:
    keys = tmp_path_factory.mktemp("keys") / "api-keys"
    keys.write_text(f"# test keys\n{KEY}\n")
    c = Cluster(credential_flags=["--cluster-secret-file", str(SECRET)])
    try:
        decode, prefill = start_workers(
            c, model, "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
            "--tls-client-ca", str(certs.ca), "--no-kv-shm",  # KV over TCP, and TLS on it:
            decode_extra=["--kv-tls-cert", str(certs.server_cert),
                          "--kv-tls-key", str(certs.server_key)],
            prefill_extra=["--kv-tls-ca", str(certs.ca)])
        router = c.start(
            "tandem.router", "--port", "0", "--tokenizer", str(model), "--model-name", "tiny",
            "--prefill", prefill.grpc, "--decode", decode.grpc, "--api-key-file", str(keys),
            "--placement", "remote",  # the KV channel (TLS) carries every prompt
            "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
            "--worker-ca", str(certs.ca), "--worker-cert", str(certs.client_cert),
            "--worker-key", str(certs.client_key),
        )
        yield {"router": router, "prefill": prefill, "decode": decode}
    finally:
        c.stop()


def _tls_channel(address: str, certs: Certs, client_cert: bool = False) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(
        root_certificates=certs.ca.read_bytes(),
        private_key=certs.client_key.read_bytes() if client_cert else None,
        certificate_chain=certs.client_cert.read_bytes() if client_cert else None,
    )
    return grpc.secure_channel(address, creds)


def _https(url: str, certs: Certs, key: str | None, body: Any = None) -> tuple[int, Any]:
    """Status and decoded body of one HTTPS request (JSON when it is JSON)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers)
    context = ssl.create_default_context(cafile=str(certs.ca))
    try:
        with urllib.request.urlopen(request, context=context, timeout=60) as reply:
            status, raw = reply.status, reply.read()
    except urllib.error.HTTPError as err:
        status, raw = err.code, err.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def test_grpc_over_tls_needs_a_key_and_reaches_workers_over_mtls(cluster, certs) -> None:
    with _tls_channel(cluster["router"].grpc, certs) as channel:
        stub = tandem_pb2_grpc.TandemStub(channel)
        calls = {
            "Generate": lambda md: list(stub.Generate(tandem_pb2.GenerateRequest(
                text="Hello", sampling=tandem_pb2.SamplingParams(max_tokens=4, ignore_eos=True)),
                metadata=md, timeout=120)),
            "Tokenize": lambda md: stub.Tokenize(tandem_pb2.TokenizeRequest(text="Hello"),
                                                 metadata=md, timeout=30),
            "ListModels": lambda md: stub.ListModels(tandem_pb2.ListModelsRequest(),
                                                     metadata=md, timeout=30),
        }
        for name, call in calls.items():
            for metadata in ((), BAD):
                with pytest.raises(grpc.RpcError) as err:
                    call(metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
        messages = calls["Generate"](GOOD)  # router -> both workers over mTLS
        assert sum(len(m.token_ids) for m in messages) == 4 and messages[-1].finished
        assert calls["Tokenize"](GOOD).count > 0
        assert [m.id for m in calls["ListModels"](GOOD).models] == ["tiny"]
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_http_over_tls_needs_a_key(cluster, certs) -> None:
    base = f"https://{cluster['router'].info['http']}"
    routes = [
        ("/v1/completions", {"prompt": "Hello", "max_tokens": 3}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                  "max_tokens": 3}),
        ("/v1/models", None),
        ("/metrics", None),
    ]
    for path, body in routes:
        for key in (None, "sk-wrong"):
            status, reply = _https(base + path, certs, key, body)
            assert status == 401, path
            assert reply["error"]["type"] == "authentication_error"
        status, reply = _https(base + path, certs, KEY, body)
        assert status == 200, (path, reply)
    status, reply = _https(base + "/health", certs, None)
    assert (status, reply) == (200, {"status": "ok"})


def test_plaintext_is_refused_on_tls_ports(cluster) -> None:
    with grpc.insecure_channel(cluster["router"].grpc) as channel:
        with pytest.raises(grpc.RpcError) as err:
            tandem_pb2_grpc.TandemStub(channel).ListModels(
                tandem_pb2.ListModelsRequest(), metadata=GOOD, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    request = urllib.request.Request(f"http://{cluster['router'].info['http']}/health")
    with pytest.raises((urllib.error.URLError, http.client.HTTPException, ConnectionError)):
        urllib.request.urlopen(request, timeout=10).read()


def test_workers_require_the_routers_client_certificate(cluster, certs, model) -> None:
    for role, stub_type in (("prefill", worker_pb2_grpc.PrefillServiceStub),
                            ("decode", worker_pb2_grpc.DecodeServiceStub)):
        address = cluster[role].grpc
        with _tls_channel(address, certs) as channel:  # TLS but no client certificate
            with pytest.raises(grpc.RpcError) as err:
                stub_type(channel).Stats(worker_pb2.StatsRequest(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, role
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError):
                stub_type(channel).Stats(worker_pb2.StatsRequest(), timeout=10)
        with _tls_channel(address, certs, client_cert=True) as tls:  # mTLS, not a member
            with pytest.raises(grpc.RpcError) as err:
                stub_type(tls).Stats(worker_pb2.StatsRequest(), timeout=30)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, role
        with sync_channel(_tls_channel(address, certs, client_cert=True), CREDENTIAL,
                          address) as channel:
            stats = stub_type(channel).Stats(worker_pb2.StatsRequest(), timeout=30)
            assert stats.num_running == 0 and stats.num_free_blocks == stats.num_blocks, role
    asyncio.run(_router_without_client_cert_is_refused(cluster, certs, model))


async def _router_without_client_cert_is_refused(
    cluster: dict[str, Proc], certs: Certs, model: Path
) -> None:
    """A real router (in this process) that trusts the workers' CA but has no client cert."""
    from tandem.router.config import RouterConfig
    from tandem.router.server import RouterServer
    from tandem.router.tokenizer import RouterTokenizer

    config = RouterConfig(
        tokenizer_dir=str(model), model_name="tiny", max_model_len=1024, port=0,
        prefill_endpoints=(cluster["prefill"].grpc,), decode_endpoints=(cluster["decode"].grpc,),
        worker_ca=str(certs.ca), health_interval_s=3600.0, drain_timeout_s=1.0,
        cluster_secret_file=str(SECRET),  # a member in every way but the client certificate
    )
    router = RouterServer(config, RouterTokenizer(model))
    port = await router.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = tandem_pb2_grpc.TandemStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                async for _ in stub.Generate(
                    tandem_pb2.GenerateRequest(text="Hello"), timeout=60
                ):
                    pass
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await router.stop(grace_s=0)


def test_a_token_captured_for_one_worker_is_refused_by_another(cluster, certs) -> None:
    """A member's token for one call to worker A, as it crossed the wire (the same bytes the
    router's interceptor minted): worker B refuses it, A accepts it once, never twice, and
    not for another request. Both workers serve Membership/Prove, so the method is the same
    and only the audience differs."""
    from tandem.common.security.credential import request_digest

    method = "/tandem.v1.Membership/Prove"
    a, b = cluster["decode"].grpc, cluster["prefill"].grpc
    request = worker_pb2.ProveRequest(nonce=b"n" * 16, audience=a)
    captured = CREDENTIAL.grpc_token(method, a, request_digest(request.SerializeToString()))
    metadata = (("x-tandem-cluster", captured),)

    def prove(address: str, req: worker_pb2.ProveRequest) -> worker_pb2.ProveResponse:
        with _tls_channel(address, certs, client_cert=True) as channel:
            return worker_pb2_grpc.MembershipStub(channel).Prove(req, metadata=metadata,
                                                                 timeout=30)

    with pytest.raises(grpc.RpcError) as err:
        prove(b, request)  # replayed to another worker
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    other = worker_pb2.ProveRequest(nonce=b"m" * 16, audience=a)
    with pytest.raises(grpc.RpcError) as err:
        prove(a, other)  # the right worker, another request
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    reply = prove(a, request)  # where it was going: accepted, and the proof is A's
    assert CREDENTIAL.check_member_proof(reply.proof, request.nonce, a, "decode")
    assert reply.role == worker_pb2.ROLE_DECODE
    with pytest.raises(grpc.RpcError) as err:
        prove(a, request)  # replayed to the same worker
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # B still serves members (nothing above disturbed it)
    with sync_channel(_tls_channel(b, certs, client_cert=True), CREDENTIAL, b) as channel:
        assert worker_pb2_grpc.PrefillServiceStub(channel).Stats(
            worker_pb2.StatsRequest(), timeout=30).num_running == 0
