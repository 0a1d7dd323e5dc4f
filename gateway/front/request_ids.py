"""Request ids: those a client may give, and those the gateway makes from them.

A client's id (gRPC `request_id`, HTTP `X-Request-Id`) becomes Redis keys and engine ids, so it
is 1 to MAX_REQUEST_ID_CHARS characters of [A-Za-z0-9-_.:]. Each attempt after a migration runs
on its replicas as `{id}#{n}` (gateway.disaggregated.request): `#` is in no client id, so no
client can name, or collide with, another request's attempt.
"""
from __future__ import annotations

import string

from pdserve.protocol.errors import InvalidRequestError

MAX_REQUEST_ID_CHARS = 128
CLIENT_ID_CHARS = frozenset(string.ascii_letters + string.digits + "-_.:")
ATTEMPT_SEPARATOR = "#"
RULE = f"1 to {MAX_REQUEST_ID_CHARS} characters of [A-Za-z0-9-_.:]"


def check_client_request_id(request_id: str, field: str) -> str:
    """`request_id`, or InvalidRequestError naming `field` for an id no client may give."""
    if not 0 < len(request_id) <= MAX_REQUEST_ID_CHARS or not set(request_id) <= CLIENT_ID_CHARS:
        raise InvalidRequestError(f"{field} must be {RULE}")
    return request_id


def attempt_request_id(request_id: str, num_migrations: int) -> str:
    """The request's id on its replicas after `num_migrations` migrations (1 or more)."""
    return f"{request_id}{ATTEMPT_SEPARATOR}{num_migrations}"
