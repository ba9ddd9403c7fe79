"""The decode worker's ledger of reservations: which transfer fills which request's blocks.

    Reserve -> add(r)      (engine blocks allocated, receiver lease running)
    Committed event / PrefillLocal / Abort / Aborted / Expired  ->  pop(...)  exactly once

Pure bookkeeping (no torch, no asyncio): whoever pops an entry owns its ending, so a commit
racing an abort is resolved by which of them pops first.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class Reservation:
    """One request waiting for its KV from a prefill worker."""

    request_id: str
    transfer_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    block_ids: tuple[int, ...]
    prior_output_tokens: int = 0  # a migrated request's already-streamed tail of the prompt


class ReservationBook:
    """Live reservations by transfer id and by request id."""

    def __init__(self) -> None:
        self._by_transfer: dict[str, Reservation] = {}
        self._by_request: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._by_transfer)

    def add(self, res: Reservation) -> None:
        """Record a reservation; both ids must be new."""
        if res.transfer_id in self._by_transfer or res.request_id in self._by_request:
            raise KeyError(f"reservation {res.request_id!r}/{res.transfer_id!r} already exists")
        self._by_transfer[res.transfer_id] = res
        self._by_request[res.request_id] = res.transfer_id

    def by_request(self, request_id: str) -> Reservation | None:
        """The live reservation of a request, if any."""
        tid = self._by_request.get(request_id)
        return None if tid is None else self._by_transfer[tid]

    def pop_transfer(self, transfer_id: str) -> Reservation | None:
        """Take a reservation out by transfer id (None when already taken)."""
        res = self._by_transfer.pop(transfer_id, None)
        if res is not None:
            del self._by_request[res.request_id]
        return res

    def pop_request(self, request_id: str) -> Reservation | None:
        """Take a reservation out by request id (None when already taken)."""
        tid = self._by_request.get(request_id)
        return None if tid is None else self.pop_transfer(tid)
