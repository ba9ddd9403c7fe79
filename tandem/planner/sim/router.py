"""The simulated router: admission FIFO, then tandem/router/handoff/ledger.py's order per request.

    waiting (FIFO: the head waits until a decode worker has room for it)
      -> policy.rank_decode  -> Reserve on the first with room (cached prefix reused)
      -> policy.rank_prefill -> cost_model.decide (or "remote": CONFIGURED)
      -> remote: the prefill worker's queue; KV pushed to D (prefix delta), first token
         at prefill end + transfer latency         | local: D's local prefill queue
      -> D streams the rest                        | D dies: migrate (prompt + tokens sent)

The policies and the placement model are the router's own functions, imported; this module
only builds their inputs (tandem/planner/sim/index.py says which workers it hands them) and acts on
their answers. PrefillOverheads learns each worker's extra seconds as the ledger does, and
LinkEstimates each pair's exposed push time (placing.py).

A push on a link of ``B`` bytes/s and latency ``l`` (the prefill profile's ``transfer``, or
``tandem plan --link-gbps/--link-rtt-ms``) takes ``l + bytes / B`` after the prefill ends;
the decode worker starts the request when it lands, and the first token reaches the router
``l`` after the prefill. (The real prefill worker answers after its COMMIT's ACK, so there
the first token waits for the push, less what the last step's compute hid: a slow link
costs the simulated requests TPOT where it costs the real ones TTFT. Pushes on one link do
not slow each other here.)

A role flip takes a decode worker out of the pool alive (:meth:`move_streams`): the
requests whose KV it holds whole move by live migration (reserve on another decode worker,
the KV of prompt + tokens sent it lacks over the same link model, the stream goes on from
its next token: no recompute) when ``ClusterSpec.live_migration``, the others (and all of
them without it) as a dead worker's do: re-prefill prompt + tokens sent. Planned moves do
not count against ``max_migrations``.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from tandem.placement import cost_model, policy
from tandem.placement.cost_model import Decision, Reason
from tandem.placement.worker_view import WorkerView
from tandem.planner.profile import Transfer
from tandem.planner.sim.cluster import ClusterSpec
from tandem.planner.sim.decode import DecodeWorker
from tandem.planner.sim.events import EventQueue
from tandem.planner.sim.index import (
    LoadIndex,
    all_decode,
    all_prefill,
    decode_candidates,
    decode_key,
)
from tandem.planner.sim.placing import Placer
from tandem.planner.sim.prefill import PrefillWorker
from tandem.planner.sim.request import SimRequest
from tandem.planner.sim.tallies import RouterTallies

# tandem_disagg_decision_total's labels of every (decision, reason)
_LABELS = {(d, r): (d.value, r.value) for d in Decision for r in Reason}


class SimRouter:
    """Places requests on the simulated pools and hears back from the workers."""

    def __init__(self, cluster: ClusterSpec, events: EventQueue, block_size: int,
                 full_rank: bool = False, request_overhead_s: float = 0.0,
                 link: Transfer | None = None, kv_bytes_per_token: int = 0) -> None:
        """``link`` and ``kv_bytes_per_token``: what a live migration between decode
        workers moves KV over, and how much (None: streams move by re-prefill only)."""
        self._cluster = cluster
        self._link = link
        self._kv_bytes = kv_bytes_per_token
        self._request_overhead = request_overhead_s  # serving's extra on a first token
        self._events = events
        self._bs = block_size
        self._full = full_rank
        self._adaptive = cluster.placement == "adaptive"
        self._local_only = cluster.placement == "local"
        self.decode: list[DecodeWorker] = []  # every worker ever started, by index
        self.prefill: list[PrefillWorker] = []
        self._dmap: dict[str, DecodeWorker] = {}
        self._pmap: dict[str, PrefillWorker] = {}
        self._dindex = LoadIndex()
        self._pindex = LoadIndex()
        self.holders: dict[int, set[DecodeWorker]] = {}  # prefix group -> decode workers
        self._affinity: dict[int, tuple[PrefillWorker, int]] = {}  # group -> (owner, blocks)
        self._placer = Placer(cluster, self._pmap, block_size, full_rank)
        self._waiting: deque[SimRequest] = deque()
        self.max_blocks = 0  # the largest decode worker's blocks: longer requests can't run
        self.decisions: Counter[tuple[str, str]] = Counter()
        self.migrations = self.prefill_retries = self.local_fallbacks = 0
        self.prefill_timeouts = 0  # remote prefills whose push missed transfer_timeout_s
        self.live_migrations = 0  # streams moved with their KV (role flips)
        self.migrated_bytes = 0  # ... and the KV bytes they moved
        self.on_left: Callable[[DecodeWorker | PrefillWorker], None] | None = None
        self.tallies = RouterTallies()  # what the real router's /metrics would show

    # -- pool membership -------------------------------------------------------------------

    def add_worker(self, worker: DecodeWorker | PrefillWorker) -> None:
        """A started worker (not routable until :meth:`join`)."""
        if isinstance(worker, DecodeWorker):
            self.decode.append(worker)
            self._dmap[worker.endpoint] = worker
            self.max_blocks = max(self.max_blocks, worker.blocks.num_blocks)
        else:
            self.prefill.append(worker)
            self._pmap[worker.endpoint] = worker

    def join(self, worker: DecodeWorker | PrefillWorker) -> None:
        """``worker`` is up: it takes work from now on."""
        worker.routable = True
        if isinstance(worker, DecodeWorker):
            self._dindex.put(worker, decode_key(worker))
            self._pump()
        else:
            self._pindex.put(worker, (worker.depth, worker.index))

    def drain(self, worker: DecodeWorker | PrefillWorker) -> None:
        """``worker`` takes no new work and leaves once what it has is done."""
        worker.routable, worker.draining = False, True
        if isinstance(worker, DecodeWorker):
            self._dindex.drop(worker)
            worker.blocks.forget_all()
            if not worker.requests:
                self._left(worker)
        else:
            self._pindex.drop(worker)
            if worker.depth == 0:
                self._left(worker)

    def _left(self, worker: DecodeWorker | PrefillWorker) -> None:
        """A draining ``worker`` is empty: it leaves (``on_left`` hears of it)."""
        worker.draining = False
        if self.on_left is not None:
            self.on_left(worker)

    def move_streams(self, worker: DecodeWorker) -> None:
        """``worker`` leaves the decode pool now, alive (see the module docstring)."""
        now = self._events.now
        self._dindex.drop(worker)
        lost, done, whole = worker.evict(now)
        self._orphaned(lost, done)
        live = self._cluster.live_migration and self._link is not None
        for req in lost:
            req.carry_kv = live and req.index in whole
            if req.sent > 0:
                req.leg_token_s = now  # its last token here: the stream's gap starts now
        self._waiting.extendleft(reversed(lost))
        self._pump()

    def _orphaned(self, lost: list[SimRequest], done: list[SimRequest]) -> None:
        """A decode worker left holding these: each of ``done`` is complete; each of
        ``lost`` starts a new leg (its queue entries and KV in flight go stale), its prefill
        job cancelled and its reservation gone, one more migration."""
        for req in done:
            req.completed, req.leg = True, req.leg + 1
        for req in lost:
            req.leg += 1  # stale: its queue entries and KV in flight
            if (p := req.job_p) is not None:
                p.cancel(req)
                self._touch_p(p)
            req.decode, req.private_blocks, req.pinned = None, 0, False
            req.migrations += 1
            self.migrations += 1

    def endpoint(self, endpoint: str) -> DecodeWorker | PrefillWorker | None:
        """The worker at ``endpoint`` (None: no such worker)."""
        return self._dmap.get(endpoint) or self._pmap.get(endpoint)

    def kill(self, worker: DecodeWorker | PrefillWorker) -> None:
        """``worker`` dies now: prefills are retried, decode legs migrate."""
        if worker.dead:
            return
        now = self._events.now
        worker.draining = False
        if isinstance(worker, PrefillWorker):
            self._pindex.drop(worker)
            for req in worker.kill():
                self._prefill_failed(req, now)
            return
        self._dindex.drop(worker)
        lost, done = worker.kill(now)
        self._orphaned(lost, done)
        moving = []
        for req in lost:
            if req.migrations > self._cluster.max_migrations:
                req.failed = "migrations"
                continue
            moving.append(req)
        self._waiting.extendleft(reversed(moving))
        self._pump()

    # -- requests ------------------------------------------------------------------------

    def arrive(self, req: SimRequest) -> None:
        """A new request at the front door."""
        if req.need_blocks > self.max_blocks:
            req.failed = "too_long"  # no decode worker could ever reserve it
            return
        self.tallies.prompt_tokens += req.prompt
        self.tallies.admitted += 1
        self._waiting.append(req)
        if len(self._waiting) == 1:
            self._pump()

    def waiting(self) -> int:
        """Requests queued at the router."""
        return len(self._waiting)

    def _pump(self) -> None:
        waiting = self._waiting
        while waiting and self._dispatch(waiting[0]):
            waiting.popleft()

    def _dispatch(self, req: SimRequest) -> bool:
        """Reserve, rank, place one request; False when no decode worker has room."""
        req.tokens = req.prompt + req.sent
        holders = self.holders.get(req.group) if req.group >= 0 else None
        pool, matched = (all_decode(self._dindex, self.decode, holders, req) if self._full
                         else decode_candidates(self._dindex, self.decode, holders, req,
                                                self._cluster.decode_affinity_slack))
        if not pool:
            return False
        chosen = self._reserve(req, pool, matched)
        if chosen is None and not self._full:  # a pinned prefix cost the room: ask everyone
            pool, matched = all_decode(self._dindex, self.decode, holders, req)
            chosen = self._reserve(req, pool, matched)
        if chosen is None:
            return False
        d, dview = chosen
        self._dindex.put(d, decode_key(d))
        req.dispatch_s = self._events.now
        if req.carry_kv:
            self._carry(req)
        else:
            self._place(req, d, dview)
        return True

    def _carry(self, req: SimRequest) -> None:
        """A live migration's second half: the KV the new reservation lacks crosses the
        link, then the stream joins the new worker's batch (no prefill)."""
        assert self._link is not None
        req.carry_kv = False
        moved = (req.tokens - req.d_cached) * self._kv_bytes
        self.live_migrations += 1
        self.migrated_bytes += moved
        req.pushed_bytes += moved
        self._events.push(self._events.now + self._link.seconds(moved), self._kv_arrived,
                          req, req.leg)

    def _reserve(self, req: SimRequest, pool: list[DecodeWorker], matched: dict[str, int]
                 ) -> tuple[DecodeWorker, WorkerView] | None:
        """Reserve on the first of rank_decode's order that accepts (ledger._reserve)."""
        if len(pool) == 1:  # rank_decode of one worker is that worker
            d = pool[0]
            view = d.view()
            return (d, view) if d.reserve(req, matched.get(d.endpoint, 0)) else None
        views = [d.view() for d in pool]
        ranked = policy.rank_decode(views, req.prompt + req.output, self._bs, (), matched,
                                    self._cluster.decode_affinity_slack)
        for view in ranked:
            d = self._dmap[view.endpoint]
            if d.reserve(req, matched.get(view.endpoint, 0)):
                return d, view
        return None

    def log_placements(self, log: list[dict[str, Any]] | None, clock: Callable[[], float]
                       ) -> None:
        """Append a placement record per model decision to ``log`` (None: none), stamped
        with ``clock()``."""
        self._placer.log, self._placer.clock = log, clock

    def _place(self, req: SimRequest, d: DecodeWorker, dview: WorkerView) -> None:
        """ledger.Handoff._prefill for a leg reserved on ``d``: decide, then send."""
        placed = self._placer.place(req, dview, self._rank_prefill(req), self._events.now)
        req.local_predicted_s = -1.0  # a leg before this one (migrated) may have left one
        key = _LABELS[placed.decision, placed.reason]
        self.decisions[key] += 1
        if not req.decision:
            req.decision, req.reason = key
        if placed.decision is Decision.LOCAL:
            if self._adaptive and placed.predicted is not None:
                req.local_predicted_s = placed.predicted.compute_s
            d.add_local(req, self._events.now)
        else:
            self._send(req, self._pmap[placed.endpoint], dview)

    def _rank_prefill(self, req: SimRequest) -> list[WorkerView]:
        if self._local_only or not self._pindex.keys:
            return []
        owners: list[tuple[str, int]] = []
        owner = None
        entry = self._affinity.get(req.group) if req.group >= 0 else None
        if entry is not None and entry[0].routable:
            owner = entry[0]
            depth = min(entry[1], min(req.prefix, req.tokens - 1) // self._bs)
            if depth > 0:
                owners = [(owner.endpoint, depth)]
        if self._full:
            views = [p.view() for p in all_prefill(self._pindex, self.prefill)]
        else:
            prefill = self.prefill
            views = [prefill[key[1]].view()
                     for key in self._pindex.keys[:cost_model.MAX_CANDIDATES]]
            if owner is not None and owner.key > self._pindex.keys[len(views) - 1]:
                views.append(owner.view())  # not among the least loaded
        return policy.rank_prefill(views, owners, self._cluster.affinity_max_queue)

    def _send(self, req: SimRequest, p: PrefillWorker, dview: WorkerView) -> None:
        req.p_attempts += 1
        req.prefill_endpoint = p.endpoint
        if self._adaptive:  # what PrefillOverheads compares the measured time against
            req.predicted_s = self._placer.predicted(req, p, dview, self._events.now)
        p.enqueue(req, self._events.now)
        self._touch_p(p)

    def _prefill_failed(self, req: SimRequest, now: float, failed: str = "") -> None:
        """Its prefill worker died, or (``failed``, still up) ran out of transfer time: the
        next one (a fresh leg on the same reservation, as Handoff._renew does), then local
        prefill on the decode worker."""
        self.prefill_retries += 1
        req.leg += 1
        d = req.decode
        assert d is not None
        if req.p_attempts < self._cluster.prefill_attempts:
            ranked = [v for v in self._rank_prefill(req) if v.endpoint != failed]
            if ranked:
                self._send(req, self._pmap[ranked[0].endpoint], d.view())
                return
        self.local_fallbacks += 1
        d.add_local(req, now)

    # -- what the workers report --------------------------------------------------------

    def first_token(self, req: SimRequest, at_s: float) -> None:
        """A leg's first token reached the router at ``at_s``."""
        if req.local_predicted_s >= 0:  # a placed local prefill: what it took, as the ledger
            assert req.decode is not None
            self._placer.learn(req.decode.endpoint, req, at_s - req.dispatch_s,
                               req.local_predicted_s, at_s)
            req.local_predicted_s = -1.0
        if req.sent == 0:
            req.first_token_s = at_s + self._request_overhead
            self.tallies.ttft.observe(req.first_token_s - req.arrival_s)
        self.tallies.first_tokens += 1
        req.sent += 1
        req.leg_token_s = at_s

    def prefill_done(self, req: SimRequest, worker: PrefillWorker, at_s: float) -> None:
        """The prompt is computed: first token to the client, KV (prefix delta) to D; or,
        when the push would end past the transfer timeout, the attempt fails then."""
        self._touch_p(worker)
        transfer = worker.transfer
        pushed = (req.tokens - req.d_cached) * worker.kv_bytes
        deadline = req.job_queued_s + self._cluster.transfer_timeout_s
        push_s = transfer.seconds(pushed)
        if at_s + push_s > deadline:
            self.prefill_timeouts += 1
            self._events.push(max(at_s, deadline), self._timed_out, req, (req.leg, worker))
            return
        at_router = at_s + transfer.latency_s
        self.first_token(req, at_router)
        req.pushed_bytes += pushed
        bs = self._bs
        if req.prefix >= bs:
            self._affinity[req.group] = (worker, req.prefix // bs)
        if req.next_group >= 0:
            self._affinity[req.next_group] = (worker, min(req.next_prefix, req.prompt) // bs)
        if self._adaptive:
            self._placer.learn(worker.endpoint, req, at_router - req.dispatch_s,
                               req.predicted_s, at_router)
            assert req.decode is not None
            self._placer.learn_link(worker.endpoint, req.decode.endpoint, pushed, push_s,
                                    at_router)
        self._events.push(at_s + push_s, self._kv_arrived, req, req.leg)

    def _timed_out(self, req: SimRequest, attempt: tuple[int, PrefillWorker]) -> None:
        leg, worker = attempt
        if req.leg == leg and req.decode is not None:
            self._prefill_failed(req, self._events.now, worker.endpoint)

    def _kv_arrived(self, req: SimRequest, leg: int) -> None:
        if req.leg != leg:
            return  # the decode worker died meanwhile: the request moved on
        d = req.decode
        assert d is not None
        if req.sent >= req.output:
            self.finished(req, d, req.leg_token_s)
        else:
            d.add_ready(req, self._events.now)

    def finished(self, req: SimRequest, worker: DecodeWorker, at_s: float) -> None:
        """``req`` sent its last token: free its reservation, maybe admit the next."""
        req.finish_s, req.completed = at_s, True
        self.tallies.finished += 1
        self.tallies.finished_tokens += req.output
        if req.output > 1:
            self.tallies.tpot.observe((at_s - req.first_token_s) / (req.output - 1))
        worker.release(req)
        self._touch_d(worker)
        if self._waiting and worker.routable:
            head = self._waiting[0]
            cap = min(head.prefix, head.prompt + head.sent - 1) // self._bs
            if worker.blocks.free + max(cap, 0) >= head.need_blocks:
                self._pump()

    def _touch_d(self, d: DecodeWorker) -> None:
        if d.routable:
            self._dindex.put(d, decode_key(d))
        elif d.draining and not d.requests:
            self._left(d)  # drained: it leaves

    def _touch_p(self, p: PrefillWorker) -> None:
        if p.routable:
            self._pindex.put(p, (p.depth, p.index))
        elif p.draining and p.depth == 0:
            self._left(p)  # drained: it leaves
