"""``tandem up`` of a tensor-parallel decode worker on a new local Ray instance (CPU, gloo).

    tandem up --prefill-arg=--tensor-parallel-size=1 --decode-arg=--tensor-parallel-size=2
        router ── prefill-0 (one rank) ──push, re-sharded──> decode-0: one actor, 2 ranks
                                                             (rank 0 in the actor, rank 1
                                                              its child process)

One test, as a user runs it (tests/integration/test_ray_up.py's harness): greedy replies
equal transformers' (what a one-rank worker serves: test_ray_up asserts it) for a prompt the
decode group prefills itself and one a prefill worker hands over; then rank 1 is killed
while a client streams: rank 0 ends (tandem/engine/parallel/group.py), Ray restarts the
actor and with it the whole group, which registers again and serves the same replies; no
request hangs (with no other decode worker to migrate to, those the group held and those
sent while it restarts fail UNAVAILABLE with the router's reason). ``tandem down``
then leaves no process of it, ranks included.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from tandem.protos.v1 import tandem_pb2_grpc
from tests.integration import health_poll
from tests.integration.served_model import tiny_served_model
from tests.integration.test_ray_up import (
    ROOT,
    Streamer,
    _alive,
    _free_port,
    _generate,
    _reap,
    _start_up,
    _tree,
    _wait,
)
from tests.unit.engine._reference import hf_greedy

pytest.importorskip("ray")

NAMESPACE = "tandem-tp"
FOLLOWER = "tandem.worker.tp_rank"
SHORT = [1, 504, 3458]  # under the threshold below: the decode group prefills it
LONG = [1, 504, 3458, 6354, 28, 1014, 3758, 253, 77, 4096]  # handed over by prefill-0


def _status(env: dict[str, str]) -> dict[str, Any]:
    """``tandem status --json`` as a user runs it (it finds the cluster by its state file)."""
    proc = subprocess.run([sys.executable, "-m", "tandem.cli.main", "status", "--namespace",
                           NAMESPACE, "--json"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return dict(json.loads(proc.stdout))


def _decode(env: dict[str, str]) -> dict[str, Any]:
    (worker,) = [w for w in _status(env)["workers"] if w["role"] == "decode"]
    return dict(worker)


def _followers(pid: int) -> list[psutil.Process]:
    """The rank processes worker actor ``pid`` started."""
    out = []
    for child in _tree(pid)[1:]:
        try:
            if FOLLOWER in " ".join(child.cmdline()):
                out.append(child)
        except psutil.Error:
            continue
    return out


def test_up_serves_a_tensor_parallel_group_and_restarts_it_whole(
        tiny_dir: Callable[..., Path], smollm2_dir: Path, tmp_path: Path) -> None:
    model_dir = tiny_served_model(tiny_dir, smollm2_dir)
    want = {tuple(p): hf_greedy(model_dir, p, 12) for p in (SHORT, LONG)}
    http = f"127.0.0.1:{_free_port()}"
    proc, state, env = _start_up(
        tmp_path, "--namespace", NAMESPACE, "--model", str(model_dir), "--model-name", "tiny",
        "--port", "0", "--http-port", http.rsplit(":", 1)[1], "--dtype", "float32",
        "--kv-cache-dtype", "float32", "--threads", "1", "--num-cpus", "6",
        "--worker-arg=--num-blocks=256", "--prefill-arg=--tensor-parallel-size=1",
        "--decode-arg=--tensor-parallel-size=2", "--router-arg=--local-prefill-threshold=6",
        "--router-arg=--heartbeat-interval=0.5", "--router-arg=--health-interval=0.5")
    pids: set[int] = set()
    try:
        health_poll.until(lambda: state()[0], 600, "the READY line",
                          alive=lambda: proc.poll() is None)
        target = state()[1]["grpc"]
        with grpc.insecure_channel(target) as channel:
            stub = tandem_pb2_grpc.TandemStub(channel)
            for prompt, tokens in want.items():
                assert _generate(stub, list(prompt), 12) == tokens, prompt

        before = _decode(env)
        (rank1,) = _followers(before["pid"])
        assert before["state"] == "serving" and before["restarts"] == 0
        assert before["pair"] == 0  # the node holds both workers: packed beside prefill-0
        with Streamer(target, SHORT) as streamer:
            _wait(lambda: streamer.done >= 1, 120, "the stream to start")
            rank1.send_signal(signal.SIGKILL)
            _wait(lambda: not _alive(before["pid"]), 120, "rank 0's actor to end with rank 1")

            def back() -> bool:
                w = _decode(env)
                return w["restarts"] == 1 and w["state"] == "serving" and bool(w["registered"])

            _wait(back, 600, "the decode group restarted whole and registered again")
            done = streamer.done
            _wait(lambda: streamer.done > done + 1, 240, "the stream to go on")
        # Nothing hung: with no other decode worker to migrate to, the request the dead group
        # held and those sent while it restarts fail at once, UNAVAILABLE with the router's
        # reason (a timeout would show DEADLINE_EXCEEDED); the rest were served whole.
        assert all("StatusCode.UNAVAILABLE" in f for f in streamer.failures), \
            streamer.failures
        after = _decode(env)
        assert after["pid"] != before["pid"]
        (new_rank1,) = _followers(after["pid"])
        assert new_rank1.pid != rank1.pid
        with grpc.insecure_channel(target) as channel:
            stub = tandem_pb2_grpc.TandemStub(channel)
            for prompt, tokens in want.items():
                assert _generate(stub, list(prompt), 12) == tokens, prompt

        pids = {p.pid for p in _tree(proc.pid)}
        assert new_rank1.pid in pids
        down = subprocess.run([sys.executable, "-m", "tandem.cli.main", "down", "--namespace",
                               NAMESPACE], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=300)
        assert down.returncode == 0, down.stdout + down.stderr
        assert proc.wait(timeout=180) == 0, "".join(state()[2][-40:])
        _wait(lambda: not any(_alive(p) for p in pids), 120, "no process of the cluster left")
    finally:
        _reap(proc, pids | {p.pid for p in _tree(proc.pid)})
