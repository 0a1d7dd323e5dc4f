"""The decode replica's side of a KV transfer: the `KVTransfer` gRPC service over its pool.

Invariant: bytes land only in blocks reserved for the request that sends them, only while the
reservation lasts, and only after the sender's layout matched ours; `mark_landed` is called
once every layer of every reserved block has been written (Push, whose chunks kvtransfer/
grpc_stream.py checks and writes) or declared written in place (Commit, from shm or cuda_ipc).
"""
from __future__ import annotations

from typing import Protocol

import grpc

from engine.errors import PdserveError
from engine.kv_cache import KVCacheSpec
from kvtransfer.chunk_wire import decode_chunk_or_malformed
from kvtransfer.errors import LayoutMismatchError
from kvtransfer.grpc_stream import receive_push
from kvtransfer.layout import KVLayout, check_layout
from kvtransfer.pool import KVPool
from kvtransfer.rpc import Refusal
from kvtransfer.wire import layout_from_proto
from pdserve.v1 import kv_transfer_pb2, kv_transfer_pb2_grpc


class ReservationView(Protocol):
    """The decode replica's reservations, as the receiver needs them; thread-safe on its side."""

    def block_ids(self, request_id: str) -> list[int] | None:
        """The blocks reserved for `request_id`, or None if it holds no reservation."""

    def mark_landed(self, request_id: str, num_bytes: int) -> None:
        """The request's KV is complete in its reserved blocks."""


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
            await context.abort(refusal.code, str(refusal))

    async def Commit(self, request: kv_transfer_pb2.KVCommit, context: grpc.aio.ServicerContext) -> kv_transfer_pb2.KVAck:
        try:
            self.check_layout(layout_from_proto(request.layout) if request.HasField("layout") else None)
            reserved = self.reserved(request.request_id)
            expected_bytes = len(reserved) * self._pool.spec.bytes_per_block
            if request.num_bytes != expected_bytes:
                raise Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"request {request.request_id}: commit of {request.num_bytes} bytes, its "
                    f"{len(reserved)} reserved blocks hold {expected_bytes}",
                )
            self.land(request.request_id, request.num_bytes)
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

    def reserved(self, request_id: str) -> list[int]:
        reserved = self._reservations.block_ids(request_id)
        if reserved is None:
            raise Refusal(
                grpc.StatusCode.NOT_FOUND,
                f"request {request_id} holds no KV reservation here (unknown, expired or released)",
            )
        return reserved

    def land(self, request_id: str, num_bytes: int) -> None:
        try:
            self._reservations.mark_landed(request_id, num_bytes)
        except PdserveError as error:
            raise Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(error)) from error
