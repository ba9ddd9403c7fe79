"""What the routing policies see of a worker: an immutable load snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Role(str, Enum):
    """A worker's job in the handoff."""

    PREFILL = "prefill"
    DECODE = "decode"


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker's load as last reported (heartbeat or Stats), plus the router's own count.

    ``active`` is how many of this router's requests are on the worker right now; it is exact
    and current, while the reported fields may be a heartbeat old. ``num_blocks == 0`` means
    the worker has not reported its KV capacity yet.
    """

    endpoint: str
    role: Role
    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_blocks: int = 0
    active: int = 0
    # The worker's fitted step cost (tandem/common/step_costs.py; None: not observed yet) and
    # the prompt tokens queued ahead of a new prefill; read by tandem/placement/cost_model.py.
    step_base_s: float | None = None
    step_per_row_s: float | None = None
    step_per_prefill_token_s: float | None = None
    queued_prefill_tokens: int = 0
    max_batched_tokens: int = 0  # tokens one step may take (0: not reported)
    # Prefix-cache hashes of the blocks it reported holding (tandem/router/handoff/held_blocks.py)
    cached_blocks: frozenset[int] = frozenset()
    weights_format: str = ""  # tandem/engine/quant's summary of its weights ("" until reported)
    # the LoRA adapters it serves, by identity (name@digest of the adapter's bytes)
    loras: frozenset[str] = frozenset()

    def holds_adapter(self, identity: str) -> bool:
        """Whether it serves the LoRA adapter ``identity`` ("": the base model, always)."""
        return not identity or identity in self.loras

    @property
    def queue_depth(self) -> int:
        """Work waiting or running there, taking the larger of reported and router-counted."""
        return max(self.num_running + self.num_waiting, self.active)
