"""A discrete-event simulator of a Tandem cluster: router, prefill and decode pools, KV
transfer, failures and scale events, at 1,000 workers on a laptop.

A request's life is a chain of queues (each module opens with its own part)::

    router    waiting (FIFO)  -> rank_decode -> Reserve on D -> rank_prefill -> decide
    prefill   P's FIFO -> chunked steps -> last chunk: first token (+ transfer latency at
              the router), KV of the blocks D lacks pushed (transfer.seconds)
    decode    reserved -> KV in (or local chunked prefill) -> ready -> running row, one
              token a step -> released (its prefix stays cached) -> the router's next

The router's own pure code places every request: tandem/placement/policy.py (rank_decode,
rank_prefill), tandem/placement/cost_model.py (decide, predict_remote) and
tandem/placement/overheads.py (PrefillOverheads) over tandem/placement/worker_view.py snapshots,
in tandem/router/handoff/ledger.py's order.

Exact shortcuts keep 1,000 workers fast; each has a slow reference the tests compare with:

- Decode workers step in closed form between batch changes (decode.py, steps.py);
  ``simulate(exact_steps=True)`` steps one at a time.
- The policies see the workers that can come first, from pools kept sorted by their own
  keys (index.py); decide sees the prefill candidates an earlier one does not beat on
  both queued work and overhead, and PrefillOverheads is kept per worker (placing.py);
  rank_decode is not asked to order a single candidate. ``simulate(full_rank=True)``
  hands them every worker, as the ledger does.

Simplifications (what the real system does that this does not):

- Worker stats are exact and current (no heartbeat lag), but for the prompt tokens queued
  on a worker: the router reads those from its last report (every
  ``ClusterSpec.report_interval_s``, 2 s: the health probe's Stats) or its own count,
  whichever is larger (reports.py), as the real router does. The step costs a worker reports
  are its own online fit of the steps it ran (tandem/common/step_costs.py, as a real worker's;
  warm-up steps from its profile to start: signals.py), or with
  ``ClusterSpec(signals="profile")`` the profile's exact costs. A prefill worker's cached
  prefix is known exactly (the router's affinity map and held-block reports are hints).
- TTFT: remote = the last chunk's end + transfer latency; local = the last chunk's end.
- Prefix caches are per prefix group (tandem/planner/trace.py), not per block hash: a request
  reuses ``min(cached, its prefix_tokens)`` of its group, and a conversation's turn caches
  what the next turn of it shares. Prefix affinity keeps one owner per group, unbounded.
- A prefill worker's KV for prompts in flight is not counted against its cache; the push
  overlaps the prefill and cannot fail once the last chunk ended.
- Failures: a dead prefill worker's jobs go to the best prefill worker ranked anew
  (the ledger uses its original ranking) up to ``prefill_attempts``, then local; a
  retried prefill restarts from scratch. So does a remote prefill whose push would end
  past ``transfer_timeout_s`` after it reached the prefill worker (the worker answers
  RESOURCE_EXHAUSTED at that deadline or at the prefill's end, whichever is later), on
  another prefill worker than the one that timed out. A decode worker's death migrates its
  requests to the router queue's front: reserve elsewhere, prefill prompt + tokens sent.
- Role flips (``RoleFlip``, or the autoscaler's flips in tandem/planner/autoscale.py): the
  worker leaves its pool and joins the other ``flip_s`` after it is empty, its weights
  loaded (one GPU set throughout). A prefill worker finishes its queued prompts first; a
  decode worker's streams move at once, by live migration (their KV over the transfer
  link model, less the target's cached prefix) or, with ``live_migration`` off and for
  requests whose KV it did not hold whole yet, by re-prefill. Not with host sharing.
- Decode: a row joins at the first step boundary after its KV lands; ``max_num_seqs``
  caps decode rows only (local prefill jobs ride along whatever the cap). A drained
  worker finishes its requests (no migration). Arrival times are open loop, even for
  conversation turns (the trace's estimate, not the simulated reply's end).
- Requests needing more KV than a decode worker has are refused at once ("too_long").
- Hardware is each worker's own, unless ``ClusterSpec.host_sharing`` pairs the i-th prefill
  and decode workers on one host (host.py): two slowdown factors, each applied while the
  peer computes; nothing else on a host (a router, a load client) takes its cores.

Exports: :func:`simulate`, :func:`attainment_curve`, :class:`ClusterSpec`,
:class:`Failure`, :class:`Scale`, :class:`RoleFlip`, :class:`HostSharing`, :class:`SimResult`,
:class:`RequestOutcome`, :class:`Summary`, :func:`percentile`.
"""

from tandem.planner.sim.cluster import ClusterError, ClusterSpec, Failure, RoleFlip, Scale
from tandem.planner.sim.host import HostSharing
from tandem.planner.sim.results import RequestOutcome, SimResult, Summary, percentile
from tandem.planner.sim.simulate import attainment_curve, simulate

__all__ = [
    "ClusterError",
    "ClusterSpec",
    "Failure",
    "HostSharing",
    "RequestOutcome",
    "RoleFlip",
    "Scale",
    "SimResult",
    "Summary",
    "attainment_curve",
    "percentile",
    "simulate",
]
