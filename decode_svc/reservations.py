"""KV reservations of a decode replica: blocks promised to a prompt whose KV comes from prefill.

    RESERVED ──(KV landed)──▶ LANDED ──(generate)──▶ joined (leaves the table)
        │                        │
        └── deadline passes, ────┴──▶ ended ──(no write holds it)──▶ the caller releases the blocks
            or removed (abort)

Who may write: only a caller presenting the reservation's `write_token` (a random capability
returned by Reserve only to its caller), and only into a RESERVED entry before its deadline.

Fencing, the invariant: the blocks of an ended reservation go back for reuse only once no write
into them is in progress or can start. A receiver-side write holds its reservation from
`begin_write` to `end_write`. An in-place write (shm, cuda_ipc) runs in the sender's process, out
of this table's sight, under the reservation's write fence (kvtransfer/write_fence.py):
`try_fence(first block id)` closes the fence, which stops every later writer, unless a writer
holds it now. Only a RESERVED in-place entry needs its fence closed: a sender commits after its
copy, so a LANDED one has no writer left. An ended entry that a write still holds stays in the
table, taking no write or landing, until the `end_write` of its last write or the first
`pop_ended` after its in-place writer let go. That quarantine ends: a writer lets go when its
copy ends or its process does, however long it was paused.

A LANDED entry gets a fresh deadline: if its generate command never comes, it expires too.
Each caller (a gateway) may hold at most `max_blocks_per_caller` blocks in entries of the table.
Pure bookkeeping: times are passed in.
"""
from __future__ import annotations

import enum
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from pdserve.protocol.errors import NotFoundError, PreconditionError, ResourceExhaustedError, WriteTokenError


class ReservationState(enum.Enum):
    RESERVED = "reserved"
    LANDED = "landed"


class ReservationError(PreconditionError):
    """The reservation is missing or not in the state the operation needs."""


class NoReservationError(ReservationError, NotFoundError):
    """No reservation to write into: never made, expired or released."""


class CallerQuotaError(ResourceExhaustedError):
    """The caller already holds its share of the pool in reservations."""


@dataclass(slots=True)
class Reservation:
    request_id: str
    block_ids: list[int]
    num_prompt_tokens: int
    deadline_s: float
    caller: str
    write_token: bytes
    in_place: bool = False  # written in the sender's process (shm, cuda_ipc)
    state: ReservationState = ReservationState.RESERVED
    num_bytes: int = 0
    num_writes: int = 0  # receiver-side writes into its blocks in progress
    ended: bool = False  # expired or removed; kept in the table while a write still holds it


class ReservationTable:
    def __init__(self, timeout_s: float, try_fence: Callable[[int], bool], max_blocks_per_caller: int | None = None):
        self.timeout_s = timeout_s
        # first block id -> True once that reservation's in-place writes are fenced off, False while one runs
        self._try_fence = try_fence
        self.max_blocks_per_caller = max_blocks_per_caller  # None: no cap
        self._entries: dict[str, Reservation] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._entries

    def check_quota(self, caller: str, num_blocks: int) -> None:
        """Raises CallerQuotaError if `caller` may not hold `num_blocks` more."""
        if self.max_blocks_per_caller is None:
            return
        num_held = sum(len(entry.block_ids) for entry in self._entries.values() if entry.caller == caller)
        if num_held + num_blocks > self.max_blocks_per_caller:
            raise CallerQuotaError(
                f"reserving {num_blocks} more KV blocks would exceed this caller's cap of "
                f"{self.max_blocks_per_caller} blocks in reservations not yet joined ({num_held} held)")

    def add(self, request_id: str, block_ids: list[int], num_prompt_tokens: int, now_s: float, *,
            caller: str, write_token: bytes, in_place: bool = False) -> Reservation:
        if request_id in self._entries:
            raise ReservationError(f"request {request_id} already holds a reservation")
        entry = Reservation(request_id, list(block_ids), num_prompt_tokens, now_s + self.timeout_s, caller,
                            write_token, in_place)
        self._entries[request_id] = entry
        return entry

    def begin_write(self, request_id: str, write_token: bytes, now_s: float) -> list[int]:
        """The blocks to write, held until `end_write`; raises ReservationError, WriteTokenError."""
        entry = self._writable(request_id, write_token, now_s)
        entry.num_writes += 1
        return entry.block_ids

    def end_write(self, request_id: str) -> Reservation | None:
        """Ends a write that `begin_write` began; returns the entry if it ended meanwhile and no
        write holds it any more: its blocks are the caller's to release now."""
        entry = self._entries[request_id]
        entry.num_writes -= 1
        return self._pop_if_released(entry)

    def mark_landed(self, request_id: str, write_token: bytes, num_bytes: int, now_s: float) -> None:
        entry = self._writable(request_id, write_token, now_s)
        if entry.num_writes:
            raise ReservationError(f"request {request_id}: KV still being written")
        entry.state = ReservationState.LANDED
        entry.num_bytes = num_bytes
        entry.deadline_s = now_s + self.timeout_s

    def join(self, request_id: str) -> Reservation:
        """Removes a LANDED entry: its blocks now belong to a running request."""
        entry = self._entries.get(request_id)
        if entry is None or entry.ended:
            raise ReservationError(f"request {request_id} has no reservation (expired or never made)")
        if entry.state is not ReservationState.LANDED:
            raise ReservationError(f"request {request_id}: KV has not landed yet")
        return self._entries.pop(request_id)

    def remove(self, request_id: str) -> bool:
        """Ends the reservation. True: the caller may release its blocks now (or there is no
        reservation); False: a write still holds them, and `end_write` or `pop_ended` hands them back."""
        entry = self._entries.get(request_id)
        if entry is None or entry.ended:
            return entry is None
        entry.ended = True
        return self._pop_if_released(entry) is not None

    def pop_ended(self, now_s: float) -> list[Reservation]:
        """Ends the entries past their deadline, and returns the ended entries that no write
        holds any more: their blocks are the caller's to release now."""
        released = []
        for entry in list(self._entries.values()):
            entry.ended = entry.ended or now_s >= entry.deadline_s
            if (popped := self._pop_if_released(entry)) is not None:
                released.append(popped)
        return released

    def _pop_if_released(self, entry: Reservation) -> Reservation | None:
        """Removes an ended entry once no write into its blocks is in progress, nor can start."""
        if not entry.ended or entry.num_writes:
            return None
        if entry.in_place and entry.state is ReservationState.RESERVED and not self._try_fence(entry.block_ids[0]):
            return None
        return self._entries.pop(entry.request_id)

    def _writable(self, request_id: str, write_token: bytes, now_s: float) -> Reservation:
        entry = self._entries.get(request_id)
        if entry is None or entry.ended or now_s >= entry.deadline_s:
            raise NoReservationError(f"request {request_id} holds no KV reservation here (unknown, expired or released)")
        if not hmac.compare_digest(write_token, entry.write_token):
            raise WriteTokenError(f"request {request_id}: the KV write does not carry its reservation's write token")
        if entry.state is not ReservationState.RESERVED:
            raise ReservationError(f"request {request_id} has no reservation awaiting KV")
        return entry
