"""``tandem up`` on a local Ray instance with a tiny model: serving, autoscaling, restarts, down.

The first two tests run ``tandem up`` the way a user does (its own new local Ray instance, in
the foreground): polled until /health says 200, then a request, loopback only, stopped by
``tandem down`` with no arguments; and stopped by SIGTERM before it is ready. The rest share
one Ray instance, described next.

One Ray instance for the module (this process is its driver); ``tandem up --detach``,
``tandem status`` and ``tandem down`` run as real commands against it. The autoscaler runs the
``queue`` policy with aggressive test targets so a prompt-heavy burst grows the prefill pool
to 2 within seconds and idleness shrinks it back, while a client streams without pause.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest

from tandem.common.wire import parse_ready_line
from tandem.launcher.connect import runtime_env
from tandem.launcher.status import format_status
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc
from tests.integration import health_poll
from tests.integration.served_model import tiny_served_model
from tests.scrape import fetch, parse, value
from tests.unit.engine._reference import hf_greedy

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "tandem-test"
AUTOSCALE = """
policy: queue
interval_s: 0.5
window_s: 2
tolerance: 0.1
stabilization_s: 3
cooldown: {up_s: 1, down_s: 2}
max_step: {up: 1, down: 1}
prefill: {min: 1, max: 2}
decode: {min: 1, max: 1}
queue: {prefill_queue_depth: 1000, prefill_queue_tokens: 300, decode_queue_depth: 1000}
request_resources: true
"""


def _tandem(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "tandem.cli.main", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module", autouse=True)
def _private_runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The state files tandem up leaves (tandem/launcher/up_state.py) go to this module's
    own folder, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_RUNTIME_DIR", str(tmp_path_factory.mktemp("run")))
        yield


@dataclass
class Up:
    address: str
    grpc: str
    http: str
    model_dir: Path

    def pool(self) -> Any:
        return ray.get_actor("tandem-registry", namespace=NAMESPACE)

    def status(self) -> dict[str, Any]:
        return ray.get(self.pool().status.remote(), timeout=60)

    def workers(self, role: str) -> list[dict[str, Any]]:
        return [w for w in self.status()["workers"] if w["role"] == role]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Callable[..., Path],
       smollm2_dir: Path) -> Iterator[Up]:
    model_dir = tiny_served_model(tiny_dir, smollm2_dir)
    yaml = tmp_path_factory.mktemp("autoscale") / "test.yaml"
    yaml.write_text(AUTOSCALE)
    # Ray starts its workers at nice 15, where any other load on the machine (two busy loops
    # on two cores) leaves them a few percent of a CPU and `tandem up` crawls past every bound:
    # this instance runs them at normal priority, like the processes of the other tests.
    ctx = ray.init(num_cpus=8, include_dashboard=False, object_store_memory=80 * 1024 * 1024,
                   namespace="tandem-test-driver", runtime_env=runtime_env(),
                   log_to_driver=False, _system_config={"worker_niceness": 0})
    address = ctx.address_info["gcs_address"]
    try:
        proc = _tandem(
            "up", "--address", address, "--namespace", NAMESPACE, "--detach",
            "--model", str(model_dir), "--model-name", "tiny", "--port", "0",
            "--http-port", "0", "--dtype", "float32", "--threads", "1",
            "--worker-arg=--num-blocks=1024", "--router-arg=--heartbeat-interval=0.5",
            "--router-arg=--health-interval=0.5",
            # The burst test needs its 1000-token prompts on the prefill pool: adaptive
            # placement weighs the two workers' measured step costs, and when the decode
            # worker measures faster it prefills them itself, the prefill queue stays empty
            # and nothing scales. The fixed split sends them there; short prompts stay local.
            "--router-arg=--local-prefill-threshold=500", "--autoscale", str(yaml),
            "--signal-window", "2",
        )
        ready = [ln for ln in proc.stdout.splitlines() if ln.startswith("TANDEM_READY ")]
        assert proc.returncode == 0 and ready, proc.stdout + proc.stderr
        info = json.loads(ready[0].removeprefix("TANDEM_READY "))
        assert "Try it:" in proc.stdout
        yield Up(address, info["grpc"], info["http"], model_dir)
    finally:
        if any(a["namespace"] == NAMESPACE for a in ray.util.list_named_actors(True)):
            _tandem("down", "--address", address, "--namespace", NAMESPACE, timeout=120)
        ray.shutdown()


def _generate(stub: tandem_pb2_grpc.TandemStub, ids: list[int], n: int) -> list[int]:
    req = tandem_pb2.GenerateRequest(
        token_ids=tandem_pb2.TokenIds(ids=ids),
        sampling=tandem_pb2.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
    )
    tokens: list[int] = []
    last = None
    for msg in stub.Generate(req, timeout=120):
        tokens += list(msg.token_ids)
        last = msg
    assert last is not None and last.finished, "stream ended without a finished message"
    return tokens


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Poller:
    """A client polling the router's /health and /ready from a thread, as a load balancer or
    a readiness probe does while the cluster starts."""

    http: str
    interval_s: float = 0.2
    answers: list[tuple[str, int]] = field(default_factory=list)  # (path, status); 0: refused
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Poller:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        import urllib.error
        import urllib.request

        while not self._stop.wait(self.interval_s):
            for path in ("/health", "/ready"):
                try:
                    with urllib.request.urlopen(f"http://{self.http}{path}", timeout=2) as r:
                        self.answers.append((path, r.status))
                except urllib.error.HTTPError as exc:
                    self.answers.append((path, exc.code))
                except OSError:  # not listening yet
                    self.answers.append((path, 0))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=30)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _listening(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket those processes listen on."""
    return [(c.laddr.ip, c.laddr.port, c.pid) for c in psutil.net_connections("tcp")
            if c.status == psutil.CONN_LISTEN and c.pid in pids]


def _loopback(ip: str) -> bool:
    return ip in ("127.0.0.1", "::1") or ip.startswith(("127.", "::ffff:127."))


def _start_up(tmp_path: Path, *argv: str) -> tuple[subprocess.Popen[str], Callable[[], Any],
                                                  dict[str, str]]:
    """``tandem up *argv`` on a new local Ray instance, as a user starts it (its output read
    by a thread); returns the process, a function giving (READY seen, its info, the output
    lines), and the environment (its state file goes under ``tmp_path``: tandem down run
    with the same environment finds it)."""
    # Ray's workers at normal priority (see the module fixture); RayConfig reads RAY_<name>.
    env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_worker_niceness="0",
               XDG_RUNTIME_DIR=str(tmp_path))
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tandem.cli.main", "up", *argv],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()
    info: dict[str, Any] = {}

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            found = parse_ready_line(line)
            if found is not None and not ready.is_set():
                info.update(found)
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    return proc, lambda: (ready.is_set(), info, lines), env


def _reap(proc: subprocess.Popen[str], pids: set[int]) -> None:
    """A failed test's cleanup: nothing it started may outlive it."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=60)
    for p in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(p).kill()


def test_local_up_serves_once_healthy_and_down_stops_it_all(
        tiny_dir: Callable[..., Path], smollm2_dir: Path, tmp_path: Path) -> None:
    """``tandem up`` on a new local Ray instance as a user runs it: a script polls /health
    until 200 and sends a completion at once (served: no 503), while a prober polls /health
    and /ready every 0.2 s from the start. Every port the cluster opened (Ray's and
    Tandem's) is on loopback. Then ``tandem down`` with no arguments, from another process,
    finds it (the state file) and stops it in seconds: ``tandem up`` exits 0 and no process
    it started, Ray's included, is left. Without ``--threads``, as ``make serve`` runs it:
    its two workers share cores through a core-share file, removed at the stop."""
    model_dir = tiny_served_model(tiny_dir, smollm2_dir)
    shares_before = set(Path(tempfile.gettempdir()).glob("tandem-up-*"))
    http = f"127.0.0.1:{_free_port()}"
    proc, state, env = _start_up(
        tmp_path, "--namespace", "tandem-poll", "--model", str(model_dir), "--model-name",
        "tiny", "--port", "0", "--http-port", http.rsplit(":", 1)[1], "--dtype", "float32",
        "--num-cpus", "4", "--worker-arg=--num-blocks=256")
    pids: set[int] = set()
    try:
        with Poller(http) as poller:
            health_poll.until(lambda: health_poll.get(http, "/health")[0] == 200, 300,
                              "/health to answer 200", alive=lambda: proc.poll() is None)
            out = health_poll.complete(http, "tiny")  # at once: no 503
            assert out["usage"]["completion_tokens"] == 4
            health_poll.until(lambda: state()[0], 60, "the READY line")
        info, lines = state()[1], state()[2]
        assert ("/health", 503) in poller.answers, "the router never said 503 while starting"
        assert info["http"] == http
        with grpc.insecure_channel(info["grpc"]) as channel:
            assert len(_generate(tandem_pb2_grpc.TandemStub(channel), [1, 2, 3, 4], 6)) == 6
        pids = {p.pid for p in _tree(proc.pid)}
        sockets = _listening(pids)
        ports = {port for _, port, _ in sockets}
        assert int(http.rsplit(":", 1)[1]) in ports and int(info["grpc"].rsplit(":", 1)[1]) in ports
        public = [s for s in sockets if not _loopback(s[0])]
        assert public == [], f"listening beyond loopback: {public}"
        shares = set(Path(tempfile.gettempdir()).glob("tandem-up-*")) - shares_before
        assert len(shares) == 1 and (shares.pop() / "core-share").stat().st_mode & 0o777 == 0o600
        state_file = tmp_path / "tandem" / "up-tandem-poll.json"
        assert state_file.stat().st_mode & 0o777 == 0o600
        down = subprocess.run([sys.executable, "-m", "tandem.cli.main", "down", "--namespace",
                               "tandem-poll"], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=180)
        assert down.returncode == 0, down.stdout + down.stderr
        assert "tandem-router" in down.stdout and "tandem-decode-0" in down.stdout
        assert proc.wait(timeout=120) == 0, "".join(lines[-40:])
        _wait(lambda: not any(_alive(p) for p in pids), 120, "no process of the cluster left")
        assert not state_file.exists()
        assert set(Path(tempfile.gettempdir()).glob("tandem-up-*")) <= shares_before
    finally:
        _reap(proc, pids)


def test_sigterm_while_up_starts_stops_it_at_once(
        tiny_dir: Callable[..., Path], smollm2_dir: Path, tmp_path: Path) -> None:
    """SIGTERM (Ctrl-C's twin) to ``tandem up`` before its cluster is ready: one worker can
    never be placed (2 CPUs each, 3 in the instance, no pair group), so the start would go on
    until --ready-timeout (600 s); the signal stops it all within a generous bound instead,
    and leaves no process of it."""
    model_dir = tiny_served_model(tiny_dir, smollm2_dir)
    http = f"127.0.0.1:{_free_port()}"
    proc, state, _ = _start_up(
        tmp_path, "--namespace", "tandem-sigterm", "--model", str(model_dir), "--port", "0",
        "--http-port", http.rsplit(":", 1)[1], "--dtype", "float32", "--num-cpus", "3",
        "--cpus-per-worker", "2", "--no-pack", "--threads", "1")
    pids: set[int] = set()
    try:
        # The router serves (it starts first) and says why it cannot serve yet.
        health_poll.until(lambda: health_poll.get(http, "/livez")[0] == 200, 300,
                          "the router to answer /livez", alive=lambda: proc.poll() is None)
        status, body = health_poll.get(http, "/health")
        assert status == 503 and body["reason"], body
        assert not state()[0]
        pids = {p.pid for p in _tree(proc.pid)}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, "".join(state()[2][-40:])
        _wait(lambda: not any(_alive(p) for p in pids), 120, "no process of the cluster left")
        assert not (tmp_path / "tandem" / "up-tandem-sigterm.json").exists()
    finally:
        _reap(proc, pids)


@dataclass
class Streamer:
    """A client streaming one request after another; every reply must be complete.
    ``seed``: each request a new random prompt of ``prompt``'s length (no prefix affinity
    pins them to one decode worker)."""

    target: str
    prompt: list[int]
    n: int = 12
    seed: int | None = None
    done: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Streamer:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        rnd = random.Random(self.seed)
        with grpc.insecure_channel(self.target) as channel:
            stub = tandem_pb2_grpc.TandemStub(channel)
            while not self._stop.is_set():
                prompt = self.prompt if self.seed is None else [
                    rnd.randrange(100, 40000) for _ in self.prompt]
                try:
                    tokens = _generate(stub, prompt, self.n)
                    if len(tokens) != self.n:
                        self.failures.append(f"truncated: {len(tokens)} of {self.n} tokens")
                    self.done += 1
                except (grpc.RpcError, AssertionError) as exc:
                    self.failures.append(repr(exc)[:300])

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=120)


def test_up_serves_greedy_output_equal_to_transformers(up: Up) -> None:
    prompt = [1, 504, 3458, 6354, 28, 1014, 3758, 253]
    with grpc.insecure_channel(up.grpc) as channel:
        tokens = _generate(tandem_pb2_grpc.TandemStub(channel), prompt, 16)
    assert tokens == hf_greedy(up.model_dir, prompt, 16)


def test_status_shows_what_runs_where(up: Up) -> None:
    proc = _tandem("status", "--address", up.address, "--namespace", NAMESPACE, "--json")
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert status["router"]["grpc"] == up.grpc and status["router"]["http"] == up.http
    roles = sorted(w["role"] for w in status["workers"])
    assert roles == ["decode", "prefill"]
    for w in status["workers"]:
        assert w["state"] == "serving" and w["registered"] and w["grpc"], w
        # Every worker actor serves /metrics (tandem up --worker-metrics-port, default 0).
        samples = parse(fetch(w["metrics"]))
        assert {dict(labels)["role"] for _, labels in samples} == {w["role"]}
        assert value(samples, "tandem_kv_cache_blocks") > 0
    # The pair shares a placement group: one node, so KV moves over shared memory.
    assert {w["pair"] for w in status["workers"]} == {0}
    assert status["autoscaler"]["policy"] == "queue"
    table = format_status(status)
    assert "prefill-0" in table and "decode-0" in table and "registered" in table
    assert "metrics " in table


def test_pool_flip_goes_through_the_router_which_keeps_the_last_of_a_role(up: Up) -> None:
    """The Ray actuator's flip (the pool actor's, through RouterAdmin.FlipWorker): every
    worker actor runs the runtime that can flip, and the router refuses to flip the last
    routable worker of a role; the refusal comes back with its reason, and the pool's counts
    and the workers' roles are as before (both still serve)."""
    before = up.status()
    for role, to in (("decode", "prefill"), ("prefill", "decode")):
        (worker,) = up.workers(role)
        with pytest.raises(Exception, match="last routable"):
            ray.get(up.pool().flip.remote(worker["worker_id"], to), timeout=120)
    after = up.status()
    assert after["replicas"] == before["replicas"]
    assert sorted(w["role"] for w in after["workers"]) == sorted(
        w["role"] for w in before["workers"])
    prompt = [1, 504, 3458, 6354, 28, 1014, 3758, 253]
    with grpc.insecure_channel(up.grpc) as channel:
        assert _generate(tandem_pb2_grpc.TandemStub(channel), prompt, 8)


def test_burst_scales_prefill_up_then_idle_scales_down_without_failures(up: Up) -> None:
    # Every burst prompt is a new one of 1000 tokens (the tiny model takes 1024): the prefill
    # worker is then the bottleneck and the prompt tokens it holds stay far above the 300 of the
    # target from the first scrape until the burst stops. A repeated prompt would hit the prefix
    # cache, each Prefill call would be over in a millisecond, most scrapes would see none in
    # progress, and the pool would flap (the new worker drained before it serves) for minutes.
    burst_errors: list[str] = []
    stop_burst = threading.Event()

    def burst(seed: int) -> None:
        rnd = random.Random(seed)
        with grpc.insecure_channel(up.grpc) as channel:
            stub = tandem_pb2_grpc.TandemStub(channel)
            while not stop_burst.is_set():
                prompt = [rnd.randrange(100, 40000) for _ in range(1000)]
                try:
                    if len(_generate(stub, prompt, 1)) != 1:
                        burst_errors.append("truncated")
                except (grpc.RpcError, AssertionError) as exc:
                    burst_errors.append(repr(exc)[:300])

    with Streamer(up.grpc, [1, 2, 3, 4, 5, 6]) as streamer:
        threads = [threading.Thread(target=burst, args=(seed,), daemon=True)
                   for seed in range(4)]
        for t in threads:
            t.start()
        try:
            _wait(lambda: sum(w["state"] == "serving" for w in up.workers("prefill")) == 2,
                  240, "a second prefill worker serving")
        finally:
            stop_burst.set()
            for t in threads:
                t.join(timeout=120)
        _wait(lambda: len(up.workers("prefill")) == 1, 180, "prefill back to one worker")
        done_before = streamer.done
        _wait(lambda: streamer.done > done_before + 2, 60, "the stream to go on")
    assert streamer.failures == [] and burst_errors == []
    assert streamer.done > 3
    controller = ray.get_actor("tandem-controller", namespace=NAMESPACE)
    decisions = ray.get(controller.decisions.remote(changes_only=True))
    ups = [d for d in decisions if d["role"] == "prefill" and d["desired"] > d["current"]]
    downs = [d for d in decisions if d["role"] == "prefill" and d["desired"] < d["current"]]
    assert ups and ups[0]["proposal"]["signal"] == "prefill_queue_tokens"
    assert ups[0]["inputs"]["prefill_queue_tokens"] > 300
    assert downs
    metrics = ray.get(controller.metrics_text.remote())
    assert 'tandem_autoscaler_desired_replicas{role="prefill"} 1.0' in metrics
    assert 'tandem_autoscaler_decisions_total{direction="up"' in metrics


def test_killed_worker_actor_restarts_and_reregisters(up: Up) -> None:
    before = up.workers("prefill")[0]
    with Streamer(up.grpc, [9, 8, 7, 6, 5]) as streamer:
        _wait(lambda: streamer.done >= 1, 60, "the stream to start")
        handle = ray.get_actor(before["name"], namespace=NAMESPACE)
        ray.kill(handle, no_restart=False)

        def back() -> bool:
            w = up.workers("prefill")[0]
            return w["restarts"] == 1 and w["state"] == "serving" and bool(w["registered"])

        _wait(back, 240, "the prefill worker restarted and registered again")
        done_before = streamer.done
        _wait(lambda: streamer.done > done_before + 2, 60, "the stream to go on")
    after = up.workers("prefill")[0]
    assert after["pid"] != before["pid"]
    # The status names the new process's endpoint (its port may by chance be the old one's).
    assert int(after["grpc"].rsplit(":", 1)[1]) in _listening_ports(after["pid"])
    assert streamer.failures == []


COUPLED = """
policy: coupled
interval_s: 0.5
window_s: 2
tolerance: 0.1
stabilization_s: 10
cooldown: {up_s: 1, down_s: 1}
max_step: {up: 1, down: 1}
prefill: {min: 1, max: 1}
decode: {min: 1, max: 2}
coupled: {ttft_p90_s: 30, tpot_p90_s: 2, lead_s: 0}
request_resources: false
"""


def test_coupled_policy_drains_a_decode_worker_while_streams_run(
        up: Up, tmp_path: Path) -> None:
    """A second cluster (its own namespace, the module's Ray instance) on the ``coupled``
    policy: four clients stream 400-760-token replies across two decode workers, one worker's
    worth of decode at the fitted step cost, so the policy drains one after its 10 s window
    (the stabilizer holds the first decisions that long, while the clients start): the one
    with the fewest streams. Its drain timeout is 0: the streams it still has are cut at
    once and the router migrates them (re-prefill prompt + tokens sent). Every reply is
    complete, none failed; with two streams or more on the drained worker (they cannot all
    end in the ~0.1 s from the decision to the drain), at least one migrated."""
    namespace = "tandem-test-coupled"
    yaml = tmp_path / "coupled.yaml"
    yaml.write_text(COUPLED)
    proc = _tandem(
        "up", "--address", up.address, "--namespace", namespace, "--detach",
        "--model", str(up.model_dir), "--model-name", "tiny", "--port", "0",
        "--http-port", "0", "--dtype", "float32", "--threads", "1", "--prefill", "1",
        "--decode", "2", "--worker-arg=--num-blocks=1024",
        "--worker-arg=--drain-timeout-s=0", "--worker-arg=--stop-grace-s=0",
        "--router-arg=--heartbeat-interval=0.5", "--router-arg=--health-interval=0.5",
        "--autoscale", str(yaml), "--signal-window", "2",
    )
    try:
        ready = [ln for ln in proc.stdout.splitlines() if ln.startswith("TANDEM_READY ")]
        assert proc.returncode == 0 and ready, proc.stdout + proc.stderr
        target = json.loads(ready[0].removeprefix("TANDEM_READY "))["grpc"]
        pool = ray.get_actor("tandem-registry", namespace=namespace)

        def decode_workers() -> list[dict[str, Any]]:
            status = ray.get(pool.status.remote(), timeout=60)
            return [w for w in status["workers"] if w["role"] == "decode"]

        # Replies of different lengths: streams that end together restart together, and
        # the router's placement (reported load, refreshed by heartbeat) then sends them all
        # to one worker, leaving the other idle: the one drained, with nothing to migrate.
        streamers = [Streamer(target, [0] * 8, n=400 + 120 * i, seed=i) for i in range(4)]
        try:
            for s in streamers:
                s.__enter__()
            _wait(lambda: len(decode_workers()) == 1, 180, "the decode pool drained to one")
            done_before = sum(s.done for s in streamers)
            _wait(lambda: sum(s.done for s in streamers) > done_before + 2, 120,
                  "the streams to go on")
        finally:
            for s in streamers:
                if s._thread is not None:
                    s.__exit__()
        assert [f for s in streamers for f in s.failures] == []
        assert all(s.done >= 1 for s in streamers)
        controller = ray.get_actor("tandem-controller", namespace=namespace)
        changes = ray.get(controller.decisions.remote(changes_only=True))
        downs = [d for d in changes if d["role"] == "decode" and d["desired"] < d["current"]]
        assert len(downs) == 1 and downs[0]["proposal"]["signal"] == "output_tokens_per_s"
        assert len(downs[0]["victims"]) == 1  # the worker with the fewest streams, named
        assert downs[0]["inputs"]["router_output_tokens_per_s"] > 0  # drained under load
        router = ray.get_actor("tandem-router", namespace=namespace)
        text = ray.get(router.metrics_text.remote())
        migrated = [float(ln.split()[-1]) for ln in text.splitlines()
                    if ln.startswith("tandem_migrations_total")]
        if downs[0]["victim_load"] >= 2:
            assert migrated and migrated[0] >= 1, (downs[0], migrated)  # cut, moved on
    finally:
        _tandem("down", "--address", up.address, "--namespace", namespace, timeout=120)


def test_down_stops_everything_it_started(up: Up) -> None:
    status = up.status()
    pids = [status["pool_pid"], status["router"]["pid"], *(w["pid"] for w in status["workers"])]
    other = ray.remote(num_cpus=0)(_Bystander).options(name="bystander").remote()
    proc = _tandem("down", "--address", up.address, "--namespace", NAMESPACE)
    assert proc.returncode == 0, proc.stderr

    def ours_left() -> list[str]:
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                if a["namespace"] == NAMESPACE]

    _wait(lambda: not ours_left(), 60, "no actor of ours")
    _wait(lambda: not any(_alive(p) for p in pids), 60, "no process of ours")
    assert ray.get(other.ping.remote()) == "pong"  # nothing outside our namespace touched
    ray.kill(other)
    again = _tandem("down", "--address", up.address, "--namespace", NAMESPACE)
    assert again.returncode == 1 and "nothing running" in again.stderr


class _Bystander:
    def ping(self) -> str:
        return "pong"


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (its socket inodes in LISTEN state, by /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # st 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (an exited process not yet reaped, a zombie, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
