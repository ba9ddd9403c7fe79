"""Live KV migration through real processes (tiny served model; two decode workers, a prefill
worker, a router): a stream moved from one decode worker to the other mid-generation equals
the undisturbed stream token for token and text for text (greedy; seeded with penalties and a
stop string; a JSON schema; both choices of a seeded n=2 request, whose prompt crosses once),
with both workers idle after and every block free; a move whose target is SIGKILLed mid-push
leaves the stream on its source, which finishes it; and `tandem drain --migrate` of a worker
holding several streams moves them all with zero failed requests (then `tandem drain` without
it waits for the streams). With a stream past a few full blocks, the move pre-copies them
while the stream decodes on: the tokens are the same, tokens reach the client after the
pre-copy began and before the switch, and the stop-and-copy pushes only the tail; a target
killed during the pre-copy leaves the stream on its source, never stopped, nothing held.

Ordering, forced: the decode workers run with the test-only step hold
(tandem/worker/step_hold.py): while the test holds it, a worker takes no step once a request
it runs has ``K`` output tokens, so no stream passes ``K`` tokens; the test waits until the
client has them (a stream's move ticket is open from its first token on), asks for the move
and lifts the hold only after the move's reply, so no stream can end before its move. The target's death falls in a forced window too: the source holds before its
COMMIT (tandem/worker/commit_hold.py). The streams held at ``K`` have no full block yet (no
pre-copy); those of the pre-copy tests are held at ``PRE`` tokens, and the pre-copy's own
COMMIT holds while the step hold rises to ``TAIL`` tokens.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest

from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc
from tandem.worker.commit_hold import ENV as HOLD_ENV
from tests import scrape
from tests.chaos.step_holds import K, hold_steps, holder, lift_steps, reached
from tests.integration.sdk_cluster import MODEL_ID, wait_until, worker_idle, worker_stats
from tests.integration.served_model import engine_flags, start_all, tiny_served_model

pytestmark = pytest.mark.slow

LONG = 128  # tokens per moved stream
BLOCK = 16  # the engine's block size (tandem/engine/config.py)
GREEDY = tandem_pb2.SamplingParams(max_tokens=LONG, temperature=0.0, ignore_eos=True)
PRE, TAIL = 40, 60  # output tokens at a pre-copy test's move request, and at its switch


@dataclass
class Run:
    """One streamed request in a thread: every message, and a flag at the first."""

    stub: tandem_pb2_grpc.TandemStub
    text: str
    sampling: tandem_pb2.SamplingParams
    messages: list[tandem_pb2.GenerateResponse] = field(default_factory=list)
    error: grpc.RpcError | None = None
    first: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def tokens(self) -> int:
        """Tokens received so far."""
        return sum(len(m.token_ids) for m in list(self.messages))

    def start(self) -> Run:
        def go() -> None:
            request = tandem_pb2.GenerateRequest(text=self.text, sampling=self.sampling)
            try:
                for m in self.stub.Generate(request, timeout=300):
                    self.messages.append(m)
                    self.first.set()
            except grpc.RpcError as exc:
                self.error = exc
                self.first.set()

        self.thread = threading.Thread(target=go)
        self.thread.start()
        return self

    def result(self) -> tuple[list[int], str, str]:
        """(token ids, text, finish reason) once the stream ended."""
        assert self.thread is not None
        self.thread.join(timeout=300)
        assert self.error is None, self.error
        return ([t for m in self.messages for t in m.token_ids],
                "".join(m.text for m in self.messages), self.messages[-1].finish_reason)


@dataclass
class Forked:
    """One streamed n=2 completion over HTTP in a thread: each choice's tokens (logprobs'
    token texts), text and finish reason."""

    client: openai.OpenAI
    body: dict[str, Any]
    tokens: dict[int, list[str]] = field(default_factory=lambda: {0: [], 1: []})
    texts: dict[int, str] = field(default_factory=lambda: {0: "", 1: ""})
    finish: dict[int, str] = field(default_factory=dict)
    error: Exception | None = None
    thread: threading.Thread | None = None

    def start(self) -> Forked:
        def go() -> None:
            try:
                for chunk in self.client.completions.create(stream=True, **self.body):
                    for c in chunk.choices:
                        self.tokens[c.index] += c.logprobs.tokens if c.logprobs else []
                        self.texts[c.index] += c.text
                        if c.finish_reason:
                            self.finish[c.index] = c.finish_reason
            except Exception as exc:  # noqa: BLE001  # asserted in result()
                self.error = exc

        self.thread = threading.Thread(target=go)
        self.thread.start()
        return self

    def result(self) -> list[tuple[list[str], str, str]]:
        """Each choice's (tokens, text, finish reason) once the stream ended."""
        assert self.thread is not None
        self.thread.join(timeout=300)
        assert self.error is None, self.error
        return [(self.tokens[j], self.texts[j], self.finish[j]) for j in (0, 1)]


def _start(c: Cluster, model: Path) -> tuple[Proc, Proc, Proc, Proc]:
    flags = engine_flags(model)
    d1, d2, prefill = start_all(
        c, ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *flags),
        ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *flags),
        ("tandem.worker.prefill", "--port", "0", *flags))
    router = c.start(
        "tandem.router", "--port", "0", "--tokenizer", str(model), "--model-name", MODEL_ID,
        "--prefill", prefill.grpc, "--decode", f"{d1.grpc},{d2.grpc}", "--placement", "remote")
    return d1, d2, prefill, router


def _move(router: Proc, worker: Proc) -> worker_pb2.MovedStreams:
    with router.channel() as channel:
        return worker_pb2_grpc.RouterAdminStub(channel).MoveStreams(
            worker_pb2.MoveStreamsRequest(worker=worker.grpc), timeout=300)


def _moved_run(stub: tandem_pb2_grpc.TandemStub, router: Proc, d1: Proc, d2: Proc,
               text: str, sampling: tandem_pb2.SamplingParams, steps: Path
               ) -> tuple[list[int], str, str]:
    hold_steps(steps)
    run = Run(stub, text, sampling).start()
    reached(run.tokens)
    reply = _move(router, holder(d1, d2))
    lift_steps(steps)
    assert (reply.moved, reply.stayed) == (1, 0), reply.reasons
    return run.result()


def _moved_bytes(router: Proc) -> float:
    return scrape.value(scrape.parse(scrape.fetch(router.info["http"])),
                        "tandem_live_migration_bytes_total")


def test_moved_stream_equals_undisturbed(tiny_dir, smollm2_dir, steps: Path) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()
    try:
        d1, d2, prefill, router = _start(c, model)
        stub = tandem_pb2_grpc.TandemStub(grpc.insecure_channel(router.grpc))
        text = "The lighthouse keeper counted the ships"
        moved = _moved_run(stub, router, d1, d2, text, GREEDY, steps)
        undisturbed_run = Run(stub, text, GREEDY).start()
        assert moved == undisturbed_run.result()
        # The first move: its target had none of the prompt, so every block crossed; the
        # KV of all the tokens but the last (the COMMIT carries that one).
        blocks = -(-(undisturbed_run.messages[-1].usage.prompt_tokens + K - 1) // BLOCK)
        per_block, rest = divmod(int(_moved_bytes(router)), blocks)
        assert per_block > 0 and rest == 0

        seeded = tandem_pb2.SamplingParams(max_tokens=LONG, temperature=0.9, top_p=0.95,
                                           seed=1234, frequency_penalty=0.6,
                                           repetition_penalty=1.1, ignore_eos=True)
        tokens, full_text, _ = Run(stub, text, seeded).start().result()
        # A stop string from late in the seeded text: it matches after the move.
        stop = full_text[int(len(full_text) * 0.8):][:6]
        assert stop.strip()
        seeded.stop.append(stop)
        undisturbed = Run(stub, text, seeded).start().result()
        assert undisturbed[2] == "stop" and len(undisturbed[0]) > LONG // 2
        assert _moved_run(stub, router, d1, d2, text, seeded, steps) == undisturbed

        # Structured output: the target's grammar matcher replays the tokens so far.
        schema = tandem_pb2.SamplingParams(max_tokens=LONG, temperature=0.0)
        schema.structured.json_schema = ('{"type": "array", "items": {"type": "string"}, '
                                         '"minItems": 64}')
        undisturbed = Run(stub, text, schema).start().result()
        assert len(undisturbed[0]) > LONG // 2
        assert _moved_run(stub, router, d1, d2, text, schema, steps) == undisturbed

        # n=2, seeded: each sequence moves as a single request of its own (seed + j), one at
        # a time; the second finds the prompt's blocks on the target (the first's), so they
        # cross once. A prompt no worker has seen: the target caches nothing of it before.
        client = openai.OpenAI(base_url=f"http://{router.info['http']}/v1", api_key="unused")
        forked = {"model": MODEL_ID, "prompt": "Two keepers wrote letters to the harbour",
                  "max_tokens": LONG, "n": 2, "temperature": 0.9, "top_p": 0.95, "seed": 77,
                  "logprobs": 0, "extra_body": {"ignore_eos": True}}
        before = _moved_bytes(router)
        hold_steps(steps)
        run = Forked(client, forked).start()
        reached(lambda: len(run.tokens[0]), lambda: len(run.tokens[1]))
        reply = _move(router, holder(d1, d2))
        lift_steps(steps)
        assert (reply.moved, reply.stayed) == (2, 0), reply.reasons
        whole = client.completions.create(**forked)
        assert run.result() == [(c.logprobs.tokens, c.text, c.finish_reason)
                                for c in whole.choices]
        assert whole.usage is not None
        kv = whole.usage.prompt_tokens + K - 1  # each sequence's KV at the move
        a, b = (c.logprobs.tokens for c in whole.choices)
        common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), K)
        shared = min(whole.usage.prompt_tokens + common, kv) // BLOCK  # full blocks alike
        assert _moved_bytes(router) - before == per_block * (2 * -(-kv // BLOCK) - shared)

        for d in (d1, d2):
            wait_until(lambda d=d: worker_idle(d, "decode"))
        samples = scrape.parse(scrape.fetch(router.info["http"]))
        assert scrape.value(samples, "tandem_live_migrations_total", cause="operator",
                            outcome="moved") == 5
        gaps = scrape.value(samples, "tandem_live_migration_gap_seconds_count")
        assert gaps == 5  # in decode steps too (long here: each move waited on the test)
        assert scrape.value(samples, "tandem_live_migration_gap_steps_count") == 5
        print(f"\nmean client-visible gap of a live move: "
              f"{scrape.value(samples, 'tandem_live_migration_gap_seconds_sum') / gaps:.4f} s")
        assert scrape.value(samples, "tandem_migrations_total") == 0  # nothing re-prefilled
    finally:
        c.stop()


def test_target_killed_mid_push_stream_stays(tiny_dir, smollm2_dir, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch,
                                              steps: Path) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    hold = tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv(HOLD_ENV, str(hold))  # read by the workers; no hold file: no pause
    c = Cluster()
    try:
        d1, d2, prefill, router = _start(c, model)
        stub = tandem_pb2_grpc.TandemStub(grpc.insecure_channel(router.grpc))
        text = "A second prompt about harbours"
        undisturbed = Run(stub, text, GREEDY).start().result()
        hold_steps(steps)
        run = Run(stub, text, GREEDY).start()
        reached(run.tokens)
        source = holder(d1, d2)
        target = d2 if source is d1 else d1
        (hold / "hold").touch()  # the move's COMMIT waits: the target dies meanwhile
        replies: list[worker_pb2.MovedStreams] = []
        mover = threading.Thread(target=lambda: replies.append(_move(router, source)))
        mover.start()
        try:
            wait_until(lambda: (hold / "held").exists(), timeout=120)
            target.kill()
        finally:
            (hold / "release").touch()
            mover.join(timeout=300)
        lift_steps(steps)
        (reply,) = replies
        assert (reply.moved, reply.stayed) == (0, 1) and "push failed" in reply.reasons[0]
        assert run.result() == undisturbed  # it went on where it was
        wait_until(lambda: worker_idle(source, "decode"))
        samples = scrape.parse(scrape.fetch(router.info["http"]))
        assert scrape.value(samples, "tandem_live_migrations_total", cause="operator",
                            outcome="stayed") == 1
        assert scrape.value(samples, "tandem_migrations_total") == 0
    finally:
        c.stop()


def test_drain_migrate_moves_every_stream(tiny_dir, smollm2_dir, steps: Path) -> None:
    """Several streams, all gathered on d1 by a move; a drain with migrate of d1: every
    stream completes, equal to its undisturbed run, and the worker exits; then the streams
    again on the survivor and a plain drain of it, which waits for them (both drains' times
    printed, indicative only)."""
    model = tiny_served_model(tiny_dir, smollm2_dir)
    c = Cluster()
    try:
        d1, d2, prefill, router = _start(c, model)
        stub = tandem_pb2_grpc.TandemStub(grpc.insecure_channel(router.grpc))
        texts = [f"Story {i}: the lighthouse keeper counted" for i in range(4)]
        expected = [Run(stub, t, GREEDY).start().result() for t in texts]
        hold_steps(steps)  # each stream stops at its first token or its K-th, until lifted
        runs = [Run(stub, t, GREEDY).start() for t in texts]
        assert all(r.first.wait(120) for r in runs)
        # Whatever placement put on d2 moves to d1 (the one other decode worker): d1 then
        # holds every stream.
        assert _move(router, d2).stayed == 0
        drained, survivor = d1, d2
        t0 = time.monotonic()
        with router.channel() as channel:
            reply = worker_pb2_grpc.RouterAdminStub(channel).DrainWorker(
                worker_pb2.DrainWorkerRequest(worker=drained.grpc, migrate=True), timeout=300)
        assert (reply.moved, reply.stayed) == (len(texts), 0), reply.reasons
        assert drained.popen.wait(timeout=120) == 0
        migrate_s = time.monotonic() - t0
        lift_steps(steps)
        assert [r.result() for r in runs] == expected  # zero failed, nothing changed

        # The same streams again, all on the survivor now; a plain drain (the CLI's) waits
        # for them.
        runs = [Run(stub, t, GREEDY).start() for t in texts]
        assert all(r.first.wait(120) for r in runs)
        secret = c.credential_flags[c.credential_flags.index("--cluster-secret-file") + 1]
        t0 = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-m", "tandem.cli.main", "drain", survivor.grpc,
             "--router", router.grpc, "--cluster-secret-file", secret],
            capture_output=True, text=True, timeout=300, check=True)
        assert f"draining {survivor.grpc}: 0 stay to finish there" in out.stdout, out.stdout
        assert survivor.popen.wait(timeout=300) == 0
        plain_s = time.monotonic() - t0
        assert [r.result() for r in runs] == expected
        print(f"\ndrain --migrate of a worker with {reply.moved} streams: {migrate_s:.2f} s to "
              f"its exit (the moves: {reply.seconds:.3f} s); plain drain of one with "
              f"{len(texts)}: {plain_s:.2f} s")
    finally:
        c.stop()


def _pre_copied_bytes(router: Proc) -> float:
    return scrape.value(scrape.parse(scrape.fetch(router.info["http"])),
                        "tandem_live_migration_precopy_bytes_total")


def test_precopy_streams_on_then_moves_only_the_tail(tiny_dir, smollm2_dir, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     steps: Path) -> None:
    """A stream held at ``PRE`` tokens is moved; its pre-copy's COMMIT holds (the pre-copy
    began: its blocks pushed) while the step hold rises to ``TAIL``: the client gets the
    tokens up to ``TAIL`` from the source before the switch. Released, the move stops the
    stream and pushes only the blocks after the pre-copied ones; the tokens equal the
    undisturbed stream's; both workers end idle with every block free."""
    model = tiny_served_model(tiny_dir, smollm2_dir)
    hold = tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv(HOLD_ENV, str(hold))
    c = Cluster()
    try:
        d1, d2, prefill, router = _start(c, model)
        stub = tandem_pb2_grpc.TandemStub(grpc.insecure_channel(router.grpc))
        text = "The keeper of the northern light wrote in his log"  # no worker has seen it
        hold_steps(steps, PRE)
        run = Run(stub, text, GREEDY).start()
        reached(run.tokens, k=PRE)
        source = holder(d1, d2)
        (hold / "hold").touch()  # the first push to COMMIT waits: the pre-copy's
        replies: list[worker_pb2.MovedStreams] = []
        mover = threading.Thread(target=lambda: replies.append(_move(router, source)))
        mover.start()
        try:
            wait_until(lambda: (hold / "held").exists(), timeout=120)
            assert run.tokens() == PRE  # nothing moved yet
            hold_steps(steps, TAIL)  # the source steps on while its pre-copy is under way
            reached(run.tokens, k=TAIL)  # delivered after the pre-copy began, before the switch
        finally:
            (hold / "release").touch()
            mover.join(timeout=300)
        lift_steps(steps)
        (reply,) = replies
        assert (reply.moved, reply.stayed) == (1, 0), reply.reasons
        moved = run.result()
        undisturbed = Run(stub, text, GREEDY).start().result()
        assert moved == undisturbed
        prompt = run.messages[-1].usage.prompt_tokens
        # The pre-copy: the full blocks of every token the client had but the last; the
        # stop-and-copy: the blocks after them, of every token but the last at the switch.
        pre_blocks = (prompt + PRE - 1) // BLOCK
        tail_blocks = -(-(prompt + TAIL - 1) // BLOCK) - pre_blocks
        assert pre_blocks >= 2 and tail_blocks >= 1
        pre_bytes, tail_bytes = _pre_copied_bytes(router), _moved_bytes(router)
        per_block, rest = divmod(int(pre_bytes), pre_blocks)
        assert per_block > 0 and rest == 0
        assert tail_bytes == per_block * tail_blocks
        for d in (d1, d2):
            wait_until(lambda d=d: worker_idle(d, "decode"))
        samples = scrape.parse(scrape.fetch(router.info["http"]))
        assert scrape.value(samples, "tandem_live_migrations_total", cause="operator",
                            outcome="moved") == 1
        assert scrape.value(samples, "tandem_migrations_total") == 0
    finally:
        c.stop()


def test_target_killed_during_precopy_stream_goes_on(tiny_dir, smollm2_dir, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      steps: Path) -> None:
    """The target dies while the pre-copy's COMMIT holds: the move ends before any Suspend
    (no gap is measured: the stream never stopped), the stream finishes on its source equal
    to the undisturbed one, and the source holds nothing after (its pin freed)."""
    model = tiny_served_model(tiny_dir, smollm2_dir)
    hold = tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv(HOLD_ENV, str(hold))
    c = Cluster()
    try:
        d1, d2, prefill, router = _start(c, model)
        stub = tandem_pb2_grpc.TandemStub(grpc.insecure_channel(router.grpc))
        text = "A third prompt, about the harbour master's ledger"
        undisturbed = Run(stub, text, GREEDY).start().result()
        hold_steps(steps, PRE)
        run = Run(stub, text, GREEDY).start()
        reached(run.tokens, k=PRE)
        source = holder(d1, d2)
        target = d2 if source is d1 else d1
        (hold / "hold").touch()
        replies: list[worker_pb2.MovedStreams] = []
        mover = threading.Thread(target=lambda: replies.append(_move(router, source)))
        mover.start()
        try:
            wait_until(lambda: (hold / "held").exists(), timeout=120)
            target.kill()
        finally:
            (hold / "release").touch()
            mover.join(timeout=300)
        (reply,) = replies
        assert (reply.moved, reply.stayed) == (0, 1)
        assert "pre-copy failed" in reply.reasons[0], reply.reasons
        assert worker_stats(source, "decode").num_running == 1  # it never left the batch
        lift_steps(steps)
        assert run.result() == undisturbed  # it went on where it was
        wait_until(lambda: worker_idle(source, "decode"))
        samples = scrape.parse(scrape.fetch(router.info["http"]))
        assert scrape.value(samples, "tandem_live_migrations_total", cause="operator",
                            outcome="stayed") == 1
        assert scrape.value(samples, "tandem_live_migration_gap_seconds_count") == 0
        assert scrape.value(samples, "tandem_migrations_total") == 0
    finally:
        c.stop()
