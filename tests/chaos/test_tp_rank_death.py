"""A rank of a tensor-parallel decode worker killed mid-stream (real processes, gloo): the
worker exits with EXIT_RANK_DIED instead of hanging in a collective, its other rank exits
too, and the router migrates the stream to a single-rank worker with no token lost or
repeated. The undisturbed run equals transformers' greedy tokens. Rank 0 killed ends the
other ranks."""

from __future__ import annotations

import grpc
import psutil

from tandem.engine.parallel.group import EXIT_RANK_DIED
from tandem.launcher.local_cluster import Cluster
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc
from tests import scrape
from tests.chaos.greedy import generate_ids, prompt_ids
from tests.integration.sdk_cluster import wait_until, worker_idle, worker_stats
from tests.integration.served_model import engine_flags, tiny_served_model
from tests.unit.engine._reference import hf_greedy

MAX_TOKENS = 64
TEXT = ("Tensor parallel ranks share every step: each holds its own heads of the cache, and the "
        "row-parallel layers sum their partial products over the group.")


def _metric(router, name: str, **labels: str) -> float:
    return scrape.value(scrape.parse(scrape.fetch(router.info["http"])), name, **labels)


def _gone(proc: psutil.Process) -> bool:
    """The process has exited: reaped, or a zombie nobody reaped yet (a SIGKILLed rank whose
    parent, rank 0, exited at once is reparented; when it is reaped is not this test's)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _holds_work(proc) -> bool:
    st = worker_stats(proc, "decode")
    return st.num_running + st.num_waiting + st.num_reserved > 0


def test_a_rank_killed_mid_stream_takes_its_worker_down_and_the_stream_migrates(
        tiny_dir, smollm2_dir) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)  # 4 heads, 2 KV heads: one each
    decode = ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *engine_flags(model))
    c = Cluster()
    try:
        group = c.start(*decode, "--tensor-parallel-size", "2")
        router = c.start("tandem.router", "--port", "0", "--tokenizer", str(model),
                         "--model-name", "tiny", "--decode", group.grpc)
        stub = tandem_pb2_grpc.TandemStub(grpc.insecure_channel(router.grpc))
        # the group is the only decode worker: this prompt's prefix now lives there
        undisturbed = generate_ids(stub, TEXT, MAX_TOKENS)
        assert undisturbed == hf_greedy(model, prompt_ids(model, TEXT), MAX_TOKENS)
        wait_until(lambda: worker_idle(group, "decode"))
        single = c.start(*decode, "--router", router.grpc)  # registers: a migration target
        wait_until(lambda: _metric(router, "tandem_workers", worker_role="decode",
                                   routable="true") == 2)
        migrations = _metric(router, "tandem_migrations_total")
        ranks = [p for p in psutil.Process(group.popen.pid).children()
                 if "tandem.worker.tp_rank" in " ".join(p.cmdline())]  # a worker's rank
        assert len(ranks) == 1
        sampling = tandem_pb2.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                             ignore_eos=True)
        tokens: list[int] = []
        killed = False
        for msg in stub.Generate(tandem_pb2.GenerateRequest(text=TEXT, sampling=sampling),
                                 timeout=300):
            tokens += msg.token_ids
            if not killed and tokens:
                # the prefix affinity sent it to the group, checked, not assumed; the stream
                # cannot end before the kill: every further step needs both ranks
                assert _holds_work(group) and not _holds_work(single)
                ranks[0].kill()
                killed = True
        assert tokens == undisturbed
        assert _metric(router, "tandem_migrations_total") == migrations + 1
        assert group.popen.wait(timeout=120) == EXIT_RANK_DIED  # bounded: no hung collective
        assert _gone(ranks[0])
        wait_until(lambda: worker_idle(single, "decode"))
    finally:
        c.stop()


def test_rank_0_killed_ends_the_other_ranks(tiny_dir, smollm2_dir) -> None:
    """SIGKILL the worker (rank 0): its pipes close, so the other ranks exit on their own."""
    model = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()
    try:
        group = c.start("tandem.worker.decode", "--port", "0", "--kv-port", "0",
                        *engine_flags(model), "--tensor-parallel-size", "2")
        ranks = psutil.Process(group.popen.pid).children()
        assert len(ranks) == 1
        group.kill()
        _, alive = psutil.wait_procs(ranks, timeout=120)
        assert not alive
    finally:
        c.stop()
