"""The prefill role's side of the KV connector: prompts whose KV is pushed to another engine.

    add ──> queued with hold_kv ──> the step that completes its prefill fires the layer hook
        as each layer's KV lands: hook(layer, [(request_id, block_ids)], ready)
        ──> first token sampled, request finished ──> HELD (ledger: its blocks pinned)
        ──held_block_ids──> the push reads them ──release──> blocks freed, still prefix-cached

``ready`` (tandem/engine/kv_connector/layer_ready.py) says whether the device still writes the
layer: the pusher waits on it, off the engine thread, before reading the blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.remote_kv import RemoteKV
from tandem.engine.core.request import Request
from tandem.engine.core.scheduler import ScheduledRequest, Scheduler
from tandem.engine.kv_connector.host import LiveRequestHost
from tandem.engine.kv_connector.layer_ready import LayerReady
from tandem.engine.sampling_params import SamplingParams

# layer index, (request_id, block_ids) of every request whose prefill completes this step, and
# whether that layer is written yet
KVLayerHook = Callable[[int, list[tuple[str, list[int]]], LayerReady], None]


class PrefillSide:
    """Run prompts holding their KV, name the held blocks, release them (module docstring)."""

    def __init__(self, requests: LiveRequestHost, ledger: RemoteKV, scheduler: Scheduler,
                 kv: KVCacheManager, layer_ready: Callable[[], LayerReady]) -> None:
        self._requests = requests
        self._ledger = ledger
        self._scheduler = scheduler
        self._kv = kv
        self._layer_ready = layer_ready
        self._hook: KVLayerHook | None = None

    @property
    def num_held(self) -> int:
        """Finished requests whose blocks are kept for a push."""
        return self._ledger.num_held

    def add(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        prior_output_tokens: int = 0,
        n: int = 1,
        push_skip_tokens: int = 0,
    ) -> str:
        """Queue a request whose blocks are held once it finishes (until ``release``); returns
        its id. Options as in ``LLMEngine.add_request``; ``push_skip_tokens``: the leading
        tokens whose blocks the push skips (with a sliding window, the only blocks the engine
        may free behind it; ``Request.push_skip_tokens``). Raises InvalidRequestError."""
        live = self._requests.new_live(request_id, prompt, params, hold_kv=True,
                                       prior=prior_output_tokens, n=n)
        live.request.push_skip_tokens = push_skip_tokens
        self._requests.track(live)
        self._scheduler.add(live.request)
        return live.request.request_id

    def held_block_ids(self, request_id: str) -> list[int]:
        """Blocks of a finished held request, in logical order. Raises UnknownRequestError."""
        return self._ledger.held_block_ids(request_id)

    def release(self, request_id: str) -> bool:
        """Free a held request's blocks (they stay in the prefix cache); False when it holds
        none (never held, or released already)."""
        return self._ledger.release(request_id)

    def set_layer_hook(self, hook: KVLayerHook | None) -> None:
        """Call ``hook(layer, [(request_id, block_ids)], ready)`` on the engine thread as each
        layer's KV of the requests that finish their prefill in a step is written (the
        layer-wise push); None removes it."""
        self._hook = hook

    # -- the engine's side -------------------------------------------------------------------
    def hold(self, request: Request) -> None:
        """A ``hold_kv`` request finished: keep its blocks until ``release``."""
        self._ledger.hold(request)

    def step_hook(self, scheduled: list[ScheduledRequest]) -> Callable[[int], None] | None:
        """The per-layer callback of a step (None: no hook, or no prefill completes in it)."""
        hook = self._hook
        if hook is None:
            return None
        done = [
            (s.request.request_id, self._kv.block_ids(s.request.request_id))
            for s in scheduled
            if s.request.hold_kv and s.samples and s.request.num_output_tokens == 0
        ]
        if not done:
            return None
        ready = self._layer_ready
        return lambda layer: hook(layer, done, ready())
