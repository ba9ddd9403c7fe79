"""Real worker processes on a tiny checkpoint: the disaggregation contract (Reserve -> Prefill
-> Decode equals one engine's greedy output), aborts leave no blocks, errors at the edge, a
full decode pool, a prefill worker SIGKILLed mid-push, and a SIGTERM drain that exits 0.

Tests that kill or drain a worker start their own; the module's pair stays up for every test,
whatever order they run in."""

from __future__ import annotations

import atexit
import json
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tandem.common.security.credential import ClusterCredential, new_secret, private_secret_file
from tandem.common.security.grpc_auth import sync_channel
from tandem.engine.sampling_params import SamplingParams
from tandem.protos.v1 import tandem_pb2, worker_pb2, worker_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
READY = "TANDEM_READY"
# The module's cluster credential: every worker here is started with it, every stub calls with it.
SECRET = private_secret_file(new_secret())
atexit.register(shutil.rmtree, SECRET.parent, True)  # its private folder goes with the run
CREDENTIAL = ClusterCredential.from_file(SECRET)
PROMPT = [3 + (i * 29) % 250 for i in range(37)]
HELD = [5 + (i * 31) % 250 for i in range(21)]  # shares no prefix with PROMPT


class Worker:
    """One worker process; its stdout is read on a thread so waits can time out."""

    def __init__(self, module: str, args: list[str], log: Path) -> None:
        self.log = log
        self._err = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args, "--cluster-secret-file", str(SECRET)],
            cwd=ROOT, stdout=subprocess.PIPE,
            stderr=self._err, text=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def wait_ready(self, timeout: float = 300.0) -> dict[str, str]:
        """The READY line's JSON; fails with the worker's log if it exits first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no READY line; log:\n{self.log.read_text()}") from None
            if line is None:
                self.proc.wait(10)
                raise AssertionError(f"exited {self.proc.returncode}:\n{self.log.read_text()}")
            if line.startswith(READY + " "):
                return json.loads(line[len(READY):])

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait for the exit status (SIGKILL if it hangs)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._err.close()
        return self.proc.returncode


def _until(check: Callable[[], Any], ok: Callable[[Any], bool], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition never held; last value: {value}")
        time.sleep(0.02)


def _member(address: str) -> grpc.Channel:
    """A channel that calls as a cluster member (the workers refuse anyone else)."""
    return sync_channel(grpc.insecure_channel(address), CREDENTIAL, address)


def _idle(s: worker_pb2.WorkerStats) -> bool:
    return (s.num_running == 0 and s.num_waiting == 0 and s.num_reserved == 0
            and s.num_free_blocks == s.num_blocks)


def _greedy(n: int) -> tandem_pb2.SamplingParams:
    return tandem_pb2.SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


class Cluster:
    """Stubs to one decode and one prefill worker process."""

    def __init__(self, decode: Worker, d_info: dict[str, str], prefill: Worker,
                 p_info: dict[str, str], model: str) -> None:
        self.decode_proc, self.prefill_proc, self.model = decode, prefill, model
        self.decode_address = d_info["grpc"]
        self.prefill_address = p_info["grpc"]
        self._channels = [_member(d_info["grpc"]), _member(p_info["grpc"])]
        self.decode = worker_pb2_grpc.DecodeServiceStub(self._channels[0])
        self.prefill = worker_pb2_grpc.PrefillServiceStub(self._channels[1])

    def reserve(self, rid: str, prompt: list[int], n: int, lease_s: float = 60.0
                ) -> worker_pb2.ReserveResponse:
        return self.decode.Reserve(worker_pb2.ReserveRequest(
            request_id=rid, token_ids=prompt, sampling=_greedy(n), lease_s=lease_s))

    def prefill_request(self, rid: str, prompt: list[int], n: int,
                        res: worker_pb2.ReserveResponse) -> worker_pb2.PrefillRequest:
        return worker_pb2.PrefillRequest(
            request_id=rid, token_ids=prompt, sampling=_greedy(n), transfer_id=res.transfer_id,
            block_ids=res.block_ids, skip_tokens=res.skip_tokens, kv_endpoint=res.kv_endpoint,
            layout=res.layout)

    def both_idle(self) -> None:
        stats = worker_pb2.StatsRequest()
        _until(lambda: self.decode.Stats(stats), _idle)
        _until(lambda: self.prefill.Stats(stats), _idle)

    def close(self) -> None:
        for ch in self._channels:
            ch.close()


class FakeRouter(worker_pb2_grpc.RegistryServicer):
    """Records registrations and heartbeats (the real router lives in tandem/router/)."""

    def __init__(self) -> None:
        self.registered: dict[int, worker_pb2.RegisterRequest] = {}
        self.beats: dict[str, worker_pb2.WorkerStats] = {}
        self._lock = threading.Lock()

    def Register(self, request, context):  # noqa: N802
        with self._lock:
            self.registered[request.role] = request
        return worker_pb2.RegisterResponse(heartbeat_interval_s=0.05)

    def Heartbeat(self, request, context):  # noqa: N802
        with self._lock:
            self.beats[request.worker_id] = request.stats
        return worker_pb2.HeartbeatResponse(known=True)


@pytest.fixture(scope="module")
def router() -> Iterator[tuple[FakeRouter, str]]:
    fake = FakeRouter()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    worker_pb2_grpc.add_RegistryServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield fake, f"127.0.0.1:{port}"
    server.stop(None)


@pytest.fixture(scope="module")
def cluster(tiny_dir, tmp_path_factory, router) -> Iterator[Cluster]:
    model = str(tiny_dir("llama", 2))
    logs = tmp_path_factory.mktemp("worker-logs")
    engine = ["--model", model, "--block-size", "16", "--threads", "1", "--router", router[1]]
    decode = Worker("tandem.worker.decode", ["--port", "0", "--kv-port", "0", "--num-blocks", "64",
                                      *engine], logs / "decode.log")
    prefill = Worker("tandem.worker.prefill", ["--port", "0", "--num-blocks", "64", *engine],
                     logs / "prefill.log")
    c = None
    try:
        d_info, p_info = decode.wait_ready(), prefill.wait_ready()
        assert d_info["role"] == "decode" and d_info["kv"].startswith("127.0.0.1:")
        c = Cluster(decode, d_info, prefill, p_info, model)
        yield c
    finally:
        if c is not None:
            c.close()
        codes = (decode.stop(), prefill.stop())
    assert codes == (0, 0), f"exit codes {codes}; logs in {logs}"


def _every_worker_call(decode: worker_pb2_grpc.DecodeServiceStub,
                       prefill: worker_pb2_grpc.PrefillServiceStub,
                       good: worker_pb2.PrefillRequest) -> dict[str, Callable[[], Any]]:
    """One call of each worker method, aimed at the request ``good`` belongs to."""
    victim = good.request_id
    return {
        "Decode.Reserve": lambda: decode.Reserve(worker_pb2.ReserveRequest(
            request_id="x", token_ids=PROMPT, sampling=_greedy(4), lease_s=600), timeout=30),
        "Decode.Decode": lambda: list(decode.Decode(
            worker_pb2.DecodeRequest(request_id=victim), timeout=30)),
        "Decode.PrefillLocal": lambda: decode.PrefillLocal(
            worker_pb2.PrefillLocalRequest(request_id=victim), timeout=30),
        "Decode.Abort": lambda: decode.Abort(
            worker_pb2.AbortRequest(request_id=victim), timeout=30),
        "Decode.Stats": lambda: decode.Stats(worker_pb2.StatsRequest(), timeout=30),
        "Prefill.Prefill": lambda: prefill.Prefill(good, timeout=30),
        "Prefill.Abort": lambda: prefill.Abort(
            worker_pb2.AbortRequest(request_id=victim), timeout=30),
        "Prefill.Stats": lambda: prefill.Stats(worker_pb2.StatsRequest(), timeout=30),
    }


def test_every_worker_method_refuses_callers_without_the_credential(cluster: Cluster) -> None:
    """No credential, or another cluster's: every DecodeService and PrefillService method
    answers UNAUTHENTICATED, and nothing happened on the workers (the member's Reserve that
    follows gets the whole pool)."""
    res = cluster.reserve("victim", PROMPT, 4)
    good = cluster.prefill_request("victim", PROMPT, 4, res)
    stranger = ClusterCredential.from_hex(new_secret())
    for make in (lambda a: grpc.insecure_channel(a),
                 lambda a: sync_channel(grpc.insecure_channel(a), stranger, a)):
        with make(cluster.decode_address) as d_ch, make(cluster.prefill_address) as p_ch:
            decode = worker_pb2_grpc.DecodeServiceStub(d_ch)
            prefill = worker_pb2_grpc.PrefillServiceStub(p_ch)
            calls = _every_worker_call(decode, prefill, good)
            for name, call in calls.items():
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
    # The victim's reservation is untouched: a member prefills and decodes it to the end.
    first = cluster.prefill.Prefill(good, timeout=60)
    msgs = list(cluster.decode.Decode(worker_pb2.DecodeRequest(request_id="victim"), timeout=60))
    assert 1 + sum(len(m.token_ids) for m in msgs) == 4 and msgs[-1].finished
    assert first.first_token >= 0
    cluster.both_idle()


def test_disaggregated_equals_single_engine(cluster: Cluster, make_engine) -> None:
    engine = make_engine(model=cluster.model, num_blocks=64, block_size=16)
    rid = engine.add_request(PROMPT, SamplingParams(temperature=0.0, max_tokens=16,
                                                    ignore_eos=True))
    want: list[int] = []
    while engine.has_unfinished():
        want += [t for o in engine.step() if o.request_id == rid for t in o.new_token_ids]

    res = cluster.reserve("same", PROMPT, 16)
    first = cluster.prefill.Prefill(cluster.prefill_request("same", PROMPT, 16, res))
    msgs = list(cluster.decode.Decode(worker_pb2.DecodeRequest(request_id="same")))
    assert [first.first_token] + [t for m in msgs for t in m.token_ids] == want
    assert msgs[-1].finished and msgs[-1].finish_reason == "length"
    assert msgs[-1].usage.completion_tokens == 16
    cluster.both_idle()


def test_workers_register_and_heartbeat(cluster: Cluster, router) -> None:
    fake, _ = router
    _until(lambda: (len(fake.registered), len(fake.beats)), lambda n: n == (2, 2))
    decode, prefill = fake.registered[worker_pb2.ROLE_DECODE], fake.registered[
        worker_pb2.ROLE_PREFILL]
    assert decode.endpoint == cluster.decode_address and "tcp=127.0.0.1:" in decode.kv_endpoint
    assert prefill.layout.fingerprint == decode.layout.fingerprint != ""
    assert fake.beats[decode.worker_id].role == worker_pb2.ROLE_DECODE
    assert fake.beats[prefill.worker_id].num_blocks == 64


def test_abort_mid_decode_frees_both_workers(cluster: Cluster) -> None:
    res = cluster.reserve("ab", PROMPT, 900)
    cluster.prefill.Prefill(cluster.prefill_request("ab", PROMPT, 900, res))
    stream = cluster.decode.Decode(worker_pb2.DecodeRequest(request_id="ab"))
    first = next(stream)
    assert first.token_ids and not first.finished
    assert cluster.decode.Abort(worker_pb2.AbortRequest(request_id="ab")).found
    assert not cluster.prefill.Abort(worker_pb2.AbortRequest(request_id="ab")).found
    rest = list(stream)
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    cluster.both_idle()


def test_bad_requests_are_invalid_argument(cluster: Cluster) -> None:
    with pytest.raises(grpc.RpcError) as err:
        cluster.reserve("bad", [5, 999], 4)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "outside the vocabulary" in err.value.details()
    res = cluster.reserve("bad2", PROMPT, 4)
    req = cluster.prefill_request("bad2", PROMPT, 4, res)
    req.sampling.top_p = 2.0
    with pytest.raises(grpc.RpcError) as err:
        cluster.prefill.Prefill(req)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("top_p:")
    cluster.decode.Abort(worker_pb2.AbortRequest(request_id="bad2"))
    cluster.both_idle()


def test_full_decode_pool_is_resource_exhausted(cluster: Cluster) -> None:
    big = PROMPT * 15  # 555 tokens: 35 of the decode worker's 64 blocks
    cluster.reserve("big1", big, 4)
    with pytest.raises(grpc.RpcError) as err:
        cluster.reserve("big2", big, 4)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert cluster.decode.Abort(worker_pb2.AbortRequest(request_id="big1")).found
    cluster.both_idle()


def test_prefill_killed_mid_push_releases_the_lease(cluster: Cluster, tmp_path: Path) -> None:
    victim = Worker("tandem.worker.prefill", ["--port", "0", "--model", cluster.model, "--block-size",
                                       "16", "--threads", "1", "--max-num-batched-tokens", "16"],
                    tmp_path / "victim.log")
    try:
        info = victim.wait_ready()
        with _member(info["grpc"]) as ch:
            stub = worker_pb2_grpc.PrefillServiceStub(ch)
            big = PROMPT * 5
            res = cluster.reserve("kill", big, 4, lease_s=1.0)
            call = stub.Prefill.future(cluster.prefill_request("kill", big, 4, res))

            def busy() -> bool:
                s = stub.Stats(worker_pb2.StatsRequest())
                return call.done() or s.num_running + s.num_waiting + s.num_reserved > 0

            _until(busy, bool)
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait(10)
    finally:
        victim.stop()
    # Lost connection (mid-push) or lease expiry (before it): either way the blocks come back.
    _until(lambda: cluster.decode.Stats(worker_pb2.StatsRequest()), _idle)


def test_busy_port_exits_nonzero(cluster: Cluster, tmp_path: Path) -> None:
    port = cluster.decode_address.rsplit(":", 1)[1]
    w = Worker("tandem.worker.decode", ["--port", port, "--kv-port", "0",
                                 "--model", cluster.model], tmp_path / "busy.log")
    try:
        rc = w.proc.wait(300)
    finally:
        w.stop()
    assert rc == 2 and "cannot listen" in w.log.read_text()


def test_sigterm_drains_running_streams(cluster: Cluster, tmp_path: Path) -> None:
    """SIGTERM: health turns NOT_SERVING and new reservations are refused while what the worker
    already has goes on: a stream mid-decode runs to its end, and a reservation still waiting
    for its KV is kept. That reservation, which only the test ends, holds the drain open until
    the checks are done however fast the stream finishes; then the worker exits 0."""
    worker = Worker("tandem.worker.decode", ["--port", "0", "--kv-port", "0", "--num-blocks", "64",
                                      "--model", cluster.model, "--block-size", "16",
                                      "--threads", "1", "--drain-timeout-s", "600"],
                    tmp_path / "drain.log")
    try:
        info = worker.wait_ready()
        with _member(info["grpc"]) as channel:
            decode = worker_pb2_grpc.DecodeServiceStub(channel)
            health = health_pb2_grpc.HealthStub(channel)

            def reserve(rid: str, prompt: list[int], n: int) -> worker_pb2.ReserveResponse:
                return decode.Reserve(worker_pb2.ReserveRequest(
                    request_id=rid, token_ids=prompt, sampling=_greedy(n), lease_s=600.0),
                    timeout=60)

            res = reserve("drain", PROMPT, 40)
            cluster.prefill.Prefill(cluster.prefill_request("drain", PROMPT, 40, res))
            stream = decode.Decode(worker_pb2.DecodeRequest(request_id="drain"))
            msgs = [next(stream)]
            held = reserve("held", HELD, 8)
            worker.proc.send_signal(signal.SIGTERM)
            check = health_pb2.HealthCheckRequest(service="tandem.v1.DecodeService")
            _until(lambda: health.Check(check, timeout=30).status,
                   lambda s: s == health_pb2.HealthCheckResponse.NOT_SERVING)
            with pytest.raises(grpc.RpcError) as err:
                reserve("late", PROMPT, 4)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "draining" in err.value.details()
            msgs += list(stream)
            assert msgs[-1].finished and msgs[-1].finish_reason == "length"
            assert sum(len(m.token_ids) for m in msgs) == 39  # all but the first
            assert held.block_ids  # reserved before SIGTERM, kept by the drain until ended:
            assert decode.Abort(worker_pb2.AbortRequest(request_id="held"), timeout=60).found
        assert worker.proc.wait(120) == 0
    finally:
        worker.stop()
