"""A request's life inside the engine.

    add_request ──> WAITING ──schedule──> RUNNING ──stop/length──> FINISHED_*
                       ^                     │
                       └──── PREEMPTED <─────┘  (blocks freed, recomputed later)
    remote.decode.reserve ──> WAITING_FOR_REMOTE_KV ──commit──> RUNNING  (KV from a prefill worker)
                                                    ├─end───> FINISHED_ABORTED  (the push failed)
                                                    └─local─> WAITING  (prefilled here after all)
(the WAITING_FOR_REMOTE_KV transitions and held blocks are tandem/engine/core/remote_kv.py's)

A request with ``num_forks`` n > 1 (OpenAI's ``n`` / ``best_of``) is one prompt and n
sequences: it runs alone until its prompt is computed, then forks where the first tokens are
sampled (or committed, on a decode worker). Sequence j > 0 is a request of its own from
there on, named ``sequence_id(request_id, j)``, sharing the prompt's blocks by reference
count (tandem/engine/core/kv_cache_manager.py copies the last partial block on first write)::

    prompt computed ──fork──> sequence 0 (the request itself) ──> own tokens ...
                        ├───> sequence 1 "<id>#1" (seed + 1)  ──> own tokens ...
                        └───> sequence n-1
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from tandem.engine.outputs import TokenLogprob
from tandem.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    """Where a request is in its life."""

    WAITING = "waiting"
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        """True for the three terminal states."""
        return self in _FINISHED


_FINISHED = {
    RequestStatus.FINISHED_STOPPED,
    RequestStatus.FINISHED_LENGTH,
    RequestStatus.FINISHED_ABORTED,
}


FORK_SEPARATOR = "#"  # never in an id given from outside (the engine refuses it)


def sequence_id(request_id: str, index: int) -> str:
    """The engine's id of sequence ``index`` of a forked request: the request's own id for
    0, ``<request_id>#<index>`` for the others."""
    return request_id if index == 0 else f"{request_id}{FORK_SEPARATOR}{index}"


def fork_seed(seed: int | None, index: int) -> int | None:
    """Sequence ``index``'s seed: ``seed + index`` (mod 2**63), so sequence j of a seeded
    request samples exactly what a single request with that seed samples."""
    return None if seed is None else (seed + index) % 2**63


@dataclass(slots=True)
class Request:
    """One generation request: its tokens, progress and parameters."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    hold_kv: bool = False  # keep blocks after finishing (prefill role: until the push ends)
    # hold_kv with a sliding window: leading tokens whose blocks the push skips (the decode
    # worker's reservation does not take them), the only ones that may be freed behind the
    # window; 0 keeps every block (a reservation that skips nothing)
    push_skip_tokens: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    all_token_ids: list[int] = field(default_factory=list)  # prompt + output, appended in place
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    num_cached_tokens: int = -1  # prefix-cache hit at first scheduling (-1: not yet scheduled)
    num_preemptions: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    num_forks: int = 1  # sequences this request becomes once its prompt is computed
    # prompt logprobs scored so far, entry i for prompt token i ([0] is None); None when not
    # asked for or once handed out (a resumed request's prompt was scored on its first leg)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    # heads the prefix-cache hash chain of its blocks: its LoRA adapter's identity, hashed
    # (None: the base model), so KV is only ever reused under the same adapter
    cache_salt: int | None = None

    @property
    def lora(self) -> str:
        """The LoRA adapter the request runs under ("": the base model)."""
        return self.params.lora

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)
        if self.params.prompt_logprobs is not None and self.num_output_tokens == 0:
            self.prompt_logprobs = [None]

    @property
    def scores_prompt(self) -> bool:
        """True while the request owes its prompt logprobs: its prefill computes logits at
        every prompt position, so it never reads its prompt from the prefix cache."""
        return self.prompt_logprobs is not None

    @property
    def num_prompt_tokens(self) -> int:
        """Length of the prompt."""
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.all_token_ids) - len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """Generated tokens (a copy)."""
        return self.all_token_ids[len(self.prompt_token_ids) :]

    def append_token(self, token_id: int) -> None:
        """Record one sampled token."""
        self.all_token_ids.append(token_id)
