"""Connecting this process to Ray: a new local instance, or an existing cluster.

From a source checkout the repository root goes onto the workers' ``PYTHONPATH`` (the actors
import ``tandem``, ``router``, ``engine`` ... from it); an installed package needs nothing.

A new local instance serves this machine only, so it listens on loopback only: Ray resolves
"127.0.0.1" given as the node address to the machine's routable address, and its gRPC
servers (GCS, raylet, every worker process) bind all interfaces unless the node address is a
loopback one. Ray's own switch for that, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` ("no
multi-node cluster: use loopback"), makes every port it opens (GCS, raylet, object manager,
workers, runtime-env agent, autoscaler metrics) bind 127.0.0.1 (docs/security.md, "Ray").
A driver that joins such an instance later (``tandem down``, ``tandem status``, dialling the
loopback address ``tandem up`` recorded: tandem/launcher/up_state.py) does the same.

An existing cluster (``--address``) is joined only when it enforces Ray's token auth
(``RAY_AUTH_MODE=token`` on every node): :func:`gcs_requires_token` sends the GCS one call
without a token and sees whether it is refused. A cluster without it runs whatever anyone who
reaches its GCS sends, so no credential of Tandem's is safe there: joining one needs
``--insecure`` (:func:`ray_auth_refusal`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
# Ray's "single-machine only" switch: read by every Ray process at import (ray_constants).
_SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def runtime_env() -> dict[str, Any]:
    """The job's runtime environment: the source tree on PYTHONPATH when running from one."""
    if not (ROOT / "pyproject.toml").is_file():
        return {}
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}}


def connect(address: str | None, namespace: str, num_cpus: int | None = None,
            num_gpus: int | None = None, quiet: bool = False) -> Any:
    """``ray.init`` into ``namespace``: start a local instance when ``address`` is None."""
    import ray

    kwargs: dict[str, Any] = {"namespace": namespace, "runtime_env": runtime_env(),
                              "log_to_driver": not quiet}
    if address is None:
        _loopback_only()
        kwargs.update(include_dashboard=False, dashboard_host=LOOPBACK,
                      _node_ip_address=LOOPBACK, num_cpus=num_cpus, num_gpus=num_gpus)
    else:
        kwargs["address"] = address
        if _on_loopback(address):  # a local instance: this driver joins its node by loopback
            _loopback_only()
            kwargs["_node_ip_address"] = LOOPBACK
    return ray.init(**kwargs)


def _on_loopback(address: str) -> bool:
    """Whether ``address`` (HOST:PORT) is a loopback GCS address: a local instance started
    loopback-only, whose node Ray would otherwise look for at the machine's routable
    address, where nothing listens (and retry for minutes)."""
    host = address.rpartition(":")[0].strip("[]")
    return host == "localhost" or host.startswith("127.") or host == "::1"


def _loopback_only() -> None:
    """Make the local instance about to start bind loopback only (see the module notes).

    The processes Ray starts inherit the variable; this one read it when it imported Ray,
    so its copy of the constant is set too (the only thing Ray reads it for is the choice
    between loopback and the routable address)."""
    os.environ[_SINGLE_NODE_ENV] = "0"
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def find_pool(namespace: str) -> Any | None:
    """The pool actor of ``namespace``, or None when nothing runs there."""
    import ray

    from tandem.launcher.spec import REGISTRY

    try:
        return ray.get_actor(REGISTRY, namespace=namespace)
    except ValueError:
        return None


def gcs_requires_token(gcs_address: str, timeout_s: float = 10.0) -> bool:
    """Whether the Ray cluster whose GCS listens at ``gcs_address`` enforces token auth: one
    ``NodeInfoGcsService.GetClusterId`` call sent without a token is refused (UNAUTHENTICATED)
    or answered. Speaks TLS when Ray's own TLS is on (``RAY_USE_TLS``). RuntimeError when the
    GCS gives neither answer (unreachable, another error)."""
    import grpc
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        from ray._common.tls_utils import load_certs_from_env

        cert, key, ca = load_certs_from_env()
        channel = grpc.secure_channel(gcs_address, grpc.ssl_channel_credentials(
            certificate_chain=cert, private_key=key, root_certificates=ca))
    else:
        channel = grpc.insecure_channel(gcs_address)
    with channel:  # no auth interceptor: the call carries no token
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                return True
            raise RuntimeError(f"cannot tell whether the Ray cluster at {gcs_address} "
                               f"requires a token: {exc.code().name} {exc.details()}") from None
    return False


def ray_auth_refusal(requires_token: bool, insecure: bool) -> str | None:
    """Why ``tandem up`` must not join a Ray cluster, or None when it may: one without token
    auth is joined only with ``--insecure`` (anyone who reaches its GCS runs code on every
    node, where the cluster credential would sit)."""
    if requires_token or insecure:
        return None
    return ("the Ray cluster does not require a token (Ray's token auth is off): anyone who "
            "reaches it can run code on its nodes and read the cluster credential. Start Ray "
            "with RAY_AUTH_MODE=token on every node (docs/security.md, \"Ray\"), or pass "
            "--insecure to run there without a credential")


def check_ray_auth(insecure: bool) -> None:
    """Refuse (ValueError) the Ray cluster this process joined unless it enforces token
    auth or ``insecure`` allows it; warn when ``insecure`` joins one without it."""
    import sys

    import ray

    requires = gcs_requires_token(ray.get_runtime_context().gcs_address)
    refusal = ray_auth_refusal(requires, insecure)
    if refusal is not None:
        raise ValueError(refusal)
    if not requires:
        print("[tandem] --insecure: the Ray cluster requires no token: anyone who reaches it "
              "can run code on its nodes", file=sys.stderr, flush=True)


def join_recorded(command: str, address: str | None, namespace: str,
                  ended_detail: Callable[[Any], str] = lambda _state: "") -> tuple[int, Any]:
    """Join the Ray cluster a ``tandem down``/``tandem status`` names (``--address``, else
    the one ``tandem up`` recorded: tandem/launcher/up_state.py) as ``command``: ``(0,
    state)`` once connected (``state``: the record read, or None), else ``(exit code, None)``
    after saying why (2: an unusable record; 1: nothing running there). ``ended_detail``
    adds to the message when the record names a ``tandem up`` that has ended."""
    from tandem.launcher import up_state

    try:
        target, state = up_state.dial_target(address, namespace)
    except up_state.UpStateError as exc:
        print(f"{command}: {exc}; pass --address", file=sys.stderr)
        return 2, None
    if target is None:
        print(f"{command}: nothing running in namespace {namespace!r}{ended_detail(state)}",
              file=sys.stderr)
        return 1, None
    if state is not None:
        state.dial_env()
    try:
        connect(target, namespace, quiet=True)
    except ConnectionError as exc:  # no Ray cluster where we looked
        print(f"{command}: nothing running in namespace {namespace!r} ({exc})", file=sys.stderr)
        return 1, None
    return 0, state
