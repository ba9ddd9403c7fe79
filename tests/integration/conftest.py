"""One tiny-model prefill + decode pair (and one router over it) shared by the modules that
serve the same model with the same worker flags, so their processes start once per session.

A module that needs other router flags starts its own router on the shared workers
(``served_model.shared_router``) and stops it with its module. The shared processes are
stopped right after the last test that uses them (not at the end of the whole session), and
in any case by the session fixture's teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tandem.launcher.local_cluster import Cluster, Proc
from tests.integration.served_model import TinyWorkers, start_workers, tiny_served_model

_FIXTURE = "tiny_workers"

_RUNNING: list[TinyWorkers] = []


@pytest.fixture(scope="session")
def tiny_workers(request: pytest.FixtureRequest, tiny_dir: Callable[..., Path],
                 smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[TinyWorkers]:
    """A decode and a prefill worker on the tiny served model (``engine_flags``), tracing on:
    each writes its spans to its own file (``trace_files``, tests/integration/test_tracing.py)."""
    model = tiny_served_model(tiny_dir, smollm2_dir)
    users = [item.nodeid for item in request.session.items if _FIXTURE in item.fixturenames]
    traces = tmp_path_factory.mktemp("traces")
    trace_files = {role: traces / f"{role}.jsonl" for role in ("decode", "prefill")}
    c = Cluster()
    try:
        decode, prefill = start_workers(
            c, model, decode_extra=("--trace-file", str(trace_files["decode"])),
            prefill_extra=("--trace-file", str(trace_files["prefill"])))
        shared = TinyWorkers(c, model, decode, prefill, users[-1] if users else "",
                             trace_files)
        _RUNNING.append(shared)
        yield shared
    finally:
        c.stop()
        _RUNNING.clear()


@pytest.fixture(scope="session")
def tiny_router(tiny_workers: TinyWorkers) -> Proc:
    """A router over the shared pair: every prompt prefilled remotely (``--placement remote``)."""
    return tiny_workers.cluster.start(
        "tandem.router", *tiny_workers.router_flags("--prefill", tiny_workers.prefill.grpc,
                                             "--placement", "remote"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After the last test that needs the shared processes (and its module's fixtures) is torn
    down, stop them: the rest of the session runs without them."""
    try:
        return (yield)
    finally:
        for shared in _RUNNING:
            if item.nodeid == shared.last_user:
                shared.cluster.stop()
