"""The decode replica's side of a KV transfer: the `KVTransfer` gRPC service over its pool.

Invariant: bytes land only in blocks reserved for the request that sends them, only from a
sender that presents the reservation's write token (else PERMISSION_DENIED, nothing written),
only while the reservation lasts, and only after the sender's layout matched ours; a Push holds
the reservation while each chunk is written, so its blocks cannot be handed to another request
under the write. `mark_landed` is called once every layer of every reserved block has been
written (Push, whose chunks kvtransfer/grpc_stream.py checks and writes) or declared written in
place (Commit, from shm or cuda_ipc, checked against the reservation as it is then). No refusal
names block ids: they are not the caller's to learn.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

import grpc

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.chunk_wire import decode_chunk_or_malformed
from pdserve.kvtransfer.grpc_stream import receive_push
from pdserve.kvtransfer.layout import KVLayout, check_layout
from pdserve.kvtransfer.pool import KVPool
from pdserve.kvtransfer.rpc import Refusal
from pdserve.kvtransfer.wire import layout_from_proto
from pdserve.protocol.errors import NotFoundError, PreconditionError, LayoutMismatchError, WriteTokenError
from pdserve.v1 import kv_transfer_pb2, kv_transfer_pb2_grpc


class ReservationView(Protocol):
    """The decode replica's reservations, as the receiver needs them; thread-safe on its side."""

    def begin_write(self, request_id: str, write_token: bytes) -> list[int]:
        """The blocks reserved for `request_id`, held until `end_write`. Raises NotFoundError (no
        such reservation, or expired), PreconditionError (not awaiting KV), WriteTokenError."""

    def end_write(self, request_id: str) -> None: ...

    def mark_landed(self, request_id: str, write_token: bytes, num_bytes: int) -> None:
        """The request's KV is complete in its reserved blocks; raises as `begin_write`."""


class KVReceiver(kv_transfer_pb2_grpc.KVTransferServicer):
    def __init__(self, pool: KVPool, local_layout: KVLayout, reservations: ReservationView):
        if KVCacheSpec.from_layout(local_layout) != pool.spec:
            raise LayoutMismatchError(f"KV pool of {pool.spec} does not match the replica's layout {local_layout}")
        self._pool = pool
        self._layout = local_layout
        self._reservations = reservations

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Serves KVTransfer on `server`, like the generated `add_KVTransferServicer_to_server`,
        except that Push leaves each chunk's payload in the received message (chunk_wire.py)."""
        handlers = {
            "Push": grpc.stream_unary_rpc_method_handler(
                self.Push, request_deserializer=decode_chunk_or_malformed,
                response_serializer=kv_transfer_pb2.KVAck.SerializeToString,
            ),
            "Commit": grpc.unary_unary_rpc_method_handler(
                self.Commit, request_deserializer=kv_transfer_pb2.KVCommit.FromString,
                response_serializer=kv_transfer_pb2.KVAck.SerializeToString,
            ),
        }
        service_name = kv_transfer_pb2.DESCRIPTOR.services_by_name["KVTransfer"].full_name
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service_name, handlers),))

    async def Push(self, request_iterator, context: grpc.aio.ServicerContext) -> kv_transfer_pb2.KVAck:
        try:
            return await receive_push(request_iterator, self, self._pool)
        except Refusal as refusal:
            # The rest of the stream is read (and dropped) before the refusal is sent: grpcio's
            # asyncio client reports a write that fails after the call ended as INTERNAL, in
            # place of the status the server sent. The caller's deadline bounds the wait.
            async for _ in request_iterator:
                pass
            await context.abort(refusal.code, str(refusal))

    async def Commit(self, request: kv_transfer_pb2.KVCommit, context: grpc.aio.ServicerContext) -> kv_transfer_pb2.KVAck:
        try:
            self.check_layout(layout_from_proto(request.layout) if request.HasField("layout") else None)
            with self.writing(request.request_id, request.write_token) as reserved:
                expected_bytes = len(reserved) * self._pool.spec.bytes_per_block
            if request.num_bytes != expected_bytes:
                raise Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"request {request.request_id}: commit of {request.num_bytes} bytes, its "
                    f"{len(reserved)} reserved blocks hold {expected_bytes}",
                )
            self.land(request.request_id, request.write_token, request.num_bytes)
        except Refusal as refusal:
            await context.abort(refusal.code, str(refusal))
        return kv_transfer_pb2.KVAck(request_id=request.request_id, num_bytes=request.num_bytes)

    # What every transport's decode end checks (grpc_stream.DecodeEnd); each raises Refusal.
    def check_layout(self, remote: KVLayout | None) -> None:
        if remote is None:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, "KV transfer carries no layout")
        try:
            check_layout(self._layout, remote, "decode", "prefill")
        except LayoutMismatchError as error:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(error)) from error

    @contextlib.contextmanager
    def writing(self, request_id: str, write_token: bytes) -> Iterator[list[int]]:
        with _refused_as_status():
            reserved = self._reservations.begin_write(request_id, write_token)
        try:
            yield reserved
        finally:
            self._reservations.end_write(request_id)

    def land(self, request_id: str, write_token: bytes, num_bytes: int) -> None:
        with _refused_as_status():
            self._reservations.mark_landed(request_id, write_token, num_bytes)


@contextlib.contextmanager
def _refused_as_status() -> Iterator[None]:
    """A reservation that is gone is NOT_FOUND, one in the wrong state FAILED_PRECONDITION, and a
    wrong write token PERMISSION_DENIED."""
    try:
        yield
    except NotFoundError as error:
        raise Refusal(grpc.StatusCode.NOT_FOUND, str(error)) from error
    except WriteTokenError as error:
        raise Refusal(grpc.StatusCode.PERMISSION_DENIED, str(error)) from error
    except PreconditionError as error:
        raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(error)) from error
