"""The lifecycle of a request as the gateway records it, its one transition function, and the
record a client reads back (GetRequest).

    QUEUED ──▶ PREFILLING ──▶ TRANSFERRING ──▶ DECODING ──▶ FINISHED
                   │               │                ▲
                   │               │                └── PREFILLING  (prefilled on the decode replica: no transfer)
                   └───────────────┴──▶ FINISHED   (first token is EOS, or max_tokens is 1)

    PREFILLING | TRANSFERRING | DECODING ──▶ PREFILLING   (migrated: prefilled again, elsewhere)

    any non-terminal state ──▶ ABORTED | FAILED

FINISHED, ABORTED and FAILED are terminal: nothing leaves them. The member values are the numbers
of the proto enum `pdserve.v1.RequestState`, so the service edge converts with `RequestState(n)`
and `state.value`; this module stays free of protobuf so policy code can use it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from pdserve.protocol.errors import IllegalTransitionError, NotFoundError


class RequestState(enum.IntEnum):
    QUEUED = 1
    PREFILLING = 2
    TRANSFERRING = 3
    DECODING = 4
    FINISHED = 5
    ABORTED = 6
    FAILED = 7

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({RequestState.FINISHED, RequestState.ABORTED, RequestState.FAILED})
_ENDINGS = frozenset({RequestState.ABORTED, RequestState.FAILED})
_ALLOWED = {
    RequestState.QUEUED: {RequestState.PREFILLING} | _ENDINGS,
    RequestState.PREFILLING: {RequestState.PREFILLING, RequestState.TRANSFERRING, RequestState.DECODING,
                              RequestState.FINISHED} | _ENDINGS,
    RequestState.TRANSFERRING: {RequestState.PREFILLING, RequestState.DECODING, RequestState.FINISHED} | _ENDINGS,
    RequestState.DECODING: {RequestState.PREFILLING, RequestState.FINISHED} | _ENDINGS,
}


def transition(current: RequestState, to: RequestState) -> RequestState:
    """Returns `to` if a request in `current` may move there; raises IllegalTransitionError if not."""
    if to not in _ALLOWED.get(current, ()):
        raise IllegalTransitionError(f"{current.name} -> {to.name}")
    return to


LOCAL_PREFILL = "local"
"""A record's transport when its decode replica prefilled it: no KV moved."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    request_id: str
    state: RequestState
    prompt_tokens: int
    completion_tokens: int
    prefill_replica: str
    decode_replica: str
    transport: str
    error: str
    kv_bytes: int
    kv_transfer_s: float
    owner: str
    created_unix_s: float
    history: tuple[tuple[RequestState, float], ...]  # (state entered, unix time), oldest first


class RequestNotFoundError(NotFoundError):
    """No record for this request id (never created, or expired after it ended)."""
