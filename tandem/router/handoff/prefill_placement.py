"""Where a leg's prompt is prefilled, from what the router knows: the inputs
cost_model.decide takes, and what a finished prefill teaches it.

    cached_tokens   prompt tokens each worker holds already (the decode worker's Reserve
                    answer; prefill workers: the affinity map or their reports)
    place           "remote" as configured, else cost_model.decide with the decode worker's
                    view, the SLO, the overheads learnt (faded to now), each candidate's push
                    priced on its link to the decode worker (measured, or the prior), the
                    threshold
    predict_remote  the remote prediction for a prefill worker the decision did not pick (a
                    retry after the chosen one failed)
    learn_overhead  a finished prefill's measured time beyond the model's prediction (remote
                    on a prefill worker, or local on the decode worker)
    learn_link      a finished remote prefill's push: its bytes and the seconds the call took
                    beyond the prefill worker's own time to its first token (link.py)

tandem/router/handoff/ledger.py calls these per leg; tandem/planner/sim/placing.py does the same over the
simulated pools.
"""

from __future__ import annotations

import dataclasses
import time

from tandem.placement import cost_model, policy
from tandem.placement.cost_model import Decision, Placement, Prediction, Reason
from tandem.placement.link import LinkEstimates, kv_bytes_per_token
from tandem.placement.log import PlacementLog, placement_record
from tandem.placement.overheads import PrefillOverheads
from tandem.placement.slo import Slo
from tandem.placement.worker_view import Role, WorkerView
from tandem.router.config import RouterConfig
from tandem.router.handoff.held_blocks import HeldBlocks
from tandem.router.handoff.leg_types import Reservation
from tandem.router.membership.registry import Registry


def cached_tokens(block_size: int, held: HeldBlocks, owners: list[tuple[str, int]],
                  prefill: list[WorkerView], hashes: list[int], decode_endpoint: str,
                  decode_cached: int) -> dict[str, int]:
    """Prompt tokens each worker holds already: the decode worker's reservation says exactly
    (``decode_cached``); for prefill workers, the affinity map (``owners``: endpoint, depth
    in blocks) or their reports, whichever says more."""
    cached = {endpoint: depth * block_size for endpoint, depth in owners}
    for w in prefill:
        cached[w.endpoint] = max(cached.get(w.endpoint, 0), held.matched(w, hashes) * block_size)
    cached[decode_endpoint] = decode_cached
    return cached


def push_bytes(reservation: Reservation, n_tokens: int) -> int:
    """KV bytes a remote prefill of ``n_tokens`` pushes into ``reservation`` (the tokens
    after its ``skip_tokens``: the decode worker lacks or, behind a sliding window, never
    reads them), at the bytes per token its layout states: a latent cache's one
    plane, int8's scales; counted from the shape, K and V, when it states none; 0: it
    reported no layout)."""
    lo = reservation.layout
    if lo is None:
        return 0
    per_token = lo.bytes_per_token or kv_bytes_per_token(
        lo.num_layers, lo.num_kv_heads, lo.head_dim, lo.dtype)
    return max(n_tokens - reservation.skip_tokens, 0) * per_token


def place(config: RouterConfig, registry: Registry, overheads: PrefillOverheads, n_tokens: int,
          decode_endpoint: str, ranked: list[WorkerView], cached: dict[str, int],
          log: PlacementLog | None = None, links: LinkEstimates | None = None,
          pushed_bytes: int = 0) -> Placement:
    """Where this prompt of ``n_tokens`` is prefilled (tandem/placement/cost_model.py); ``log``
    (``--placement-log``) gets the decision with its inputs. ``links`` prices each
    candidate's push of ``pushed_bytes`` (``push_bytes``) to the decode worker."""
    if ranked and config.placement == "remote" and config.local_prefill_threshold == 0:
        return Placement(Decision.REMOTE, Reason.CONFIGURED, ranked[0].endpoint)
    decode = registry.view(decode_endpoint) or WorkerView(decode_endpoint, Role.DECODE)
    # The router's count of D's streams already includes this request (acquired with its
    # reservation); the model adds the new request's row itself.
    decode = dataclasses.replace(decode, active=max(decode.active - 1, 0))
    pushed = policy.blocks_needed(n_tokens - cached.get(decode_endpoint, 0), config.block_size)
    now = time.monotonic()
    overhead_s = overheads.current(pushed, now)
    link_s = ({} if links is None or pushed_bytes <= 0 else
              {p.endpoint: links.seconds(p.endpoint, decode_endpoint, pushed_bytes, now)
               for p in ranked[:cost_model.MAX_CANDIDATES]})
    placed = cost_model.decide(
        n_tokens, decode, ranked, Slo(config.slo_ttft_s, config.slo_tpot_s),
        cached=cached, overhead_s=overhead_s, threshold=config.local_prefill_threshold,
        link_s=link_s,
    )
    if log is not None:
        log.write(placement_record(time.time(), n_tokens, decode, ranked, cached, overhead_s,
                                   placed, link_s))
    return placed


def predict_remote(registry: Registry, worker: WorkerView, decode_endpoint: str, new: int,
                   links: LinkEstimates | None = None, pushed_bytes: int = 0
                   ) -> Prediction | None:
    """The model's remote prediction for ``new`` uncached tokens on ``worker`` now, its push
    of ``pushed_bytes`` priced by ``links``, without an overhead (for an attempt the decision
    did not weigh); None without fitted costs."""
    decode = registry.view(decode_endpoint)
    if decode is None:
        return None
    link_s = (0.0 if links is None or pushed_bytes <= 0 else
              links.seconds(worker.endpoint, decode_endpoint, pushed_bytes, time.monotonic()))
    return cost_model.predict_remote(worker, decode, new, link_s=link_s)


def learn_overhead(overheads: PrefillOverheads, predicted: Prediction | None, blocks: int,
                   measured_s: float) -> None:
    """What a prefill predicted as ``predicted`` (at its decision: remote on a prefill
    worker, or local on the decode worker) took beyond the model's compute part;
    ``blocks``: the prompt's KV blocks the decode worker lacked. The overhead is what
    neither the compute nor the link term (``learn_link``'s) explains."""
    if predicted is not None:
        overheads.observe(predicted.endpoint, measured_s, predicted.modelled_s, blocks,
                          time.monotonic())


def learn_link(links: LinkEstimates, prefill_endpoint: str, decode_endpoint: str,
               pushed_bytes: int, call_s: float, prefill_s: float) -> None:
    """A remote prefill that pushed ``pushed_bytes`` to ``decode_endpoint``: its Prefill call
    took ``call_s`` (the router's clock) of which ``prefill_s`` (the worker's, arrival to
    first token) was queueing and compute; the rest is what the push and its round trips
    added, the pair's exposed link cost."""
    links.observe(prefill_endpoint, decode_endpoint, pushed_bytes, call_s - prefill_s,
                  time.monotonic())
