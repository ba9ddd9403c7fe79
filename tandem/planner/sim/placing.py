"""One leg's placement: tandem/router/handoff/prefill_placement.py's ``place`` over the simulated pools.

The inputs are built as the ledger builds them: ``cached`` (the decode worker's Reserve
answer, each prefill candidate's cached prefix), the overheads PrefillOverheads has learnt
for a prompt of the blocks D lacks (each prefill worker's remote prefills, the decode
worker's local ones), the fixed threshold; then cost_model.decide (or
"remote": CONFIGURED) answers. Each candidate's push is priced on its link to the decode
worker as the router prices it (tandem/placement/link.py: the prefill profile's ``transfer``
as the prior, each pair learnt from its simulated pushes).

Two shortcuts keep a request's cost flat in the pool size, both exact:

- One PrefillOverheads per worker: ``current()`` maps every worker it has seen, and
  a request needs only its candidates' figures (each worker's fit is its own either way);
  LinkEstimates answers per pair the same way;
  a worker's figure for a push size is kept until its next observation changes the fit
  (faded to the request's time on each use).
- decide weighs its first MAX_CANDIDATES prefill workers. predict_remote's TTFT only grows
  with queued + new tokens, the overhead and the worker's reported step base and per-token
  cost (one chunk budget for all: simulate takes one prefill profile), so a candidate that
  an earlier one matches or beats on all four can be neither the fastest remote option
  (decide's pick inside the targets: the first of the lowest TTFT) nor the first whose TTFT
  is under the decode gap's share of the targets (its pick outside them: the first of the
  smallest miss); it is left out. (With the profile's costs, signals="profile", the last two
  are the same for every worker.)

``full=True`` (simulate's ``full_rank``) skips both, for the tests to compare.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tandem.placement import cost_model
from tandem.placement.cost_model import Decision, Placement, Reason
from tandem.placement.link import LinkEstimates, LinkPrior
from tandem.placement.log import placement_record
from tandem.placement.overheads import PrefillOverheads
from tandem.placement.policy import blocks_needed
from tandem.placement.worker_view import WorkerView
from tandem.planner.sim.cluster import ClusterSpec
from tandem.planner.sim.prefill import PrefillWorker
from tandem.planner.sim.request import SimRequest


class Placer:
    """Decides where each leg's prompt is prefilled, and learns the overheads."""

    def __init__(self, cluster: ClusterSpec, prefill: Mapping[str, PrefillWorker],
                 block_size: int, full: bool = False) -> None:
        self._cluster = cluster
        self._prefill = prefill
        self._bs = block_size
        self._full = full
        self._remote = cluster.placement == "remote" and cluster.local_prefill_threshold == 0
        self._shared = PrefillOverheads()  # full mode: the ledger's single instance
        self._local: dict[str, PrefillOverheads] = {}  # per decode worker, its local prefills
        # Per prefill worker: its prefix cache's entries, its current(pushed) by pushed
        # blocks until its next observation (None: nothing observed), its own fit.
        self._table: dict[str, list[Any]] = {}
        # The router's --placement-log, simulated: a record per decision of the adaptive
        # path (tandem/placement/log.py; the threshold, colocated and full-rank
        # paths are not logged), stamped with ``clock()`` (simulated seconds).
        self.log: list[dict[str, Any]] | None = None
        self.clock: Callable[[], float] = lambda: 0.0
        self._links: LinkEstimates | None = None  # made at the first prefill worker's sight

    def links(self, endpoint: str) -> LinkEstimates:
        """The pairs' link estimates, their prior the prefill profile's ``transfer`` (one
        profile for the whole prefill pool: ``endpoint`` is any of its workers)."""
        if self._links is None:
            t = self._prefill[endpoint].transfer
            self._links = LinkEstimates(LinkPrior(t.bandwidth_bytes_per_s * 8 / 1e9,
                                                  t.latency_s))
        return self._links

    def push_bytes(self, req: SimRequest, endpoint: str) -> int:
        """KV bytes a remote prefill of ``req`` on ``endpoint`` pushes to its decode worker."""
        return (req.tokens - req.d_cached) * self._prefill[endpoint].kv_bytes

    def place(self, req: SimRequest, dview: WorkerView, ranked: Sequence[WorkerView],
              now: float) -> Placement:
        """Where ``req``'s leg, reserved on ``dview``'s worker, is prefilled at ``now``
        (simulated seconds: the learnt overheads fade with it, as the ledger's do)."""
        cluster = self._cluster
        if ranked and self._remote:
            return Placement(Decision.REMOTE, Reason.CONFIGURED, ranked[0].endpoint)
        if not ranked or cluster.local_prefill_threshold > 0:
            return cost_model.decide(req.tokens, dview, ranked, cluster.slo,
                                     threshold=cluster.local_prefill_threshold)
        tokens, pushed = req.tokens, blocks_needed(req.tokens - req.d_cached, self._bs)
        cached = {dview.endpoint: req.d_cached}
        head = ranked[:cost_model.MAX_CANDIDATES]
        links = self.links(head[0].endpoint)
        nbytes = self.push_bytes(req, head[0].endpoint)
        d_end = dview.endpoint
        if self._full:
            if req.group >= 0:
                for view in head:
                    held = self._prefill[view.endpoint].cached_tokens(req)
                    if held:
                        cached[view.endpoint] = held
            link_s = {v.endpoint: links.seconds(v.endpoint, d_end, nbytes, now) for v in head}
            return cost_model.decide(tokens, dview, ranked, cluster.slo, cached=cached,
                                     overhead_s=self._shared.current(pushed, now),
                                     link_s=link_s)
        # The candidates' inputs, and those no earlier candidate matches on both queued
        # work and overhead (see the module docstring).
        overhead: dict[str, float] = {}
        link: dict[str, float] = {}
        kept: list[WorkerView] = []
        marks: list[tuple[int, float, float, float]] = []
        table, bs = self._table, self._bs
        group = req.group
        cap = req.prefix if req.prefix < tokens else tokens - 1  # PrefillWorker.cached_tokens
        cap -= cap % bs
        for view in head:
            endpoint = view.endpoint
            info = table.get(endpoint) or self._info(endpoint)
            new = tokens
            if group >= 0:
                blocks = info[0].get(group)
                if blocks:
                    held = blocks * bs if blocks * bs < cap else cap
                    if held:
                        cached[endpoint] = held
                        new = tokens - held
            extra = 0.0
            memo = info[1]
            if memo is not None:
                extra = memo.get(pushed, -1.0)
                if extra == -1.0:
                    extra = memo[pushed] = info[2].current(pushed)[endpoint]
                extra *= info[2].fading(endpoint, now)
                overhead[endpoint] = extra
                if extra < 0.0:
                    extra = 0.0
            wire = link[endpoint] = links.seconds(endpoint, d_end, nbytes, now)
            extra += wire
            work = view.queued_prefill_tokens + (new if new > 1 else 1)
            base = view.step_base_s if view.step_base_s is not None else -1.0
            per_token = (view.step_per_prefill_token_s
                         if view.step_per_prefill_token_s is not None else -1.0)
            for w, e, b, t in marks:
                if w <= work and e <= extra and 0.0 <= b <= base and 0.0 <= t <= per_token:
                    break
            else:
                kept.append(view)
                marks.append((work, extra, base, per_token))
        local = self._local.get(dview.endpoint)
        if local is not None:
            overhead[dview.endpoint] = local.current(pushed, now)[dview.endpoint]
        placed = cost_model.decide(tokens, dview, kept, cluster.slo, cached=cached,
                                   overhead_s=overhead, link_s=link)
        if self.log is not None:
            self.log.append(placement_record(self.clock(), tokens, dview, kept, cached,
                                             overhead, placed, link))
        return placed

    def predicted(self, req: SimRequest, p: PrefillWorker, dview: WorkerView, now: float
                  ) -> float:
        """predict_remote's TTFT on ``p``, its push priced on the link to ``dview``'s worker
        (compute plus link: what the measured time is compared against)."""
        new = max(req.tokens - p.cached_tokens(req), 1)
        wire = self.links(p.endpoint).seconds(p.endpoint, dview.endpoint,
                                               self.push_bytes(req, p.endpoint), now)
        predicted = cost_model.predict_remote(p.view(), dview, new, link_s=wire)
        return predicted.ttft_s if predicted is not None else -1.0

    def learn_link(self, p: str, d: str, nbytes: int, seconds: float, now: float) -> None:
        """A push of ``nbytes`` from ``p`` to ``d`` that added ``seconds`` after the prefill
        (what the router measures: prefill_placement.learn_link)."""
        self.links(p).observe(p, d, nbytes, seconds, now)

    def learn(self, endpoint: str, req: SimRequest, measured_s: float, predicted_s: float,
              now: float) -> None:
        """Fold one prefill's measured time, ended at ``now``, into ``endpoint``'s overhead
        fit: a remote one on a prefill worker, or a local one on the decode worker
        (``predicted_s``: the model's compute part at the decision; < 0: nothing to learn)."""
        if predicted_s < 0:
            return
        pushed = blocks_needed(req.tokens - req.d_cached, self._bs)
        if self._full:
            self._shared.observe(endpoint, measured_s, predicted_s, pushed, now)
            return
        if endpoint not in self._prefill:  # a decode worker's local prefill
            fit = self._local.get(endpoint)
            if fit is None:
                fit = self._local[endpoint] = PrefillOverheads()
            fit.observe(endpoint, measured_s, predicted_s, pushed, now)
            return
        info = self._table.get(endpoint) or self._info(endpoint)
        info[2].observe(endpoint, measured_s, predicted_s, pushed, now)
        info[1] = {}

    def _info(self, endpoint: str) -> list[Any]:
        info = self._table[endpoint] = [self._prefill[endpoint].cache.entries, None,
                                        PrefillOverheads()]
        return info
