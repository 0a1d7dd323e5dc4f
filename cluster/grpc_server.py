"""A gRPC server the way every pdserve service runs one.

Health (`grpc.health.v1`) reports NOT_SERVING until the service says it is ready; reflection is
on. An internal service passes its `InternalAuth`, whose interceptor refuses callers without the
deployment secret and whose TLS, when it has one, is the only thing its port speaks
(cluster/internal_auth.py); the public gateway passes none. A service stops by composing
`wait_for_signal`, `mark_not_serving` and `stop` with its own drain in between.

gRPC core holds the calls that have arrived but that the service has not taken up yet, and past
`grpc.server.max_pending_requests` of them (1,000 by default) it drops a growing share of new
calls, every one at the hard limit (3,000), ending each as CANCELLED: a status a client reads as
its own cancellation, with no retry-after. A pdserve service refuses overload itself, as
RESOURCE_EXHAUSTED with a retry-after (gateway.front.admission), so core's limits sit above any
burst the service admits: `max_pending_calls`, never below MIN_PENDING_CALLS.
"""
from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Iterable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pdserve.cluster.internal_auth import InternalAuth
from pdserve.protocol.message_limits import MAX_MESSAGE_BYTES

logger = logging.getLogger(__name__)
MIN_PENDING_CALLS = 4096  # as many as the gateway admits by default


def message_size_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """The gRPC options of a server or channel that sends and takes messages of at most that size."""
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


def pending_call_options(max_pending_calls: int) -> list[tuple[str, int]]:
    """gRPC core's backlog of calls not yet taken up: none dropped below `max_pending_calls`."""
    soft_limit = max(max_pending_calls, MIN_PENDING_CALLS)
    return [("grpc.server.max_pending_requests", soft_limit),
            ("grpc.server.max_pending_requests_hard_limit", 2 * soft_limit)]


class GrpcServer:
    def __init__(self, bind: str, service_names: Iterable[str], auth: InternalAuth | None = None,
                 credentials: grpc.ServerCredentials | None = None, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 max_pending_calls: int = MIN_PENDING_CALLS):
        """`auth`: callers must present the deployment secret, and connections run its keepalive
        and its mutual TLS (internal services). With `credentials` the port speaks TLS only (the
        public front). A larger message is refused (RESOURCE_EXHAUSTED) before any servicer sees
        it (protocol.message_limits). Up to `max_pending_calls` calls arriving at once all reach
        the service (above)."""
        if credentials is None and auth is not None:
            credentials = auth.server_credentials()
        self.server = grpc.aio.server(interceptors=auth.server_interceptors() if auth else None, options=[
            *message_size_options(max_message_bytes), *pending_call_options(max_pending_calls),
            *(auth.keepalive.server_options() if auth else ())])
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = list(service_names)
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server)
        self.port = (self.server.add_secure_port(bind, credentials) if credentials is not None
                     else self.server.add_insecure_port(bind))
        if self.port == 0:
            raise OSError(f"cannot bind gRPC server to {bind}")
        self._names = names

    async def start(self) -> None:
        await self.mark_not_serving()
        await self.server.start()

    async def mark_serving(self) -> None:
        await self._set_status(health_pb2.HealthCheckResponse.SERVING)

    async def mark_not_serving(self) -> None:
        await self._set_status(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def wait_for_signal(self) -> None:
        """Returns at the first SIGTERM or SIGINT."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()

    async def stop(self, grace_s: float) -> None:
        """Refuses new calls and gives running ones grace_s before cancelling them."""
        await self.server.stop(grace_s)

    async def _set_status(self, status) -> None:
        for name in ("", *self._names):
            await self.health.set(name, status)
