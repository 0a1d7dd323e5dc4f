"""The decode replica's side of a KV transfer: the `KVTransfer` gRPC service over its pool.

Invariant: bytes land only in blocks reserved for the request that sends them, only while the
reservation lasts, and only after the sender's layout matched ours; `mark_landed` is called
once every layer of every reserved block has been written (Push) or declared written (Commit).

Push, per chunk: request id consistent -> layout (first chunk, FAILED_PRECONDITION) ->
reservation still held (NOT_FOUND, checked on every chunk, so an expiry mid-stream stops the
writes) -> layer and block ids inside the reservation (INVALID_ARGUMENT / PERMISSION_DENIED) ->
byte sizes (INVALID_ARGUMENT) -> write. A stream that ends or breaks before `last` lands nothing.
"""
from __future__ import annotations

import asyncio
from typing import Protocol

import grpc
import torch

from engine.errors import PdserveError
from engine.kv_cache import KVCacheSpec
from kvtransfer.errors import LayoutMismatchError
from kvtransfer.layout import check_layout
from kvtransfer.pool import KVPool
from pdserve.v1 import common_pb2, kv_transfer_pb2, kv_transfer_pb2_grpc


class ReservationView(Protocol):
    """The decode replica's reservations, as the receiver needs them; thread-safe on its side."""

    def block_ids(self, request_id: str) -> list[int] | None:
        """The blocks reserved for `request_id`, or None if it holds no reservation."""

    def mark_landed(self, request_id: str, num_bytes: int) -> None:
        """The request's KV is complete in its reserved blocks."""


class _Refusal(Exception):
    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


class KVReceiver(kv_transfer_pb2_grpc.KVTransferServicer):
    def __init__(self, pool: KVPool, local_layout: common_pb2.KVLayout, reservations: ReservationView):
        self._spec = KVCacheSpec.from_layout(local_layout)
        self._spec.check(pool.tensor)
        self._pool = pool.tensor  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        self._layout = local_layout
        self._reservations = reservations

    async def Push(self, request_iterator, context: grpc.aio.ServicerContext) -> kv_transfer_pb2.KVAck:
        try:
            return await self._push(request_iterator)
        except _Refusal as refusal:
            await context.abort(refusal.code, str(refusal))

    async def Commit(self, request: kv_transfer_pb2.KVCommit, context: grpc.aio.ServicerContext) -> kv_transfer_pb2.KVAck:
        try:
            self._check_layout(request.layout if request.HasField("layout") else None)
            reserved = self._reserved(request.request_id)
            expected_bytes = len(reserved) * self._spec.bytes_per_block
            if request.num_bytes != expected_bytes:
                raise _Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"request {request.request_id}: commit of {request.num_bytes} bytes, its "
                    f"{len(reserved)} reserved blocks hold {expected_bytes}",
                )
            self._land(request.request_id, request.num_bytes)
        except _Refusal as refusal:
            await context.abort(refusal.code, str(refusal))
        return kv_transfer_pb2.KVAck(request_id=request.request_id, num_bytes=request.num_bytes)

    async def _push(self, request_iterator) -> kv_transfer_pb2.KVAck:
        request_id: str | None = None
        written_block_ids: list[set[int]] = [set() for _ in range(self._spec.num_layers)]
        num_bytes = 0
        async for chunk in request_iterator:
            if request_id is None:
                request_id = chunk.request_id
                self._check_layout(chunk.layout if chunk.HasField("layout") else None)
            elif chunk.request_id != request_id:
                raise _Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"push for request {request_id} carries a chunk of request {chunk.request_id}",
                )
            reserved = self._reserved(request_id)
            self._check_chunk(request_id, chunk, set(reserved))
            await asyncio.to_thread(self._write, chunk.layer, list(chunk.block_ids), chunk.key, chunk.value)
            written_block_ids[chunk.layer].update(chunk.block_ids)
            num_bytes += len(chunk.key) + len(chunk.value)
            if chunk.last:
                self._check_complete(request_id, reserved, written_block_ids)
                self._land(request_id, num_bytes)
                return kv_transfer_pb2.KVAck(request_id=request_id, num_bytes=num_bytes)
        raise _Refusal(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"KV push for request {request_id} ended before its last chunk" if request_id else "empty KV push",
        )

    def _check_layout(self, remote: common_pb2.KVLayout | None) -> None:
        if remote is None:
            raise _Refusal(grpc.StatusCode.FAILED_PRECONDITION, "KV transfer carries no layout")
        try:
            check_layout(self._layout, remote, "decode", "prefill")
        except LayoutMismatchError as error:
            raise _Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(error)) from error

    def _reserved(self, request_id: str) -> list[int]:
        reserved = self._reservations.block_ids(request_id)
        if reserved is None:
            raise _Refusal(
                grpc.StatusCode.NOT_FOUND,
                f"request {request_id} holds no KV reservation here (unknown, expired or released)",
            )
        return reserved

    def _check_chunk(self, request_id: str, chunk: kv_transfer_pb2.KVChunk, reserved: set[int]) -> None:
        if chunk.layer >= self._spec.num_layers:
            raise _Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request {request_id}: layer {chunk.layer} of a {self._spec.num_layers}-layer model",
            )
        if len(set(chunk.block_ids)) != len(chunk.block_ids):
            raise _Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"request {request_id}: repeated block ids in a chunk")
        foreign = sorted(set(chunk.block_ids) - reserved)
        if foreign:
            raise _Refusal(
                grpc.StatusCode.PERMISSION_DENIED,
                f"request {request_id}: blocks {foreign} are not reserved for it",
            )
        expected_bytes = len(chunk.block_ids) * self._spec.bytes_per_layer_block // 2  # K (or V) alone
        if len(chunk.key) != expected_bytes or len(chunk.value) != expected_bytes:
            raise _Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request {request_id}: {len(chunk.block_ids)} blocks need {expected_bytes} bytes each "
                f"of key and value, the chunk has {len(chunk.key)} and {len(chunk.value)}",
            )

    def _check_complete(self, request_id: str, reserved: list[int], written_block_ids: list[set[int]]) -> None:
        reserved_set = set(reserved)
        for layer, written in enumerate(written_block_ids):
            if written != reserved_set:
                raise _Refusal(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"request {request_id}: last chunk arrived with layer {layer} missing blocks "
                    f"{sorted(reserved_set - written)}",
                )

    def _land(self, request_id: str, num_bytes: int) -> None:
        try:
            self._reservations.mark_landed(request_id, num_bytes)
        except PdserveError as error:
            raise _Refusal(grpc.StatusCode.FAILED_PRECONDITION, str(error)) from error

    def _write(self, layer: int, block_ids: list[int], key: bytes, value: bytes) -> None:
        if not block_ids:
            return
        index = torch.tensor(block_ids, dtype=torch.long, device=self._pool.device)
        for kv, data in ((0, key), (1, value)):
            # bytearray: torch only wraps writable buffers without a warning.
            blocks = torch.frombuffer(bytearray(data), dtype=self._pool.dtype)
            blocks = blocks.view(len(block_ids), *self._spec.block_shape)  # [n, block_size, num_kv_heads, head_dim]
            self._pool[layer, kv].index_copy_(0, index, blocks.to(self._pool.device))
