"""A simulated prefill worker: one FIFO queue of prompts, computed in chunked steps.

A request's life here (tandem/worker/prefill/ on a real one)::

    queued (FIFO)  ->  chunks, several prompts packed per step, the last one cut at the
                       step's token budget  ->  last chunk ends: first token, KV pushed to
                       the decode worker's reservation (router: transfer timing)

Each step takes up to ``chunk_tokens`` prompt tokens and lasts
``step.step_s(0, tokens, prefill_pairs=pairs)`` (times the profile's
``serving_prompt_scale``), pairs = sum over its chunks of
``n x (tokens before the chunk) + n (n + 1) / 2`` (the query-key pairs of causal attention:
tandem/planner/fit.prefill_context). A
prompt's first chunk skips what this worker's prefix cache holds of its group; a finished
prompt's shared prefix (and, for a conversation, what the next turn will share) enters the
cache. One event per step: a step's shape changes with every chunk.

Host sharing (tandem/planner/sim/host.py): while the decode worker sharing its host steps, a step
of n prompt tokens runs ``prefill_factor(n)`` times slower; a change mid-step keeps the work
left and moves the step's end.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from tandem.placement.worker_view import Role, WorkerView
from tandem.planner.profile import Profile
from tandem.planner.sim.cache import PrefixLru
from tandem.planner.sim.events import EventQueue
from tandem.planner.sim.host import HostPeer, HostSharing
from tandem.planner.sim.reports import ReportedQueue
from tandem.planner.sim.request import SimRequest
from tandem.planner.sim.signals import FittedSignals, reported_costs


class PrefillHooks(Protocol):
    """What the router hears from a prefill worker."""

    def prefill_done(self, req: SimRequest, worker: PrefillWorker, at_s: float) -> None:
        """``req``'s last chunk ended on ``worker`` at ``at_s``."""


class PrefillWorker:
    """One prefill worker (see the module docstring). ``index`` orders workers the way the
    router's policies break ties (by endpoint)."""

    __slots__ = ("index", "endpoint", "profile", "transfer", "kv_bytes", "_events", "_hooks",
                 "_per_pair", "_prompt_scale", "_shape", "_chunk",
                 "block_size", "cache", "_queue", "depth", "queued_tokens", "busy", "_version",
                 "_chunks", "routable", "draining", "dead", "key", "_view", "busy_s", "done_log",
                 "peer", "_host", "_peer_busy", "_step_slow", "_slow", "_left", "_mark",
                 "_began", "signals", "_reports")

    def __init__(self, index: int, profile: Profile, events: EventQueue,
                 hooks: PrefillHooks, signals: FittedSignals | None = None,
                 report_interval_s: float = 0.0) -> None:
        self.index = index
        self.endpoint = f"p{index:05d}"
        self.profile = profile
        self.transfer = profile.transfer
        self.kv_bytes = profile.kv_bytes_per_token
        self._events = events
        self._hooks = hooks
        self._per_pair = profile.step.per_prefill_pair_s
        self._prompt_scale = profile.serving_prompt_scale  # every step here carries a prompt
        self._shape = profile.served_shape_s  # the step before attention, served
        self._chunk = profile.chunk_tokens
        self.block_size = profile.block_size
        self.cache = PrefixLru(profile.kv_capacity_blocks, profile.block_size)
        self._queue: deque[tuple[SimRequest, int]] = deque()  # (request, its leg)
        self.depth = 0  # live jobs queued or running
        self.queued_tokens = 0  # prompt tokens still to compute
        self.busy = False
        self._version = 0
        self._chunks: list[tuple[SimRequest, int, int]] = []  # the running step's
        self.routable = False  # in the router's pool (started, not draining, alive)
        self.draining = False
        self.dead = False
        self.key: tuple[int, ...] | None = None  # its place in the router's load index
        self._view: WorkerView | None = None
        self.busy_s = 0.0  # seconds spent stepping
        # (end, seconds since queued, prompt tokens) of every prefill done, in order
        self.done_log: list[tuple[float, float, int]] = []
        self.peer: HostPeer | None = None  # the decode worker sharing its host (host.py)
        self._host: HostSharing | None = None  # the slowdowns while that peer steps
        self._peer_busy = False
        self._step_slow = 1.0  # the running step's slowdown while the peer steps
        self._slow = 1.0  # the slowdown now
        self.signals = signals  # its own step-cost fit (signals.py); None: the profile's
        self._reports = ReportedQueue(report_interval_s)  # queued_tokens as reported
        self._left = 0.0  # the running step: profile seconds left at _mark; its start
        self._mark = 0.0
        self._began = 0.0

    @property
    def stepping(self) -> bool:
        """Whether the worker is computing a step."""
        return self.busy

    def share_host(self, peer: HostPeer, sharing: HostSharing, at_s: float) -> None:
        """From ``at_s`` on, ``peer`` (a decode worker) shares this worker's host: a step of
        n prompt tokens runs ``sharing.prefill_factor(n)`` times slower while ``peer``
        steps."""
        self.peer, self._host = peer, sharing
        self.peer_busy(peer.stepping, at_s)

    def peer_busy(self, busy: bool, at_s: float) -> None:
        """The host's decode worker started (``busy``) or stopped stepping at ``at_s``: the
        running step's work left runs at the new speed."""
        self._peer_busy = busy
        slow = self._step_slow if busy else 1.0
        if slow == self._slow:
            return
        if self.busy:
            self._left -= (at_s - self._mark) / self._slow
            self._mark = at_s
            self._version += 1
            self._events.push(at_s + max(self._left, 0.0) * slow, self._end, self._version)
        self._slow = slow

    def cached_tokens(self, req: SimRequest, touch: bool = False) -> int:
        """Prompt tokens of ``req``'s leg this worker's prefix cache holds (the last token
        always runs)."""
        group = req.group
        if group < 0 or group not in self.cache.entries:
            return 0
        held = self.cache.tokens(group) if touch else self.cache.peek(group)
        cap = req.prefix if req.prefix < req.tokens else req.tokens - 1
        cap -= cap % self.block_size
        return held if held < cap else cap

    def view(self) -> WorkerView:
        """What the router's policies see: the queue as the router knows it (its last
        report or the exact one, the larger: tandem/planner/sim/reports.py), the rest exact."""
        view = self._view
        queued = self._reports.seen(self.queued_tokens, self._events.now)
        if view is None or view.queued_prefill_tokens != queued:
            capacity = self.cache.capacity
            base, per_row, per_token = reported_costs(self.profile, self.signals)
            view = self._view = WorkerView(
                self.endpoint, Role.PREFILL, num_waiting=self.depth,
                num_free_blocks=capacity, num_blocks=capacity, active=self.depth,
                step_base_s=base, step_per_row_s=per_row, step_per_prefill_token_s=per_token,
                queued_prefill_tokens=queued, max_batched_tokens=self._chunk)
        return view

    def enqueue(self, req: SimRequest, at_s: float) -> None:
        """Queue ``req``'s current leg; starts a step now if the worker is idle."""
        est = req.tokens - self.cached_tokens(req)
        req.job_p, req.job_done, req.job_est = self, -1, est
        req.job_queued_s = at_s
        self._queue.append((req, req.leg))
        self.depth += 1
        self._reports.before_change(self.queued_tokens, at_s)
        self.queued_tokens += est
        self._view = None
        if not self.busy:
            self._start(at_s)
            if self.busy and self.peer is not None:
                self.peer.peer_busy(True, at_s)

    def cancel(self, req: SimRequest) -> None:
        """Drop ``req``'s job (its leg moved on); a step already running keeps its length."""
        left = req.job_est if req.job_done < 0 else req.tokens - req.job_done
        req.job_p = None
        self.depth -= 1
        self._reports.before_change(self.queued_tokens, self._events.now)
        self.queued_tokens -= left
        self._view = None

    def kill(self) -> list[SimRequest]:
        """The worker dies: its live jobs, in queue order, for the router to retry."""
        self.dead, self.routable = True, False
        self._version += 1  # the running step never ends
        lost = [req for req, leg in self._queue if req.leg == leg and req.job_p is self]
        for req in lost:
            req.job_p = None
        self._queue.clear()
        self._reports.before_change(self.queued_tokens, self._events.now)
        self.depth = self.queued_tokens = 0
        if self.busy:
            self.busy_s += self._events.now - self._began
            if self.peer is not None:
                self.peer.peer_busy(False, self._events.now)
        self.busy = False
        return lost

    def _start(self, at_s: float) -> None:
        budget = self._chunk
        chunks: list[tuple[SimRequest, int, int]] = []
        tokens = 0
        attention = 0.0
        for req, leg in self._queue:
            if req.leg != leg or req.job_p is not self:
                continue
            done = req.job_done
            if done < 0:  # its first chunk: the cache is looked up now
                done = req.job_done = self.cached_tokens(req, touch=True)
                actual = req.tokens - done
                self._reports.before_change(self.queued_tokens, at_s)
                self.queued_tokens += actual - req.job_est
                req.job_est = actual
                self._view = None
            n = req.tokens - done
            if n > budget:
                n = budget
            chunks.append((req, leg, n))
            tokens += n
            attention += n * done + n * (n + 1) / 2
            budget -= n
            if budget == 0:
                break
        if not chunks:
            self.busy = False
            return
        self.busy = True
        self._chunks = chunks
        self._version += 1
        if self._host is not None:
            self._step_slow = self._host.prefill_factor(tokens)
            self._slow = self._step_slow if self._peer_busy else 1.0
        step_s = self._prompt_scale * (self._shape(0, tokens) + self._per_pair * attention)
        self._left, self._mark, self._began = step_s, at_s, at_s
        self._events.push(at_s + step_s * self._slow, self._end, self._version)

    def _end(self, version: int, _: object) -> None:
        if version != self._version:
            return
        now = self._events.now
        self.busy_s += now - self._began
        if self.signals is not None:
            self.signals.step(0, sum(n for _, _, n in self._chunks), now - self._began)
        done: list[SimRequest] = []
        self._reports.before_change(self.queued_tokens, now)
        for req, leg, n in self._chunks:
            if req.leg != leg or req.job_p is not self:
                continue  # cancelled mid-step: its tokens were already taken off
            req.job_done += n
            self.queued_tokens -= n
            if req.job_done >= req.tokens:
                done.append(req)
        cache = self.cache
        log = self.done_log
        for req in done:
            req.job_p = None
            self.depth -= 1
            log.append((now, now - req.job_queued_s, req.tokens))
            cache.insert(req.group, req.prefix)
            if req.next_group >= 0:
                cache.insert(req.next_group, min(req.next_prefix, req.prompt))
        queue = self._queue
        while queue and (queue[0][0].leg != queue[0][1] or queue[0][0].job_p is not self):
            queue.popleft()
        self._view = None
        self.busy = False
        if self.depth > 0:
            self._start(now)
        if not self.busy and self.peer is not None:
            self.peer.peer_busy(False, now)
        for req in done:
            self._hooks.prefill_done(req, self, now)
