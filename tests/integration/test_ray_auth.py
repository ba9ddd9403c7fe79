"""``tandem up --address`` and Ray's token auth, against real Ray heads on loopback (``ray
start --head --block``: one with ``RAY_AUTH_MODE=token``, one without): the GCS probe tells
them apart, and ``tandem up`` refuses to join the one without a token unless told
``--insecure``. Each head is this module's own process (its own temp dir and HOME) and is
stopped, with every process it started, by the fixture that started it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tandem.launcher.connect import gcs_requires_token

pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "0123456789abcdef" * 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(home: Path, mode: str) -> dict[str, str]:
    """This environment without any Ray auth setting of its own, ``mode`` set, HOME private
    (no ~/.ray/auth_token found or written), Ray bound to loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(home), RAY_AUTH_MODE=mode, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               PYTHONUNBUFFERED="1")
    if mode == "token":
        env["RAY_AUTH_TOKEN"] = TOKEN
    return env


@contextlib.contextmanager
def _head(mode: str) -> Iterator[tuple[str, Path]]:
    """A Ray head (auth ``mode``) on a free loopback port: yields (GCS address, its HOME)."""
    base = Path(tempfile.mkdtemp(prefix="tra-"))  # short: Ray's socket paths live under it
    (base / "home").mkdir()
    port = _free_port()
    ray_bin = Path(sys.executable).with_name("ray")
    log = (base / "head.log").open("w")
    proc = subprocess.Popen(
        [str(ray_bin), "start", "--head", "--block", "--port", str(port),
         "--node-ip-address", "127.0.0.1", "--num-cpus", "0", "--include-dashboard=false",
         "--disable-usage-stats", "--temp-dir", str(base / "ray")],
        env=_env(base / "home", mode), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (base / "head.log").read_text()
            with contextlib.suppress(RuntimeError):  # not listening yet
                gcs_requires_token(address, timeout_s=2)
                break
            assert time.monotonic() < deadline, "the Ray head did not come up"
            time.sleep(0.5)
        yield address, base / "home"
    finally:
        children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None \
            else []
        proc.send_signal(signal.SIGTERM)  # ray start --block stops what it started
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        _, alive = psutil.wait_procs(children, timeout=30)
        for p in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        log.close()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def token_head() -> Iterator[tuple[str, Path]]:
    with _head("token") as head:
        yield head


@pytest.fixture(scope="module")
def open_head() -> Iterator[tuple[str, Path]]:
    with _head("disabled") as head:
        yield head


def test_the_gcs_probe_tells_a_token_cluster_from_an_open_one(
        token_head: tuple[str, Path], open_head: tuple[str, Path]) -> None:
    assert gcs_requires_token(token_head[0]) is True
    assert gcs_requires_token(open_head[0]) is False


def test_up_refuses_an_open_ray_cluster_before_starting_anything(
        open_head: tuple[str, Path], tmp_path: Path) -> None:
    address, home = open_head
    model = tmp_path / "model"  # a directory: tandem up checks nothing in it before Ray
    model.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "tandem.cli.main", "up", "--address", address, "--model",
         str(model), "--namespace", "tandem-auth-test", "--detach", "--host", "127.0.0.1"],
        cwd=ROOT, env=_env(home, "disabled"), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "does not require a token" in proc.stderr and "--insecure" in proc.stderr
    assert "starting router" not in proc.stderr  # refused before the pool was made
