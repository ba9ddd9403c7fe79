"""Run a trace through a simulated cluster: ``simulate`` and the SLO ``attainment_curve``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from tandem.placement.policy import blocks_needed
from tandem.placement.slo import Slo
from tandem.placement.worker_view import Role
from tandem.planner.profile import Profile
from tandem.planner.sim.cluster import ClusterSpec, Event
from tandem.planner.sim.events import EventQueue
from tandem.planner.sim.lifecycle import Pools
from tandem.planner.sim.request import SimRequest
from tandem.planner.sim.results import RequestOutcome, SimResult
from tandem.planner.sim.router import SimRouter
from tandem.planner.trace import TraceRequest
from tandem.planner.workload import rescale, summarize


def _requests(trace: Sequence[TraceRequest], block_size: int) -> list[SimRequest]:
    """The trace as simulator requests, in trace order, each conversation turn told which
    group and how many tokens the next turn will read from it."""
    reqs = [SimRequest(i, r.arrival_s, r.prompt_tokens, r.output_tokens, r.prefix_group,
                       r.prefix_tokens if r.prefix_group >= 0 else 0,
                       blocks_needed(r.prompt_tokens + r.output_tokens, block_size))
            for i, r in enumerate(trace)]
    last_turn: dict[int, SimRequest] = {}
    for i in sorted(range(len(trace)), key=lambda i: trace[i].arrival_s):
        conversation = trace[i].conversation
        if conversation < 0:
            continue
        before = last_turn.get(conversation)
        if before is not None and reqs[i].group >= 0:
            before.next_group, before.next_prefix = reqs[i].group, reqs[i].prefix
        last_turn[conversation] = reqs[i]
    return reqs


def _outcome(r: SimRequest) -> RequestOutcome:
    done = r.completed
    tpot = ((r.finish_s - r.first_token_s) / (r.output - 1) if r.output > 1 else 0.0) \
        if done else math.nan
    return RequestOutcome(
        r.index, r.arrival_s, r.prompt, r.output, r.first_token_s - r.arrival_s, tpot,
        r.itl_max_s, r.finish_s - r.arrival_s if done else math.nan, r.decision, r.reason,
        r.prefill_endpoint, r.decode_endpoint, r.pushed_bytes, r.migrations, done, r.failed)


def simulate(cluster: ClusterSpec, profile: Profile, trace: Sequence[TraceRequest], *,
             prefill_profile: Profile | None = None, events: Sequence[Event] = (),
             exact_steps: bool = False, full_rank: bool = False,
             on_tick: Callable[[float, SimRouter, Pools], None] | None = None,
             tick_s: float = 0.0, placement_log: list[dict[str, Any]] | None = None
             ) -> SimResult:
    """Serve ``trace`` on ``cluster`` (decode workers on ``profile``, prefill workers on
    ``prefill_profile`` or the same) with ``events`` applied at their times.

    ``exact_steps`` wakes decode workers every step instead of at batch changes, and
    ``full_rank`` hands the router's policies every worker instead of the candidates that
    can win: both are slow references for the tests, with the same results.

    ``placement_log``: gets a record per decision the placement model made (the router's
    ``--placement-log`` records, tandem/placement/log.py; time in simulated seconds).

    ``on_tick(now, router, pools)`` (with ``tick_s`` > 0) is called at 0, ``tick_s``,
    ``2 tick_s``, ... while arrivals or events are pending: a controller's hook that reads
    the workers and may apply events at once (``pools.apply(Scale(now, ...))``).
    """
    started = time.perf_counter()
    p_profile = prefill_profile or profile
    if p_profile.block_size != profile.block_size:
        raise ValueError("prefill and decode profiles must share a block size")
    queue = EventQueue()
    router = SimRouter(cluster, queue, profile.block_size, full_rank,
                       request_overhead_s=profile.serving_request_s, link=profile.transfer,
                       kv_bytes_per_token=profile.kv_bytes_per_token)
    router.log_placements(placement_log, lambda: queue.now)
    pools = Pools(router, queue, profile, p_profile, exact_steps, cluster.host_sharing,
                  fitted=cluster.signals == "fitted",
                  report_interval_s=cluster.report_interval_s)
    for _ in range(cluster.prefill_workers):
        pools.start(Role.PREFILL, 0.0)
    for _ in range(cluster.decode_workers):
        pools.start(Role.DECODE, 0.0)
    for event in sorted(events, key=lambda e: e.at_s):
        queue.push(event.at_s, pools.apply, event)
    reqs = _requests(trace, profile.block_size)
    order = sorted(reqs, key=lambda r: r.arrival_s)
    if on_tick is not None:
        if not tick_s > 0:
            raise ValueError("tick_s must be > 0 with on_tick")
        last_arrival = order[-1].arrival_s if order else 0.0

        def tick(_a: object, _b: object) -> None:
            on_tick(queue.now, router, pools)
            if len(queue) > 0 or queue.now <= last_arrival:
                queue.push(queue.now + tick_s, tick)

        queue.push(0.0, tick)

    queue.run([r.arrival_s for r in order], lambda i: router.arrive(order[i]))
    leaked = sum(d.blocks.leaked() + len(d.requests) for d in router.decode if not d.dead)
    span = queue.now if queue.now > 0 else 1.0
    p_busy = sum(p.busy_s for p in router.prefill)
    d_busy = sum(d.busy_s for d in router.decode)
    d_steps = sum(d.steps for d in router.decode)
    return SimResult(
        outcomes=[_outcome(r) for r in reqs], decisions=dict(router.decisions),
        leaked_blocks=leaked, wall_s=time.perf_counter() - started, simulated_s=queue.now,
        events=queue.handled, migrations=router.migrations,
        prefill_retries=router.prefill_retries, local_fallbacks=router.local_fallbacks,
        prefill_timeouts=router.prefill_timeouts,
        stranded=router.waiting(),
        live_migrations=router.live_migrations, migrated_bytes=router.migrated_bytes,
        prefill_busy=p_busy / (span * len(router.prefill)) if router.prefill else 0.0,
        decode_busy=d_busy / (span * len(router.decode)) if router.decode else 0.0,
        decode_mean_rows=sum(d.row_s for d in router.decode) / d_busy if d_busy else 0.0,
        decode_mean_step_s=d_busy / d_steps if d_steps else 0.0,
        decode_rows_per_step=sum(d.row_steps for d in router.decode) / d_steps if d_steps
        else 0.0)


def attainment_curve(cluster: ClusterSpec, profile: Profile, base_trace: Sequence[TraceRequest],
                     rates: Sequence[float], slo: Slo, *, prefill_profile: Profile | None = None,
                     warmup_s: float = 0.0) -> list[tuple[float, float]]:
    """SLO attainment at each of ``rates`` (requests/s): the same requests in the same
    order, their arrival times scaled by tandem.planner.workload.rescale (``warmup_s``, in the base
    trace's seconds, is scaled along)."""
    base_rate = summarize(base_trace).rate
    curve = []
    for rate in rates:
        trace = rescale(base_trace, rate)
        result = simulate(cluster, profile, trace, prefill_profile=prefill_profile)
        curve.append((rate, result.summary(slo, warmup_s * base_rate / rate).slo_attainment))
    return curve
