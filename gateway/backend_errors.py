"""How a replica's refusal or failure reaches the gateway's driver: as a domain error.

INVALID_ARGUMENT is the client's fault (InvalidRequestError); any other status becomes a
BackendError that carries it, so the gateway's edge reports what the replica said. A decode
session that breaks under its requests fails each of them with SessionBrokenError, the one
signal that says "the replica, not this request, went away".
"""
from __future__ import annotations

import grpc

from engine.errors import InvalidRequestError
from gateway.frontend_types import UnavailableError

_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


class BackendError(UnavailableError):
    """A replica refused or failed a call; `grpc_code` is the status the client should see."""

    def __init__(self, grpc_code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.grpc_code = grpc_code


class SessionBrokenError(BackendError):
    """The session with a decode replica ended while the request ran on it (UNAVAILABLE)."""

    def __init__(self, message: str):
        super().__init__(grpc.StatusCode.UNAVAILABLE, message)


def backend_error(replica_id: str, code: grpc.StatusCode | int, details: str) -> Exception:
    """The domain error for a replica's status; `code` as grpc names it or as its number."""
    code = _STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN) if isinstance(code, int) else code
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequestError(details)
    return BackendError(code, f"{replica_id}: {details}")
