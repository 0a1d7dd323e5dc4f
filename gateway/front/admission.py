"""A bound on the requests a gateway holds at once, checked before any work is done.

Every engine request a front takes in (one per gRPC Generate, one per choice of an HTTP
completion) holds one slot from admission until its stream ends, however it ends. A request
that would take the number held past `max_pending_requests` is refused at once, before the
gateway tokenizes it, writes to Redis or calls a replica: the client sees HTTP 429 with
`Retry-After` / gRPC RESOURCE_EXHAUSTED with a `retry-after` trailer, and retries later. This is
load shedding at the front (as SGLang's `--max-queued-requests`); the gateway never queues a
request behind others, so the bound is also the bound on what it holds in memory.

On SIGTERM the gateway `close`s admission: from then on every new request is refused with
UNAVAILABLE (HTTP 503), so a client or load balancer retries it on another gateway, while the
requests already admitted stream to their end (gateway/disaggregated/main.py drains them).

Invariant: `num_pending` is the number of slots held, and returns to 0 once every admitted
stream has ended; `pdserve:num_requests_pending` shows it and
`pdserve:requests_rejected_total{front}` counts the refusals.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge

from pdserve.gateway.front.frontend_types import RETRY_AFTER_S, OverloadedError
from pdserve.protocol.errors import InvalidConfigError, InvalidRequestError, UnavailableError

DEFAULT_MAX_PENDING_REQUESTS = 4096

FRONTS = ("grpc", "http")


class DrainingError(UnavailableError):
    """The gateway is shutting down: it takes no new request (UNAVAILABLE, HTTP 503)."""


class Admission:
    def __init__(self, max_pending_requests: int, registry: CollectorRegistry, model_name: str):
        if max_pending_requests < 1:
            raise InvalidConfigError(f"max_pending_requests must be at least 1, got {max_pending_requests}")
        self.max_pending_requests = max_pending_requests
        self.num_pending = 0
        self.closed = False
        self._pending = Gauge(
            "pdserve:num_requests_pending", "Requests the gateway's fronts hold (admitted, not ended).",
            ("model_name",), registry=registry).labels(model_name)
        rejected = Counter("pdserve:requests_rejected", "Requests refused because the gateway held its maximum.",
                           ("model_name", "front"), registry=registry)
        self._rejected = {front: rejected.labels(model_name, front) for front in FRONTS}

    def admit(self, num_requests: int, front: str) -> contextlib.AbstractContextManager[None]:
        """Slots for `num_requests`, held inside the `with` block the answer opens; raises
        OverloadedError at once, holding none, when they do not fit now, DrainingError once
        closed, and InvalidRequestError when they never could."""
        if self.closed:
            raise DrainingError("the gateway is shutting down: retry on another one")
        if num_requests > self.max_pending_requests:
            raise InvalidRequestError(
                f"{num_requests} requests at once exceed the gateway's maximum of {self.max_pending_requests}")
        if self.num_pending + num_requests > self.max_pending_requests:
            self._rejected[front].inc()
            raise OverloadedError(
                f"the gateway holds {self.num_pending} requests, its maximum is {self.max_pending_requests}: "
                f"retry in {RETRY_AFTER_S} s", RETRY_AFTER_S)
        return self._holding(num_requests)

    def close(self) -> None:
        """Refuses every request from now on; those admitted hold their slots to their end."""
        self.closed = True

    @contextlib.contextmanager
    def _holding(self, num_requests: int) -> Iterator[None]:
        self.num_pending += num_requests
        self._pending.set(self.num_pending)
        try:
            yield
        finally:
            self.num_pending -= num_requests
            self._pending.set(self.num_pending)
