"""KV reservations of a decode replica: blocks promised to a prompt whose KV comes from prefill.

    RESERVED ──(KV landed)──▶ LANDED ──(generate)──▶ joined (leaves the table)
        │                        │
        └── deadline passes ─────┴──▶ expired: the caller releases the blocks

Only a RESERVED entry accepts KV writes, so a late push can never write into blocks whose
reservation expired (they may belong to another request by then). A LANDED entry gets a fresh
deadline: if its generate command never comes, it expires too. Pure bookkeeping: times are passed in.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from engine.errors import PreconditionError


class ReservationState(enum.Enum):
    RESERVED = "reserved"
    LANDED = "landed"


class ReservationError(PreconditionError):
    """The reservation is missing or not in the state the operation needs."""


@dataclass(slots=True)
class Reservation:
    request_id: str
    block_ids: list[int]
    num_prompt_tokens: int
    deadline_s: float
    state: ReservationState = ReservationState.RESERVED
    num_bytes: int = 0


class ReservationTable:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._entries: dict[str, Reservation] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, request_id: str, block_ids: list[int], num_prompt_tokens: int, now_s: float) -> Reservation:
        if request_id in self._entries:
            raise ReservationError(f"request {request_id} already holds a reservation")
        entry = Reservation(request_id, list(block_ids), num_prompt_tokens, now_s + self.timeout_s)
        self._entries[request_id] = entry
        return entry

    def writable_block_ids(self, request_id: str) -> list[int] | None:
        entry = self._entries.get(request_id)
        return entry.block_ids if entry and entry.state is ReservationState.RESERVED else None

    def mark_landed(self, request_id: str, num_bytes: int, now_s: float) -> None:
        entry = self._entries.get(request_id)
        if entry is None or entry.state is not ReservationState.RESERVED:
            raise ReservationError(f"request {request_id} has no reservation awaiting KV")
        entry.state = ReservationState.LANDED
        entry.num_bytes = num_bytes
        entry.deadline_s = now_s + self.timeout_s

    def join(self, request_id: str) -> Reservation:
        """Removes a LANDED entry: its blocks now belong to a running request."""
        entry = self._entries.get(request_id)
        if entry is None:
            raise ReservationError(f"request {request_id} has no reservation (expired or never made)")
        if entry.state is not ReservationState.LANDED:
            raise ReservationError(f"request {request_id}: KV has not landed yet")
        return self._entries.pop(request_id)

    def remove(self, request_id: str) -> Reservation | None:
        return self._entries.pop(request_id, None)

    def pop_expired(self, now_s: float) -> list[Reservation]:
        expired = [entry for entry in self._entries.values() if entry.deadline_s <= now_s]
        for entry in expired:
            del self._entries[entry.request_id]
        return expired
