"""Connecting this process to Ray: a new local instance, or an existing cluster.

From a source checkout the repository root goes onto the workers' ``PYTHONPATH`` (the actors
import ``tandem``, ``router``, ``engine`` ... from it); an installed package needs nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


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
        kwargs.update(include_dashboard=False, num_cpus=num_cpus, num_gpus=num_gpus)
    else:
        kwargs["address"] = address
    return ray.init(**kwargs)


def find_pool(namespace: str) -> Any | None:
    """The pool actor of ``namespace``, or None when nothing runs there."""
    import ray

    from tandem.launcher.spec import REGISTRY

    try:
        return ray.get_actor(REGISTRY, namespace=namespace)
    except ValueError:
        return None
