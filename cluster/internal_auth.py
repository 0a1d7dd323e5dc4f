"""Who may call a deployment's internal services: the holders of its shared secret and, with
internal TLS, of a certificate from its CA.

Every internal gRPC server (prefill, decode, KVTransfer) refuses a call whose metadata does not
carry the deployment secret with UNAUTHENTICATED, compared in constant time, before any handler
runs; only `grpc.health.v1` takes calls without it, for probes (reflection is refused like the
rest; with TLS, probes too present a certificate). Every
internal client channel sends the secret with each call, and the caller's id (a gateway's id),
which the decode replica counts reservations against. With `tls` (cluster/internal_tls.py) every
internal connection is mutual TLS: servers take only callers with a certificate from the
deployment's CA, callers reach only servers with one, and the secret travels encrypted. With no
secret configured, servers take any call and clients send none; with no TLS, connections are
plaintext: each process says so once at start.
Every internal connection, client and server side, runs keepalive (cluster/keepalive.py).
"""
from __future__ import annotations

import hmac
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from pdserve.cluster.internal_tls import InternalTls
from pdserve.cluster.keepalive import Keepalive

logger = logging.getLogger(__name__)

SECRET_KEY = "pdserve-internal-secret-bin"  # "-bin": the value travels as raw bytes
CALLER_KEY = "pdserve-caller"
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)


@dataclass(frozen=True, slots=True)
class InternalAuth:
    secret: bytes | None  # None: the deployment runs open
    caller_id: str = ""  # what this process names itself in its calls
    keepalive: Keepalive = Keepalive()
    tls: InternalTls | None = None  # None: connections are plaintext

    @classmethod
    def open(cls) -> InternalAuth:
        return cls(None)

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """What an internal server's port speaks: mutual TLS, or plaintext (None)."""
        return None if self.tls is None else self.tls.server_credentials()

    def server_interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        return [] if self.secret is None else [SecretCheck(self.secret)]

    def client_interceptors(self) -> list[grpc.aio.ClientInterceptor]:
        metadata = []
        if self.secret is not None:
            metadata.append((SECRET_KEY, self.secret))
        if self.caller_id:
            metadata.append((CALLER_KEY, self.caller_id))
        if not metadata:
            return []
        return [interceptor(tuple(metadata)) for interceptor in _CLIENT_INTERCEPTORS]

    def channel(self, endpoint: str, options: Sequence[tuple[str, object]] = ()) -> grpc.aio.Channel:
        """A channel to an internal service that presents this process's credentials (and, with
        TLS, connects only to a server whose certificate the deployment's CA issued)."""
        options = [*self.keepalive.client_options(), *options]
        if self.tls is None:
            return grpc.aio.insecure_channel(endpoint, options=options, interceptors=self.client_interceptors())
        return grpc.aio.secure_channel(endpoint, self.tls.channel_credentials(),
                                       options=[*options, *self.tls.channel_options()],
                                       interceptors=self.client_interceptors())


def warn_if_open(auth: InternalAuth, process: str) -> None:
    if auth.secret is None:
        logger.warning("%s runs with no internal secret (--internal-secret-file or PDSERVE_INTERNAL_SECRET): "
                       "internal gRPC services accept any caller and replica registry entries are not signed",
                       process)
    if auth.tls is None:
        logger.warning("%s runs with no internal TLS (--internal-tls-ca, --internal-tls-cert, --internal-tls-key or "
                       "PDSERVE_INTERNAL_TLS_*): internal gRPC is plaintext, and callers do not check whom they "
                       "reach", process)


def new_caller_id(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:8]}"


def caller_of(context: grpc.aio.ServicerContext) -> str:
    """The caller a server counts a call against: the id it names, else its peer's address."""
    for key, value in context.invocation_metadata() or ():
        if key == CALLER_KEY and value:
            return f"id:{value}"
    peer = context.peer() or "unknown"
    return "peer:" + peer.rsplit(":", 1)[0]  # the host, not the port: every connection has its own


class SecretCheck(grpc.aio.ServerInterceptor):
    """Lets a call through only if its metadata carries the secret (health excepted)."""

    def __init__(self, secret: bytes):
        self._secret = secret

    async def intercept_service(self, continuation, handler_call_details: grpc.HandlerCallDetails):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        presented = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == SECRET_KEY:
                presented = value if isinstance(value, bytes) else value.encode()
        if hmac.compare_digest(presented, self._secret):
            return handler
        return _refusal(handler)


async def _refuse(request_or_iterator, context: grpc.aio.ServicerContext) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "this internal service needs the deployment's secret")


def _refusal(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that refuses the call, reading none of it."""
    make = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[handler.request_streaming, handler.response_streaming]
    return make(_refuse)


class _AddMetadata:
    def __init__(self, metadata: tuple[tuple[str, str | bytes], ...]):
        self._metadata = metadata

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(details.metadata or ()), *self._metadata)
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                          details.wait_for_ready)


class _UnaryUnary(_AddMetadata, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _UnaryStream(_AddMetadata, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):
        return await continuation(self._details(details), request)


class _StreamUnary(_AddMetadata, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


class _StreamStream(_AddMetadata, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):
        return await continuation(self._details(details), request_iterator)


_CLIENT_INTERCEPTORS = (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)
