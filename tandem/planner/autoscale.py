"""The autoscaler's own policies, run inside the cluster simulator (tandem/planner/sim).

    every interval_s (simulate's on_tick hook):
      simulated workers ──WorkerSample each──> Snapshot(t)
      pools.size() ──> current ──autoscaler.Autoscaler.plan──> Decision per role (+ flips)
      each flip: pools.flip(worker, flip_s)  (the simulator can flip: with flip.enabled)
      a count changed beyond the flips: pools.apply(Scale(t, role, desired, startup_s))

This is tandem/autoscaler/controller.py's ``Controller.step`` with the RPCs replaced by reads of the
simulator's state: the window, the policies and the stabilizer are the autoscaler's,
imported (``tandem.autoscaler.autoscaler.Autoscaler`` chains them exactly as the live loop does), so
a policy's behaviour on a trace is the one it has in a cluster, up to the samples below.

What a simulated worker reports (the figures the Stats RPC and the worker's latency window
give a live one):

- prefill: ``num_running`` 1 while stepping, ``num_waiting`` the rest of its live jobs,
  ``queued_prompt_tokens`` the prompt tokens still to compute, ``leased_blocks`` their KV
  blocks (a live worker leases its pushes' destination blocks for each Prefill call in
  progress), ``ttft_p90_s`` the p90 (nearest rank) of its prefills' queue-to-done seconds
  that ended in the last ``window_s``, ``prompt_tokens_total`` the prompt tokens of every
  prefill done; step costs: the profile's base and per-token cost, the latter plus the
  attention of the prompts done in the window (per_prefill_pair x (mean prompt + 1) / 2),
  what the engine's online linear fit converges to on that mix;
- decode: ``num_running`` its batch rows, ``num_waiting`` its other reservations,
  ``kv_cache_usage`` 1 - free / blocks (evictable blocks are free, as the engine counts),
  ``itl_mean_s`` the running step's length (None with no rows), ``output_tokens_total``
  the tokens its batch produced (running rows counted to the last step ended); step costs:
  the profile's base, and per row its per-row cost plus the rows' mean context's KV read
  (per_context_token x context / rows), as an online fit over the current batch gives.

The router (``Snapshot.router``) reports what its /metrics would: cumulative TTFT and
per-request TPOT histograms in the router's buckets (tandem/placement/slo.py), requests
admitted and finished, prompt tokens admitted, tokens streamed (legs' first tokens plus every
decode worker's, gone ones at their last count), requests waiting in its FIFO.

Starting workers are not scraped (a live one does not answer yet); draining ones are, as
live ones are. New workers join ``startup_s`` after the decision; removed ones drain: the
decision's victims (tandem/autoscaler/drains.py) after any still starting, as the Ray pool does.

GPU-seconds integrate each worker from its start (0 or the decision that added it) to its
end: the decision that cancelled it while starting, the later of the decision that drained
it and its last request's end, or the end of the run, times its profile's
``gpus_per_worker``. A flipped worker's GPUs are one worker's throughout: its old role's
span ends at the flip decision and its new role's starts there (its queued prefills or
moving streams, and the flip time, count in the new role's span).

Exports: :func:`simulate_autoscaled`, :class:`AutoscaledResult`, :class:`ScaleRecord`,
:class:`FlipRecord`,
:func:`compare_policies`, :class:`PolicyRow`, :func:`policy_row`, :func:`format_rows`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from tandem.autoscaler.autoscaler import Autoscaler
from tandem.autoscaler.config import AutoscaleConfig
from tandem.autoscaler.decision import Decision
from tandem.autoscaler.flips import Flip
from tandem.autoscaler.metrics import RouterSample, Snapshot, WorkerSample
from tandem.autoscaler.roles import ROLES, RoleName
from tandem.placement.slo import Slo
from tandem.placement.worker_view import Role
from tandem.planner.profile import Profile
from tandem.planner.sim.cluster import ClusterSpec, Scale
from tandem.planner.sim.decode import DecodeWorker
from tandem.planner.sim.lifecycle import Pools
from tandem.planner.sim.prefill import PrefillWorker
from tandem.planner.sim.results import SimResult, percentile
from tandem.planner.sim.router import SimRouter
from tandem.planner.sim.simulate import simulate
from tandem.planner.trace import TraceRequest

_ROLE: dict[RoleName, Role] = {"prefill": Role.PREFILL, "decode": Role.DECODE}


@dataclass(frozen=True, slots=True)
class ScaleRecord:
    """One decision that changed a pool: at ``t`` ``role`` went ``old`` -> ``new``."""

    t: float
    role: RoleName
    old: int
    new: int
    reason: str


@dataclass(frozen=True, slots=True)
class FlipRecord:
    """One role flip: at ``t`` ``worker`` left ``source`` for ``target`` (as ``joined``)
    by ``move`` (tandem/autoscaler/flips.py: "grow" or "swap")."""

    t: float
    worker: str
    source: RoleName
    target: RoleName
    joined: str  # the endpoint it serves under in its new pool
    move: str


@dataclass(slots=True)
class AutoscaledResult:
    """One autoscaled run: the simulation, the pool changes and what the pools cost."""

    sim: SimResult
    scale_events: list[ScaleRecord]
    gpu_seconds: dict[RoleName, float]  # per role: workers alive (starting, serving,
    # draining) x their GPUs, integrated over the run
    decisions: int = 0  # decisions taken (one per role per tick), changed or not
    peak: dict[RoleName, int] = field(default_factory=dict)  # the largest pool size decided
    # every worker's (role, start, end): the GPU-seconds' terms, for a held-over-time plot
    spans: list[tuple[RoleName, float, float]] = field(default_factory=list)
    flips: list[FlipRecord] = field(default_factory=list)

    def held(self, role: RoleName, t: float) -> int:
        """Workers of ``role`` alive (starting, serving or draining) at ``t``."""
        return sum(1 for r, start, end in self.spans if r == role and start <= t < end)

    @property
    def gpu_hours(self) -> float:
        """GPU-hours of both roles together."""
        return sum(self.gpu_seconds.values()) / 3600.0


@dataclass(slots=True)
class _Life:
    """When one worker started and when it was removed (None: kept to the end)."""

    worker: PrefillWorker | DecodeWorker
    start_s: float
    removed_s: float | None = None
    joined: bool = True  # False: cancelled before it joined
    flipped: bool = False  # removed by a flip: its GPUs go on in its successor's life


class _SimController:
    """Controller.step over the simulator's state (the ``on_tick`` hook)."""

    def __init__(self, config: AutoscaleConfig, startup_s: float, flip_s: float) -> None:
        self.autoscaler = Autoscaler(config)
        self.window_s = config.window_s
        self.startup_s = startup_s
        self.flip_s = flip_s
        self.can_flip = config.flip.enabled
        self.records: list[ScaleRecord] = []
        self.flips: list[FlipRecord] = []
        self.lives: dict[RoleName, dict[int, _Life]] = {"prefill": {}, "decode": {}}
        self.decisions = 0
        self.peak: dict[RoleName, int] = {}
        self._prompt_seen: dict[int, tuple[int, int]] = {}  # prefill index -> (log pos, sum)
        self._streamed: dict[int, int] = {}  # decode index -> tokens, as last counted

    def __call__(self, now: float, router: SimRouter, pools: Pools) -> None:
        if not self.lives["prefill"] and not self.lives["decode"]:  # the first tick: t = 0
            for role in ROLES:
                for w in pools.members(_ROLE[role]):
                    self.lives[role][w.index] = _Life(w, 0.0)
        snap = Snapshot(now, tuple(self._samples(now, router)), self._router(now, router))
        current: dict[RoleName, int] = {role: pools.size(_ROLE[role]) for role in ROLES}
        for role in ROLES:
            self.peak.setdefault(role, current[role])
        plan = self.autoscaler.plan(snap, current, can_flip=self.can_flip)
        self.decisions += len(plan.decisions)
        for f in plan.flips:
            self._flip(now, f, router, pools)
        for d in plan.decisions:
            if d.changed or d.scales:
                self._scale(now, d, pools)

    def _flip(self, now: float, f: Flip, router: SimRouter, pools: Pools) -> None:
        worker = router.endpoint(f.worker)
        assert worker is not None and worker.routable, f.worker
        new = pools.flip(worker, self.flip_s)
        life = self.lives[f.source][worker.index]
        life.removed_s, life.flipped = now, True
        self.lives[f.target][new.index] = _Life(new, now)
        self.flips.append(FlipRecord(now, f.worker, f.source, f.target, new.endpoint, f.move))

    def _scale(self, now: float, d: Decision, pools: Pools) -> None:
        role = _ROLE[d.role]
        lives = self.lives[d.role]
        serving = {w.index: w.routable for w in pools.members(role)}  # False: starting
        if d.scales:
            pools.apply(Scale(now, role, d.desired, self.startup_s, d.victims))
        after = pools.members(role)
        for w in after:
            if w.index not in lives:
                lives[w.index] = _Life(w, now)
        for index in set(serving) - {w.index for w in after}:
            life = lives[index]
            life.removed_s, life.joined = now, serving[index]
        if d.changed:
            self.records.append(ScaleRecord(now, d.role, d.current, d.desired, d.reason))
            self.peak[d.role] = max(self.peak.get(d.role, 0), d.desired)

    def _samples(self, now: float, router: SimRouter) -> list[WorkerSample]:
        samples: list[WorkerSample] = []
        horizon = now - self.window_s
        for p in router.prefill:
            if p.dead or not (p.routable or p.draining):
                continue
            log = p.done_log
            recent: list[float] = []
            prompts = 0
            for i in range(len(log) - 1, -1, -1):
                end, seconds, tokens = log[i]
                if end < horizon:
                    break
                recent.append(seconds)
                prompts += tokens
            pos, total = self._prompt_seen.get(p.index, (0, 0))
            total += sum(tokens for _, _, tokens in log[pos:])
            self._prompt_seen[p.index] = (len(log), total)
            running = 1 if p.busy and p.depth > 0 else 0
            step = p.profile.step
            mean_prompt = prompts / len(recent) if recent else 0.0
            samples.append(WorkerSample(
                role="prefill", worker_id=p.endpoint, num_running=running,
                num_waiting=p.depth - running, draining=p.draining,
                queued_prompt_tokens=p.queued_tokens,
                ttft_p90_s=percentile(recent, 90) if recent else None,
                prompt_tokens_total=total,
                leased_blocks=-(-p.queued_tokens // p.block_size) if p.depth else 0,
                step_base_s=step.base_s + p.profile.serving_step_s,
                step_per_prefill_token_s=(step.per_prefill_token_s
                                          + step.per_prefill_pair_s * (mean_prompt + 1) / 2),
                max_batched_tokens=p.profile.chunk_tokens))
        for d in router.decode:
            if d.dead or not (d.routable or d.draining):
                continue
            blocks = d.blocks
            usage = 1.0 - blocks.free / blocks.num_blocks if blocks.num_blocks else 0.0
            step = d.profile.step
            context = d.context_tokens / d.rows if d.rows else 0.0
            streamed = self._streamed[d.index] = d.tokens_streamed(now)
            samples.append(WorkerSample(
                role="decode", worker_id=d.endpoint, num_running=d.rows,
                num_waiting=len(d.requests) - d.rows, kv_cache_usage=usage,
                draining=d.draining, itl_mean_s=d.token_gap_s(),
                output_tokens_total=streamed,
                step_base_s=step.base_s + d.profile.serving_step_s,
                step_per_row_s=step.per_row_s + step.per_context_token_s * context,
                step_per_prefill_token_s=step.per_prefill_token_s,
                max_batched_tokens=d.profile.chunk_tokens))
        return samples

    def _router(self, now: float, router: SimRouter) -> RouterSample:
        """The router's figures: its tallies, and the decode workers' streamed tokens (a
        gone worker's at its last count: _samples keeps them)."""
        t = router.tallies
        return RouterSample(
            ttft=t.ttft.cumulative(), tpot=t.tpot.cumulative(),
            prompt_tokens_total=float(t.prompt_tokens),
            output_tokens_total=float(t.first_tokens + sum(self._streamed.values())),
            admitted_total=float(t.admitted), finished_total=float(t.finished),
            finished_tokens_total=float(t.finished_tokens),
            waiting=float(router.waiting()),
            running=float(sum(len(d.requests) for d in router.decode if not d.dead)))


def _last_work(result: SimResult) -> dict[str, float]:
    """Per endpoint, the latest moment it did work for a request (prefill done, last token)."""
    last: dict[str, float] = {}
    for o in result.outcomes:
        if o.completed and o.decode_endpoint:
            end = o.arrival_s + o.e2e_s
            if end > last.get(o.decode_endpoint, -math.inf):
                last[o.decode_endpoint] = end
    return last


def _spans(control: _SimController, result: SimResult) -> list[tuple[RoleName, float, float]]:
    """(role, start, end) of every worker (see the module docstring for the end)."""
    end_of_run = result.simulated_s
    last = _last_work(result)
    spans: list[tuple[RoleName, float, float]] = []
    for role in ROLES:
        for life in control.lives[role].values():
            end = end_of_run
            if life.removed_s is not None:
                end = life.removed_s
                w = life.worker
                if life.joined and not life.flipped:
                    if isinstance(w, PrefillWorker):
                        work = w.done_log[-1][0] if w.done_log else -math.inf
                    else:
                        work = last.get(w.endpoint, -math.inf)
                    end = max(end, min(work, end_of_run))
            spans.append((role, life.start_s, end))
    return spans


def simulate_autoscaled(cluster: ClusterSpec, profile: Profile, trace: Sequence[TraceRequest],
                        config: AutoscaleConfig, *, prefill_profile: Profile | None = None,
                        interval_s: float | None = None, startup_s: float = 60.0,
                        flip_s: float | None = None) -> AutoscaledResult:
    """Serve ``trace`` on ``cluster``, its pools sized by ``config``'s policy every
    ``interval_s`` (default ``config.interval_s``) from t = 0; added workers join after
    ``startup_s``, flipped ones ``flip_s`` (default ``config.flip.flip_s``) after they are
    empty (flips only with ``config.flip.enabled``). The cluster's counts are the pools'
    sizes at t = 0."""
    interval = config.interval_s if interval_s is None else interval_s
    flip = config.flip.flip_s if flip_s is None else flip_s
    if not interval > 0 or startup_s < 0 or flip < 0:
        raise ValueError("interval_s must be > 0, startup_s and flip_s >= 0")
    control = _SimController(config, startup_s, flip)
    result = simulate(cluster, profile, trace, prefill_profile=prefill_profile,
                      on_tick=control, tick_s=interval)
    p_profile = prefill_profile or profile
    gpus: dict[RoleName, int] = {"prefill": p_profile.gpus_per_worker,
                                 "decode": profile.gpus_per_worker}
    spans = _spans(control, result)
    gpu_seconds: dict[RoleName, float] = {
        role: sum(end - start for r, start, end in spans if r == role) * gpus[role]
        for role in ROLES}
    return AutoscaledResult(result, control.records, gpu_seconds, control.decisions,
                            dict(control.peak), spans, control.flips)


@dataclass(frozen=True, slots=True)
class PolicyRow:
    """One policy's run in :func:`compare_policies`."""

    policy: str
    attainment: float
    gpu_hours: float
    scale_events: int
    ttft_p90_s: float
    tpot_p90_s: float
    completed: int
    requests: int
    peak_prefill: int
    peak_decode: int
    wall_s: float


def compare_policies(cluster: ClusterSpec, profile: Profile, trace: Sequence[TraceRequest],
                     config: AutoscaleConfig, *, policies: Sequence[str] = ("fixed", "queue",
                                                                            "slo"),
                     prefill_profile: Profile | None = None, interval_s: float | None = None,
                     startup_s: float = 60.0, slo: Slo | None = None
                     ) -> tuple[list[PolicyRow], str]:
    """Each of ``policies`` (``config`` with only ``policy`` changed) on the same trace and
    cluster: its rows and their text table. Attainment is against ``slo`` (default the
    cluster's)."""
    target = slo or cluster.slo
    rows = []
    for name in policies:
        run = simulate_autoscaled(cluster, profile, trace, dataclasses.replace(config, policy=name),
                                  prefill_profile=prefill_profile, interval_s=interval_s,
                                  startup_s=startup_s)
        rows.append(policy_row(name, run, target))
    return rows, format_rows(rows)


def policy_row(policy: str, run: AutoscaledResult, slo: Slo) -> PolicyRow:
    """One run's line of the comparison, attainment against ``slo``."""
    s = run.sim.summary(slo)
    return PolicyRow(policy, s.slo_attainment, run.gpu_hours, len(run.scale_events),
                     s.ttft_p90_s, s.tpot_p90_s, s.completed, s.requests,
                     run.peak.get("prefill", 0), run.peak.get("decode", 0), run.sim.wall_s)


def format_rows(rows: Sequence[PolicyRow]) -> str:
    """A fixed-width table of :func:`compare_policies` rows."""
    head = (f"{'policy':<8} {'attain':>7} {'GPU-h':>9} {'scales':>6} {'TTFT p90':>9} "
            f"{'TPOT p90':>9} {'done':>13} {'peak P':>6} {'peak D':>6} {'wall s':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.policy:<8} {r.attainment:>7.3f} {r.gpu_hours:>9.2f} {r.scale_events:>6d} "
            f"{r.ttft_p90_s:>8.3f}s {r.tpot_p90_s * 1e3:>7.1f}ms "
            f"{f'{r.completed}/{r.requests}':>13} {r.peak_prefill:>6d} {r.peak_decode:>6d} "
            f"{r.wall_s:>7.1f}")
    return "\n".join(lines)
