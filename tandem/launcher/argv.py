"""The standalone commands' flags for the router and worker actors.

The actors parse these with ``tandem.router.cli`` / ``tandem.worker.prefill.cli`` / ``tandem.worker.decode.cli``
parsers, so ``tandem up`` serves exactly what those commands would with the same flags.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator

from tandem.common.model_spec import served_name as default_served_name
from tandem.launcher.spec import LaunchSpec


def router_argv(spec: LaunchSpec, model: str) -> list[str]:
    """Flags of ``tandem router`` (workers are not listed: they register themselves; API keys
    travel apart, ``RouterActor`` writes them to a file): the model as the workers get it (the
    router reads its tokenizer), the served id when given (else the router's default: the
    alias or the checkpoint's name), and ``--expect-prefill`` when prefill workers start
    (its /health waits for one of them too: tandem/router/readiness.py)."""
    from tandem.router.cli import build_parser

    argv = ["--host", spec.host, "--port", str(spec.port), "--model", model]
    if spec.model_name:
        argv += ["--model-name", spec.model_name]
    known = build_parser()._option_string_actions  # the flags this router version has
    if spec.http_port is not None and "--http-port" in known:
        argv += ["--http-port", str(spec.http_port)]
    if spec.prefill > 0 and "--expect-prefill" in known:
        argv.append("--expect-prefill")
    return argv + list(spec.router_args)


def served_name(spec: LaunchSpec) -> str:
    """The model id the router serves (``--model-name``, else the alias or the checkpoint's
    name: tandem.common.model_spec's rule), which the workers' metrics carry as ``model_name`` too."""
    return spec.model_name or default_served_name(spec.model)


@contextlib.contextmanager
def credential_argv(cluster_secret: str) -> Iterator[list[str]]:
    """The credential flags for a command run in an actor, for as long as the ``with`` block
    parses them: the secret in a private file on this node (never on a command line),
    removed with its folder when the block ends (the router's and workers' configs read the
    credential as they are built); ``--insecure`` when the cluster has none."""
    if not cluster_secret:
        yield ["--insecure"]
        return
    from tandem.common.security.credential import private_secret_file

    path = private_secret_file(cluster_secret)
    try:
        yield ["--cluster-secret-file", str(path)]
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)


def worker_argv(spec: LaunchSpec, role: str, model: str, served: str = "") -> list[str]:
    """Engine flags of ``tandem prefill|decode`` (the actor adds host, ports, router, id),
    the served model id (``served``, when given: the workers' metrics carry it as
    ``model_name``) and the metrics port; ``spec.worker_args`` (the engine flags ``tandem up``
    was given, then its ``--worker-arg``s) come after the implied ones, so a ``--device``
    given wins over the one a GPU request implies, and the role's own (``--prefill-arg`` /
    ``--decode-arg``) come last."""
    argv = ["--model", model]
    if spec.threads is not None:
        argv += ["--threads", str(spec.threads)]
    if spec.gpus(role) > 0:
        argv += ["--device", "cuda"]
    if served:
        argv += ["--served-model-name", served]
    argv += ["--metrics-port", str(spec.worker_metrics_port)]
    return argv + list(spec.worker_args) + list(spec.role_args(role))
