"""Role flips through real processes (tiny served model): a worker started to flip
(``python -m tandem.worker.dual``) switches prefill <-> decode with its weights loaded.

- decode -> prefill under load (``tandem flip``, the CLI): every stream on it moves live to
  the other decode worker, each equal to its undisturbed run (greedy), zero failed; then it
  serves prefills (the only prefill worker left: the other was drained and exited); the
  refusals: no credential, an unknown worker or role, a role it has already, a
  single-role worker, the last routable decode worker without ``--force``; /metrics and the
  gated services follow the role.
- prefill -> decode with prompts on it (one held before its COMMIT by the test-only hold,
  tandem/worker/commit_hold.py, so the flip surely finds work there): the last prefill
  worker is refused without force, flips with it (a second flip meanwhile is refused by the
  router and by the worker; a prompt that arrives meanwhile is prefilled on the decode
  worker, the flipper taking none); every request completes (zero failed), then it serves
  decode (streams moved onto it equal their undisturbed runs).
Both end with every worker idle and every KV block free.

Ordering, forced: the decode workers (the flippable one too) run with the test-only step
hold (tandem/worker/step_hold.py, tests/chaos/step_holds.py): while the test holds it at
``k``, a worker takes no step once a request it runs has ``k`` output tokens. Every move and
flip of a stream is asked while the hold stands and the stream has its first token, so the
stream is surely mid-stream (at most ``k`` of its 320 tokens) when it moves; the hold is
lifted only after the reply.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from tandem.launcher.local_cluster import Cluster, Proc
from tandem.protos.v1 import tandem_pb2, tandem_pb2_grpc, worker_pb2, worker_pb2_grpc
from tandem.worker.commit_hold import ENV as HOLD_ENV
from tests import scrape
from tests.chaos.step_holds import K, hold_steps, holder, lift_steps, reached
from tests.chaos.test_live_migration import Run
from tests.integration.sdk_cluster import wait_until, worker_idle
from tests.integration.served_model import engine_flags, start_all, tiny_served_model

pytestmark = pytest.mark.slow

SHORT = tandem_pb2.SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
GREEDY = tandem_pb2.SamplingParams(max_tokens=320, temperature=0.0, ignore_eos=True)


def _flip(router: Proc, worker: str, to: int, force: bool = False
          ) -> worker_pb2.FlipWorkerResponse:
    with router.channel() as channel:
        return worker_pb2_grpc.RouterAdminStub(channel).FlipWorker(
            worker_pb2.FlipWorkerRequest(worker=worker, to=to, force=force), timeout=300)


def _refused(router: Proc, worker: str, to: int) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        _flip(router, worker, to)
    return info.value.code(), info.value.details()


def _move(router: Proc, worker: Proc) -> worker_pb2.MovedStreams:
    with router.channel() as channel:
        return worker_pb2_grpc.RouterAdminStub(channel).MoveStreams(
            worker_pb2.MoveStreamsRequest(worker=worker.grpc), timeout=300)


def _cli_flip(c: Cluster, router: Proc, worker: Proc, to: str) -> str:
    secret = c.credential_flags[c.credential_flags.index("--cluster-secret-file") + 1]
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli.main", "flip", worker.grpc, "--to", to,
         "--router", router.grpc, "--cluster-secret-file", secret],
        capture_output=True, text=True, timeout=300, check=True).stdout


def _router(c: Cluster, model: Path, prefill: list[Proc], decode: list[Proc]) -> Proc:
    return c.start(
        "tandem.router", "--port", "0", "--tokenizer", str(model), "--model-name", "tiny",
        "--prefill", ",".join(p.grpc for p in prefill),
        "--decode", ",".join(d.grpc for d in decode), "--placement", "remote")


def test_decode_flips_to_prefill_under_load(tiny_dir, smollm2_dir, steps: Path) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    flags = engine_flags(model)
    c = Cluster()
    try:
        flipper, other, prefill = start_all(
            c, ("tandem.worker.dual", "--role", "decode", "--port", "0", "--kv-port", "0",
                "--metrics-port", "0", *flags),
            ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *flags),
            ("tandem.worker.prefill", "--port", "0", *flags))
        router = _router(c, model, [prefill], [flipper, other])
        stub = tandem_pb2_grpc.TandemStub(grpc.insecure_channel(router.grpc))

        # Without the cluster credential's token: refused by the router and by the worker.
        with grpc.insecure_channel(router.grpc) as channel, pytest.raises(grpc.RpcError) as no:
            worker_pb2_grpc.RouterAdminStub(channel).FlipWorker(worker_pb2.FlipWorkerRequest(
                worker=flipper.grpc, to=worker_pb2.ROLE_PREFILL), timeout=30)
        assert no.value.code() is grpc.StatusCode.UNAUTHENTICATED
        with grpc.insecure_channel(flipper.grpc) as channel, pytest.raises(grpc.RpcError) as no:
            worker_pb2_grpc.WorkerControlStub(channel).Flip(
                worker_pb2.FlipRequest(to=worker_pb2.ROLE_PREFILL), timeout=30)
        assert no.value.code() is grpc.StatusCode.UNAUTHENTICATED
        code, why = _refused(router, "no-such-worker:1", worker_pb2.ROLE_PREFILL)
        assert code is grpc.StatusCode.NOT_FOUND, why
        code, why = _refused(router, flipper.grpc, worker_pb2.ROLE_UNSPECIFIED)
        assert code is grpc.StatusCode.INVALID_ARGUMENT, why
        code, why = _refused(router, flipper.grpc, worker_pb2.ROLE_DECODE)
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "already" in why, why
        code, why = _refused(router, other.grpc, worker_pb2.ROLE_PREFILL)  # single-role
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "tandem.worker.dual" in why

        texts = [f"Flip {i}: the lighthouse keeper counted" for i in range(3)]
        expected = [Run(stub, t, GREEDY).start().result() for t in texts]
        hold_steps(steps)  # each stream stops at its first token or its K-th, until lifted
        runs = [Run(stub, t, GREEDY).start() for t in texts]
        assert all(r.first.wait(120) for r in runs)
        # Whatever placement put on the other worker moves to the flipper: it holds them all.
        gather = _move(router, other)
        assert gather.stayed == 0

        def gaps_seen() -> scrape.Samples:  # each moved stream's gap: at its next token
            return scrape.parse(scrape.fetch(router.info["http"]))

        # One step more for every held worker (none had a stream past K): each moved stream
        # takes its next token, where its gap is seen, and stops again at K + 1 at most.
        hold_steps(steps, K + 1)
        wait_until(lambda: scrape.value(gaps_seen(), "tandem_live_migration_gap_seconds_count")
                   == gather.moved)
        gathered = gaps_seen()
        out = _cli_flip(c, router, flipper, "prefill")  # every stream mid-stream: held
        lift_steps(steps)
        assert f"{flipper.grpc} serves prefill" in out and f"{len(texts)} streams moved" in out
        assert [r.result() for r in runs] == expected  # zero failed, nothing changed
        roles = {dict(labels).get("role") for _, labels in scrape.parse(
            scrape.fetch(flipper.info["metrics"]))} - {None}
        assert roles == {"prefill"}  # /metrics follows the role
        with flipper.channel() as channel, pytest.raises(grpc.RpcError) as gated:
            worker_pb2_grpc.DecodeServiceStub(channel).Stats(worker_pb2.StatsRequest(),
                                                             timeout=30)
        assert gated.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "serves prefill now" in gated.value.details()
        code, why = _refused(router, other.grpc, worker_pb2.ROLE_PREFILL)
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "last routable" in why, why

        # The plain prefill worker leaves: the flipped one is the only prefill worker.
        with router.channel() as channel:
            worker_pb2_grpc.RouterAdminStub(channel).DrainWorker(
                worker_pb2.DrainWorkerRequest(worker=prefill.grpc), timeout=300)
        assert prefill.popen.wait(timeout=120) == 0
        text = "A prompt the flipped worker prefills"
        assert Run(stub, text, SHORT).start().result()[2] == "length"
        wait_until(lambda: scrape.value(gaps_seen(), "tandem_live_migration_gap_seconds_count")
                   == gather.moved + len(texts))
        samples = gaps_seen()
        assert scrape.value(samples, "tandem_live_migrations_total", cause="flip",
                            outcome="moved") == len(texts)
        assert scrape.value(samples, "tandem_migrations_total") == 0  # nothing re-prefilled
        gaps, gap_s = (scrape.value(samples, f"tandem_live_migration_gap_seconds_{k}")
                       - scrape.value(gathered, f"tandem_live_migration_gap_seconds_{k}")
                       for k in ("count", "sum"))
        print(f"\nmean client-visible gap of the {gaps:.0f} streams a flip moved: "
              f"{gap_s / gaps:.4f} s (the test's hold until the flip's reply included)")
        wait_until(lambda: worker_idle(other, "decode"))
        wait_until(lambda: worker_idle(flipper, "prefill"))
    finally:
        c.stop()


def test_prefill_flips_to_decode_with_prompts_on_it(tiny_dir, smollm2_dir, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    steps: Path) -> None:
    model = tiny_served_model(tiny_dir, smollm2_dir)
    flags = engine_flags(model)
    hold = tmp_path / "hold"
    hold.mkdir()
    monkeypatch.setenv(HOLD_ENV, str(hold))  # read by the workers; no hold file: no pause
    c = Cluster()
    try:
        flipper, decode = start_all(
            c, ("tandem.worker.dual", "--role", "prefill", "--port", "0", "--kv-port", "0",
                *flags),
            ("tandem.worker.decode", "--port", "0", "--kv-port", "0", *flags))
        router = _router(c, model, [flipper], [decode])
        stub = tandem_pb2_grpc.TandemStub(grpc.insecure_channel(router.grpc))
        texts = [f"Queued {i}: the harbour master wrote" for i in range(3)]
        expected = [Run(stub, t, GREEDY).start().result() for t in texts]

        (hold / "hold").touch()  # the next prefill's COMMIT waits: the flip finds it there
        runs = [Run(stub, texts[0], GREEDY).start()]
        wait_until(lambda: (hold / "held").exists(), timeout=120)
        # Another prompt prefilled by the flipper beside the held one (only the first COMMIT
        # waits), its stream on the decode worker before the flip.
        runs.append(Run(stub, texts[1], GREEDY).start())
        assert runs[1].first.wait(120)
        code, why = _refused(router, flipper.grpc, worker_pb2.ROLE_DECODE)
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "last routable" in why, why
        replies: list[worker_pb2.FlipWorkerResponse] = []
        flip = threading.Thread(target=lambda: replies.append(
            _flip(router, flipper.grpc, worker_pb2.ROLE_DECODE, force=True)))
        flip.start()
        try:  # the flip waits for the held prefill: a second flip meanwhile is refused
            wait_until(lambda: _refused(router, flipper.grpc, worker_pb2.ROLE_DECODE)[1]
                       .endswith("is in progress"), timeout=120)
            # by the worker too, asked directly once the router's call is there (its own
            # guard, not only the router's)
            wait_until(lambda: any("flip to decode asked for" in line
                                   for line in list(flipper.log)), timeout=120)
            with flipper.channel() as channel, pytest.raises(grpc.RpcError) as again:
                worker_pb2_grpc.WorkerControlStub(channel).Flip(
                    worker_pb2.FlipRequest(to=worker_pb2.ROLE_DECODE), timeout=30)
            assert again.value.code() is grpc.StatusCode.FAILED_PRECONDITION
            assert "in progress" in again.value.details()
            # A prompt arriving mid-flip: the router sends the flipper none (it was taken
            # out of the prefill pool before the worker was asked), the decode worker
            # prefills it itself.
            runs.append(Run(stub, texts[2], GREEDY).start())
            assert runs[2].first.wait(120)
        finally:
            (hold / "release").touch()
            flip.join(timeout=300)
        (reply,) = replies
        assert reply.moved.moved == reply.moved.stayed == 0
        assert [r.result() for r in runs] == expected  # zero failed, nothing changed
        assert scrape.value(scrape.parse(scrape.fetch(router.info["http"])),
                            "tandem_handoff_fallbacks_total",
                            kind="local_prefill_colocated") == 1

        # It decodes now: streams prefilled on a decode worker (no prefill worker left),
        # each moved onto it live (off it first where placement put it there) while held
        # mid-stream, each finishing there unchanged. One at a time: a decode worker's own
        # prefill is a step, which the hold would keep from a second stream beside a held one.
        for text, want in zip(texts, expected, strict=True):
            wait_until(lambda: all(worker_idle(w, "decode") for w in (flipper, decode)))
            hold_steps(steps)
            run = Run(stub, text, GREEDY).start()
            reached(run.tokens)
            if holder(flipper, decode) is flipper:
                assert _move(router, flipper).moved == 1
            onto = _move(router, decode)
            lift_steps(steps)
            assert (onto.moved, onto.stayed) == (1, 0), onto.reasons
            assert run.result() == want
        wait_until(lambda: all(worker_idle(w, "decode") for w in (flipper, decode)))
    finally:
        c.stop()
