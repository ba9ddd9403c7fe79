"""A simulated decode worker: reservations, continuous batching, local (chunked) prefill.

A request's life here (tandem/worker/decode/ on a real one)::

    reserved (blocks held)  ->  KV pushed by a prefill worker  ->  ready  ->  running row
                            \\-> local queue: chunks ride along the decode steps -/
    running row: one token per step until ``output`` tokens in all  ->  released

Every step runs all rows (at most ``max_num_seqs``) plus up to ``chunk_tokens - rows``
tokens of local prefill and lasts ``step.step_s(rows, prefill, context, pairs)``, context =
the rows' lengths, pairs = the chunks' query-key pairs (tandem/planner/sim/prefill.py); a step with
prefill tokens, times the profile's ``serving_prompt_scale``. Rows join and leave at step
boundaries; a local prompt's first token comes at the end of its last chunk.

Macro steps: while neither a row's arrival, a finish nor local prefill work changes the
batch, the worker sleeps until its next finish (a heap of finish step numbers), the steps in
between summed in closed form (tandem/planner/sim/steps.py); a row arriving meanwhile wakes it at
the first step boundary after it. ``exact=True`` wakes it every step instead: the reference
the macro steps are tested against.

A step's local prefill chunks: tandem/planner/sim/chunk_plan.py; a row's longest token gap,
the longest step since it joined: tandem/planner/sim/step_gaps.py.

Its step-cost report (``view()``): the profile's costs, or with ``signals`` its own online fit
of the steps it ran (tandem/planner/sim/signals.py), as a real worker reports.

Host sharing (tandem/planner/sim/host.py): while the prefill worker sharing its host computes, every
step lasts ``HostSharing.decode_factor(rows)`` times its profile length; the peer's start or
stop is taken up at the next step boundary (the macro steps are cut there, like a row's
arrival), and a batch's new size at the boundary where it changes.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from tandem.placement.worker_view import Role, WorkerView
from tandem.planner.profile import Profile
from tandem.planner.sim.cache import DecodeBlocks
from tandem.planner.sim.chunk_plan import plan_chunks
from tandem.planner.sim.events import EventQueue
from tandem.planner.sim.host import HostPeer
from tandem.planner.sim.reports import ReportedQueue
from tandem.planner.sim.request import SimRequest
from tandem.planner.sim.signals import FittedSignals, reported_costs
from tandem.planner.sim.step_gaps import StepGaps
from tandem.planner.sim.steps import boundary_after, span, steps_by


def _unshared(rows: int) -> float:
    """The host factor of a worker that shares its host with no one."""
    return 1.0


class DecodeHooks(Protocol):
    """What the router hears from a decode worker: a local prefill's first token, and a
    request's last token (it is still reserved on ``worker`` then)."""

    def first_token(self, req: SimRequest, at_s: float) -> None: ...

    def finished(self, req: SimRequest, worker: DecodeWorker, at_s: float) -> None: ...


class DecodeWorker:
    """One decode worker (see the module docstring)."""

    __slots__ = ("index", "endpoint", "profile", "blocks", "requests", "_events", "_hooks",
                 "_exact", "_per_ctx", "_per_pair", "_shape",
                 "_prompt_scale", "_chunk", "_cap",
                 "block_size", "_rows", "rows", "_ctx", "_n0", "_t0", "ready", "_local",
                 "local_tokens", "_busy", "_version", "_wake_n", "_chunks", "_in_wake",
                 "_gaps", "_seq", "_chunk_step_s", "busy_s", "row_s",
                 "row_steps", "routable", "draining", "dead", "key", "streamed", "_join_sum",
                 "peer", "_host_slow", "_slow", "_peer_on", "signals", "_reports")

    def __init__(self, index: int, profile: Profile, events: EventQueue, hooks: DecodeHooks,
                 holders: dict[int, set[Any]], exact: bool = False,
                 signals: FittedSignals | None = None, report_interval_s: float = 0.0) -> None:
        self.index = index
        self.endpoint = f"d{index:05d}"
        self.profile = profile
        self.blocks = DecodeBlocks(profile.kv_capacity_blocks, profile.block_size, holders,
                                   self)
        self.requests: dict[int, SimRequest] = {}  # every request reserved here
        self._events = events
        self._hooks = hooks
        self._exact = exact
        step = profile.step
        self._per_ctx, self._per_pair = step.per_context_token_s, step.per_prefill_pair_s
        self._prompt_scale = profile.serving_prompt_scale  # a step with a prompt chunk
        self._shape = profile.served_shape_s  # the step before attention, served
        self._chunk, self._cap = profile.chunk_tokens, profile.max_num_seqs
        self.block_size = profile.block_size
        self._rows: list[tuple[int, int, SimRequest]] = []  # (finish step, seq, request)
        self.rows = 0  # R: rows running since step _n0
        self._ctx = 0  # C0: their context at step _n0
        self._n0 = 0  # the step number at the last boundary handled, and its time
        self._t0 = 0.0
        self.ready: deque[SimRequest] = deque()  # KV arrived, waiting for a row
        self._local: deque[SimRequest] = deque()  # local prefill jobs, FIFO
        self.local_tokens = 0
        self._busy = False
        self._version = 0
        self._wake_n = 0
        self._chunks: list[tuple[SimRequest, int]] | None = None  # a prefill step's chunks
        self._in_wake = False
        self._gaps = StepGaps()  # the longest step since any step: a row's worst gap
        self._seq = 0
        self._chunk_step_s = 0.0  # the running prefill step's length
        self.busy_s = 0.0  # seconds spent stepping, and rows x seconds (mean batch)
        self.row_s = 0.0
        self.row_steps = 0  # rows x steps (mean rows a step: over the steps run)
        self.routable = self.draining = self.dead = False
        self.key: tuple[int, ...] | None = None
        self.streamed = 0  # tokens the rows that left the batch produced here
        self._join_sum = 0  # the running rows' join steps, summed
        self.peer: HostPeer | None = None  # the prefill worker sharing its host (host.py)
        self._host_slow: Callable[[int], float] = _unshared  # rows -> factor, peer busy
        self._slow = 1.0  # the factor of the steps planned from the last boundary
        self._peer_on = False  # the peer computes (as of its last news)
        self.signals = signals  # its own step-cost fit (signals.py); None: the profile's
        self._reports = ReportedQueue(report_interval_s)  # local_tokens as reported

    # -- what the router sees and does -------------------------------------------------

    def view(self) -> WorkerView:
        """The load snapshot the router's policies read: its local prefill queue as the
        router knows it (the last report or the exact one, the larger:
        tandem/planner/sim/reports.py), the rest exact (the router's own count of its streams,
        ``active``, is what the placement takes over the reported rows)."""
        n = len(self.requests)
        base, per_row, per_token = reported_costs(self.profile, self.signals)
        return WorkerView(
            self.endpoint, Role.DECODE, num_running=self.rows, num_waiting=n - self.rows,
            num_free_blocks=self.blocks.free, num_blocks=self.blocks.num_blocks, active=n,
            step_base_s=base, step_per_row_s=per_row, step_per_prefill_token_s=per_token,
            queued_prefill_tokens=self._reports.seen(self.local_tokens, self._events.now),
            max_batched_tokens=self._chunk)

    def reserve(self, req: SimRequest, matched: int) -> bool:
        """Hold ``req``'s blocks, reusing ``matched`` cached prefix blocks (Reserve)."""
        new = req.need_blocks - matched
        if not self.blocks.reserve(req.group, matched, new):
            return False
        req.decode, req.d_cached = self, matched * self.block_size
        req.private_blocks, req.pinned = new, matched > 0
        req.decode_endpoint = self.endpoint
        self.requests[req.index] = req
        return True

    def release(self, req: SimRequest) -> None:
        """``req`` is done here: its prompt (and a conversation's reply) stays cached."""
        keep = ((req.group, req.prefix),
                (req.next_group, min(req.next_prefix, req.prompt + req.output)))
        self.blocks.release(req.group, req.pinned, req.private_blocks, keep)
        del self.requests[req.index]
        req.decode, req.private_blocks, req.pinned = None, 0, False

    def add_ready(self, req: SimRequest, at_s: float) -> None:
        """``req``'s KV is in: it joins the batch at the next step boundary with a free row."""
        self.ready.append(req)
        self._poke(at_s)

    def add_local(self, req: SimRequest, at_s: float) -> None:
        """Prefill ``req``'s leg here (PrefillLocal), from the prefix its Reserve reused."""
        req.job_done = req.d_cached
        self._local.append(req)
        self._reports.before_change(self.local_tokens, at_s)
        self.local_tokens += req.tokens - req.d_cached
        self._poke(at_s)

    def kill(self, at_s: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """The worker dies at ``at_s``: (requests to migrate, with ``sent`` counted to
        ``at_s``; requests whose last token was already out, with ``finish_s`` set)."""
        lost, done = self._stop(at_s)
        self.dead = True
        self.blocks.forget_all()
        return lost, done

    def evict(self, at_s: float) -> tuple[list[SimRequest], list[SimRequest], set[int]]:
        """The worker leaves the decode pool at ``at_s`` alive (a role flip): as ``kill``,
        plus which requests' KV it held whole (running rows and ready ones: what a live
        migration can move), every reservation released (its blocks freed: ``leaked()``
        is 0 after)."""
        whole = {req.index for req in self.ready} | {req.index for _, _, req in self._rows}
        held = list(self.requests.values())
        lost, done = self._stop(at_s)
        for req in held:
            self.blocks.release(req.group, req.pinned, req.private_blocks, ())
        self.blocks.forget_all()
        return lost, done, whole

    def _stop(self, at_s: float) -> tuple[list[SimRequest], list[SimRequest]]:
        """Stop stepping at ``at_s``: the tokens each request got by then, and the
        requests split into unfinished and finished; the worker holds none after."""
        k = 0
        if self._busy and self._chunks is None:
            k = steps_by(at_s - self._t0, *self._plain(), self._wake_n - self._n0)
        for finish, _, req in self._rows:
            before = req.sent
            req.sent += self._n0 + k - req.join_step
            if finish <= self._n0 + k:  # its last step ended at ``at_s`` exactly
                req.sent = req.output
                req.finish_s = self._t0 + self._span(finish - self._n0)
            self.streamed += req.sent - before
        self._join_sum = 0
        if k:  # the whole steps of the macro step in flight count as work done
            span_s = self._span(k)
            self.busy_s += span_s
            self.row_s += self.rows * span_s
            self.row_steps += self.rows * k
            self._n0 += k
        lost = [r for r in self.requests.values() if r.sent < r.output]
        done = [r for r in self.requests.values() if r.sent >= r.output]
        for req in done:  # a one-token request's only token is out: nothing to migrate
            if req.finish_s != req.finish_s:
                req.finish_s = req.leg_token_s
        was_busy = self._busy
        self.routable, self.draining, self._busy = False, False, False
        if was_busy and self.peer is not None:
            self.peer.peer_busy(False, at_s)
        self._version += 1
        self.requests.clear()
        self._rows.clear()
        self.ready.clear()
        self._local.clear()
        self._reports.before_change(self.local_tokens, at_s)
        self.local_tokens = self.rows = self._ctx = 0
        self._chunks = None
        return lost, done

    def tokens_streamed(self, at_s: float) -> int:
        """Tokens this worker's batch has produced by ``at_s`` (``at_s`` >= the last
        boundary handled): rows that left, plus the running rows' steps ended by then."""
        k = 0
        if self._busy and self._chunks is None and not self.dead:
            k = steps_by(at_s - self._t0, *self._plain(), self._wake_n - self._n0)
        return self.streamed + self.rows * (self._n0 + k) - self._join_sum

    @property
    def context_tokens(self) -> int:
        """KV positions the running rows attend to (as of the last step boundary)."""
        return self._ctx

    @property
    def steps(self) -> int:
        """Steps run so far (as of the last step boundary handled)."""
        return self._n0

    @property
    def stepping(self) -> bool:
        """Whether the worker is computing (rows or local prefill work)."""
        return self._busy

    def share_host(self, peer: HostPeer, slowdown: Callable[[int], float],
                   at_s: float) -> None:
        """From ``at_s`` on, ``peer`` (a prefill worker) shares this worker's host: a step
        of R rows lasts ``slowdown(R)`` times longer while ``peer`` computes."""
        self.peer, self._host_slow = peer, slowdown
        self.peer_busy(peer.stepping, at_s)

    def _factor(self) -> float:
        """The host factor for steps of the current batch from the next boundary on."""
        return self._host_slow(max(self.rows, 1)) if self._peer_on else 1.0

    def peer_busy(self, busy: bool, at_s: float) -> None:
        """The host's prefill worker started (``busy``) or stopped computing at ``at_s``:
        the steps from the next boundary on take the matching factor."""
        self._peer_on = busy
        if self.dead or not self._busy:
            return  # an idle worker plans its next steps with the news
        if self._exact or self._chunks is not None or self._in_wake:
            return  # the next wake takes it up
        if self._factor() == self._slow:
            return
        k = boundary_after(at_s - self._t0, *self._plain())
        if k is not None and self._n0 + k < self._wake_n:
            self._schedule(k, self._span(k))

    def _set_idle(self, at_s: float) -> None:
        was_busy, self._busy = self._busy, False
        if was_busy and self.peer is not None:
            self.peer.peer_busy(False, at_s)

    def token_gap_s(self) -> float | None:
        """The running step's length (the gap between a row's tokens); None: no rows."""
        if self.rows == 0:
            return None
        if self._chunks is not None:
            return self._chunk_step_s
        return self._plain()[0]

    # -- stepping ------------------------------------------------------------------------

    def _plain(self) -> tuple[float, float]:
        """The next plain step's length and how much each one after grows (steps.py)."""
        r, slow = self.rows, self._slow
        return slow * (self._shape(r, 0) + self._per_ctx * self._ctx), slow * self._per_ctx * r

    def _span(self, k: int) -> float:
        """Seconds of the next ``k`` plain decode steps from the last boundary."""
        return span(k, *self._plain())

    def _poke(self, at_s: float) -> None:
        if self._in_wake or self.dead:
            return  # the boundary being handled plans with the new work
        if not self._busy:
            self._t0 = at_s
            self._in_wake = True
            self._admit_and_plan(self._n0, at_s)
            self._in_wake = False
            return
        if self._exact or self._chunks is not None:
            return  # it wakes at the next boundary anyway
        if not self._local and self.rows >= self._cap:
            return  # no row free: the next finish admits it
        k = boundary_after(at_s - self._t0, *self._plain())
        if k is not None and self._n0 + k < self._wake_n:
            self._schedule(k, self._span(k))

    def _schedule(self, k: int, span_s: float) -> None:
        if not self._busy:
            self._busy = True
            if self.peer is not None:
                self.peer.peer_busy(True, self._t0)
        self._version += 1
        self._wake_n = self._n0 + k
        self._events.push(self._t0 + span_s, self._wake, self._version)

    def _wake(self, version: int, _: object) -> None:
        if version != self._version:
            return
        now, n = self._events.now, self._wake_n
        self._in_wake = True
        r = self.rows
        self.busy_s += now - self._t0
        self.row_s += r * (now - self._t0)
        self.row_steps += r * (n - self._n0)
        local_done: list[SimRequest] | None = None
        chunks = self._chunks
        if chunks is not None:  # one prefill step ended
            last = self._chunk_step_s
            if self.signals is not None:
                self.signals.step(r, sum(tokens for _, tokens in chunks), last)
            local = self._local
            self._reports.before_change(self.local_tokens, now)
            for req, tokens in chunks:
                req.job_done += tokens
                self.local_tokens -= tokens
                if req.job_done >= req.tokens:
                    local.popleft()
                    if local_done is None:
                        local_done = []
                    local_done.append(req)
            self._chunks = None
            self._ctx += r
        else:
            k = n - self._n0
            last = self._slow * (self._shape(r, 0) + self._per_ctx * (self._ctx + r * (k - 1)))
            if self.signals is not None:
                self.signals.run(r, *self._plain(), k)
            self._ctx += r * k
        self._n0, self._t0 = n, now
        gaps = self._gaps
        gaps.record(n - 1, last)
        rows = self._rows
        if rows and rows[0][0] == n:
            finished = []
            while rows and rows[0][0] == n:
                req = heapq.heappop(rows)[2]
                r -= 1
                self._ctx -= req.join_ctx + (n - req.join_step)
                finished.append(req)
            self.rows = r
            hooks = self._hooks
            for req in finished:
                gap = gaps.longest_since(req.join_step)
                if gap is not None and gap > req.itl_max_s:
                    req.itl_max_s = gap
                self.streamed += req.output - req.sent
                self._join_sum -= req.join_step
                req.sent = req.output
                hooks.finished(req, self, now)
        if local_done is not None:
            for req in local_done:
                self._hooks.first_token(req, now)
                if req.sent >= req.output:
                    self._hooks.finished(req, self, now)
            self.ready.extendleft(reversed([q for q in local_done if q.sent < q.output]))
        self._admit_and_plan(n, now)
        self._in_wake = False

    def _admit_and_plan(self, n: int, now: float) -> None:
        joined: list[SimRequest] | None = None
        ready, rows = self.ready, self._rows
        if ready and self.rows < self._cap:
            joined = []
            while ready and self.rows < self._cap:
                req = ready.popleft()
                ctx = req.join_ctx = req.prompt + req.sent
                req.join_step = n
                self._join_sum += n
                self._seq += 1
                heapq.heappush(rows, (n + req.output - req.sent, self._seq, req))
                self.rows += 1
                self._ctx += ctx
                joined.append(req)
        self._slow = self._factor()
        if self._local:
            chunks, tokens, attention = plan_chunks(self._local, max(self._chunk - self.rows, 1))
            self._chunks = chunks
            first = self._chunk_step_s = self._slow * self._prompt_scale * (
                self._shape(self.rows, tokens) + self._per_ctx * self._ctx
                + self._per_pair * attention)
            self._schedule(1, first)
        elif self.rows > 0:
            first = self._plain()[0]
            if self._exact:
                self._schedule(1, first)
            else:
                self._schedule(rows[0][0] - n, self._span(rows[0][0] - n))
        else:
            self._set_idle(now)
            return
        if joined:
            end = now + first
            for req in joined:
                if end - req.leg_token_s > req.itl_max_s:
                    req.itl_max_s = end - req.leg_token_s
