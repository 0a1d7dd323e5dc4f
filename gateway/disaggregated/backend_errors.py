"""How a replica's refusal or failure reaches the gateway's driver: as a domain error.

INVALID_ARGUMENT is the client's fault (InvalidRequestError); RESOURCE_EXHAUSTED is a replica at
its bound (ReplicaBusyError: out of blocks, or its waiting queue full), which a client is told
to retry after a while; any other status becomes a BackendError that carries it, so the
gateway's edge reports what the replica said. A decode session that breaks under its requests
fails each of them with SessionBrokenError, and a request that gets no step for the token
timeout fails with ReplicaStalledError: the two signals that say "the replica, not this request,
went away" (both UNAVAILABLE, so the request migrates). A prefill replica whose KV push or copy
failed on the decode side says so in its status (cluster.grpc_errors: `pdserve-failed-side`):
that failure is a KVTransferError, which blames the decode replica, not the one that reported it.
"""
from __future__ import annotations

import grpc

from pdserve.gateway.front.frontend_types import OverloadedError, UnavailableError
from pdserve.protocol.errors import InvalidRequestError

_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


class BackendError(UnavailableError):
    """A replica refused or failed a call; `grpc_code` is the status the client should see and
    `replica_id` the replica that said so (None when the gateway itself decided), at `endpoint`
    ("" where not known)."""

    def __init__(self, grpc_code: grpc.StatusCode, message: str, replica_id: str | None = None, endpoint: str = ""):
        super().__init__(message)
        self.grpc_code = grpc_code
        self.replica_id = replica_id
        self.endpoint = endpoint


class SessionBrokenError(BackendError):
    """The session with a decode replica ended while the request ran on it (UNAVAILABLE)."""

    def __init__(self, replica_id: str, message: str):
        super().__init__(grpc.StatusCode.UNAVAILABLE, message, replica_id)


class ReplicaStalledError(BackendError):
    """A replica took no step for a request in the token timeout: alive maybe, of no use (UNAVAILABLE)."""

    def __init__(self, replica_id: str, message: str):
        super().__init__(grpc.StatusCode.UNAVAILABLE, message, replica_id)


class KVTransferError(BackendError):
    """The prefill replica `replica_id` could not hand the request's KV to its decode replica,
    and says the decode side failed it (refused it, could not be reached, or its pool could
    not be opened)."""


class ReplicaBusyError(OverloadedError):
    """The replica `replica_id` is at one of its bounds (RESOURCE_EXHAUSTED)."""

    def __init__(self, message: str, replica_id: str):
        super().__init__(message)
        self.replica_id = replica_id


def backend_error(replica_id: str, code: grpc.StatusCode | int, details: str, endpoint: str = "") -> Exception:
    """The domain error for a replica's status; `code` as grpc names it or as its number."""
    code = _STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN) if isinstance(code, int) else code
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequestError(details)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ReplicaBusyError(f"{replica_id}: {details}", replica_id)
    return BackendError(code, f"{replica_id}: {details}", replica_id, endpoint)
