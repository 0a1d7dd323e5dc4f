"""KV reservations of a decode replica: blocks promised to a prompt whose KV comes from prefill.

    RESERVED ──(KV landed)──▶ LANDED ──(generate)──▶ joined (leaves the table)
        │                        │
        └── deadline passes, ────┴──▶ ended: the caller releases the blocks
            or removed (abort)

Who may write: only a caller presenting the reservation's `write_token` (a random capability
returned by Reserve only to its caller), and only into a RESERVED entry before its deadline.

Fencing, the invariant: the blocks of an ended reservation are handed back for reuse only once
no write into them can still be in progress. A receiver-side write holds its reservation from
`begin_write` to `end_write`; an entry that expires or is removed while held is marked ended
(no new write or landing is accepted) and `end_write` of its last write hands it back. An
in-place write (shm, cuda_ipc) happens in the sender's process where this table cannot see it:
the sender starts no copy after the deadline and checks the deadline again before it commits,
and the blocks of an expired RESERVED in-place entry are kept `in_place_grace_s` past the
deadline, so a copy that started in time finishes before anyone else can be given them.

A LANDED entry gets a fresh deadline: if its generate command never comes, it expires too.
Each caller (a gateway) may hold at most `max_blocks_per_caller` blocks in entries of the table.
Pure bookkeeping: times are passed in.
"""
from __future__ import annotations

import enum
import hmac
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
    ended: bool = False  # expired or removed while a write held it: released at the write's end


class ReservationTable:
    def __init__(self, timeout_s: float, max_blocks_per_caller: int | None = None, in_place_grace_s: float = 0.0):
        self.timeout_s = timeout_s
        self.max_blocks_per_caller = max_blocks_per_caller  # None: no cap
        self.in_place_grace_s = in_place_grace_s
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
        """Ends a write that `begin_write` began; returns the entry if it ended meanwhile and this
        was its last write: its blocks are the caller's to release now."""
        entry = self._entries[request_id]
        entry.num_writes -= 1
        if entry.ended and entry.num_writes == 0:
            return self._entries.pop(request_id)
        return None

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
        reservation); False: a write still holds them, and its `end_write` hands them back."""
        entry = self._entries.get(request_id)
        if entry is None or entry.ended:
            return entry is None
        if entry.num_writes:
            entry.ended = True
            return False
        del self._entries[request_id]
        return True

    def pop_expired(self, now_s: float) -> list[Reservation]:
        """The entries past their deadline whose blocks may be released now; those a write still
        holds are ended, and come back from its `end_write`."""
        expired = []
        for entry in list(self._entries.values()):
            if entry.ended or now_s < self._release_s(entry):
                continue
            if entry.num_writes:
                entry.ended = True
            else:
                expired.append(self._entries.pop(entry.request_id))
        return expired

    def _release_s(self, entry: Reservation) -> float:
        """When an expired entry's blocks may go to someone else."""
        if entry.in_place and entry.state is ReservationState.RESERVED:
            return entry.deadline_s + self.in_place_grace_s
        return entry.deadline_s

    def _writable(self, request_id: str, write_token: bytes, now_s: float) -> Reservation:
        entry = self._entries.get(request_id)
        if entry is None or entry.ended or now_s >= entry.deadline_s:
            raise NoReservationError(f"request {request_id} holds no KV reservation here (unknown, expired or released)")
        if not hmac.compare_digest(write_token, entry.write_token):
            raise WriteTokenError(f"request {request_id}: the KV write does not carry its reservation's write token")
        if entry.state is not ReservationState.RESERVED:
            raise ReservationError(f"request {request_id} has no reservation awaiting KV")
        return entry
