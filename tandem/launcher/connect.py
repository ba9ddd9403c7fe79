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
"""

from __future__ import annotations

import os
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
