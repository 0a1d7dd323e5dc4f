"""A bound on a replica's waiting queue: the requests its engine holds that have not started.

Every prompt of a prefill replica, and every prompt a decode replica prefills itself (a
gateway's local placement), waits in its engine's queue until the scheduler starts it. A prompt
that finds `max_waiting_requests` already waiting is refused at once with WaitingQueueFullError
(RESOURCE_EXHAUSTED), before it takes anything: the gateway answers its client HTTP 429 with
Retry-After / gRPC RESOURCE_EXHAUSTED with a `retry-after` trailer, as it does past its own
admission bound (gateway.front.admission). A request whose KV landed from prefill joins decode's
batch without this check: it already holds its blocks.

A gateway's line (gateway.disaggregated.dispatcher) keeps the queue of each replica short; the
bound holds when many gateways send to one replica, and bounds what a replica keeps in memory.
The check runs on the engine thread, where the queue's length is read between two steps.
"""
from __future__ import annotations

from pdserve.protocol.errors import ResourceExhaustedError

DEFAULT_MAX_WAITING_REQUESTS = 1024


class WaitingQueueFullError(ResourceExhaustedError):
    """The replica's waiting queue is at its bound: retry later, or elsewhere."""


def check_waiting_room(num_waiting: int, max_waiting_requests: int) -> None:
    """Raises WaitingQueueFullError unless one more request may join `num_waiting` waiting."""
    if num_waiting >= max_waiting_requests:
        raise WaitingQueueFullError(
            f"the replica's waiting queue holds {num_waiting} requests, its maximum (--max-waiting-requests)")
