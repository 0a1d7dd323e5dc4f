"""TRANSPORT_GRPC, both ends: the prompt's KV streamed to the decode replica's `KVTransfer.Push`.

Any host, any device. Prefill end (`GrpcSender`): the stream goes layer by layer; each `KVChunk`
holds the K and V bytes of some of the request's blocks in one layer and names the decode block
ids it fills, at most `max_chunk_bytes` of bytes and ids together (a whole layer, for all but the
longest prompts), so that the whole message fits the receiver's limit
(protocol.message_limits). The first chunk carries the layout, the final one `last=True`. A chunk is gathered and
encoded on a worker thread, its blocks copied once, straight into the message bytes
(kvtransfer/chunk_wire.py). With `layers_ready` (the layer numbers, in order, as the prefill
forward pass completes them) the stream starts while later layers are still being computed: each
layer is sent as soon as it is announced, so the transfer overlaps the prefill compute instead of
following it.

Decode end (`receive_push`, served by kvtransfer/receiver.py), per chunk: request id consistent
-> layout (first chunk, FAILED_PRECONDITION) -> reservation still there (NOT_FOUND) and the
chunk's write token its own (PERMISSION_DENIED), both checked on every chunk, so an expiry
mid-stream stops the writes -> layer and block ids inside the reservation (INVALID_ARGUMENT /
PERMISSION_DENIED) -> byte sizes (INVALID_ARGUMENT) -> write, holding the reservation until the
bytes are in (even if the push is cancelled meanwhile), so its blocks cannot be reused under the
write. A stream that ends or breaks before `last` lands nothing. No refusal names block ids; a
refused stream is read to its end, unwritten, before the refusal is sent (kvtransfer/receiver.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import grpc
import numpy as np
import torch

from pdserve.engine.device_guard import on_device
from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.base import TransferResult, validate_send
from pdserve.kvtransfer.chunk_wire import MalformedChunk, ReceivedChunk, encode_chunk
from pdserve.kvtransfer.layout import KVLayout
from pdserve.kvtransfer.pool import KVPool
from pdserve.kvtransfer.rpc import ChannelFactory, KVTransferClient, Refusal
from pdserve.kvtransfer.target import KVTarget
from pdserve.kvtransfer.wire import layout_from_proto, layout_to_proto
from pdserve.protocol.errors import PrefillKVError
from pdserve.protocol.message_limits import MAX_MESSAGE_BYTES
from pdserve.v1 import common_pb2, kv_transfer_pb2

logger = logging.getLogger(__name__)

# A chunk's blocks (K, V and id of each) take at most max_chunk_bytes; the rest of its header
# (request id, layout, write token, field tags) at most CHUNK_HEADER_ROOM_BYTES. By default the
# two fill the message limit of pdserve's servers: a whole layer of most prompts.
CHUNK_HEADER_ROOM_BYTES = 64 * 2**10
DEFAULT_MAX_CHUNK_BYTES = MAX_MESSAGE_BYTES - CHUNK_HEADER_ROOM_BYTES
_MAX_BLOCK_ID_BYTES = 5  # a uint32 varint


def target_fields(pool: KVPool) -> dict[str, object]:
    """The pool's part of a TRANSPORT_GRPC `KVTarget`: any pool can be pushed to."""
    return {"pool_num_blocks": pool.num_blocks}


class GrpcSender:
    transport = common_pb2.TRANSPORT_GRPC
    streams_layers = True

    def __init__(self, local_layout: KVLayout, rpc_timeout_s: float, open_channel: ChannelFactory = grpc.aio.insecure_channel,
                 max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES):
        self._layout = local_layout
        self._spec = KVCacheSpec.from_layout(local_layout)
        self._client = KVTransferClient(rpc_timeout_s, open_channel)
        self._max_chunk_bytes = max_chunk_bytes

    async def send(
        self,
        request_id: str,
        kv_cache: torch.Tensor,  # [num_layers, 2, num_blocks, block_size, num_kv_heads, entry_size]
        block_ids: Sequence[int],
        target: KVTarget,
        layers_ready: AsyncIterator[int] | None = None,
    ) -> TransferResult:
        start_s = time.perf_counter()
        validate_send(self._layout, request_id, kv_cache, block_ids, target)
        chunks = self._chunks(request_id, kv_cache, list(block_ids), list(target.block_ids), target.write_token,
                              layers_ready)
        await self._client.push(request_id, target, chunks)
        num_bytes = len(block_ids) * self._spec.bytes_per_block
        seconds = time.perf_counter() - start_s
        logger.debug("request %s: %d KV bytes over grpc in %.4f s", request_id, num_bytes, seconds)
        return TransferResult(num_bytes=num_bytes, seconds=seconds, transport=self.transport)

    async def _chunks(
        self, request_id: str, kv_cache: torch.Tensor, src_block_ids: list[int], dst_block_ids: list[int],
        write_token: bytes, layers_ready: AsyncIterator[int] | None,
    ) -> AsyncIterator[bytes]:
        """The encoded `KVChunk`s of the request, each layer's as soon as it is ready."""
        blocks_per_chunk = max(1, self._max_chunk_bytes // (self._spec.bytes_per_layer_block + _MAX_BLOCK_ID_BYTES))
        num_layers = self._spec.num_layers
        # (layer, first position) of every chunk; an empty request still sends one final chunk.
        spans = [
            (layer, start)
            for layer in range(num_layers)
            for start in range(0, max(1, len(src_block_ids)), blocks_per_chunk)
        ]
        num_layers_ready = num_layers if layers_ready is None else 0
        for index, (layer, start) in enumerate(spans):
            while layer >= num_layers_ready:
                announced = await anext(layers_ready)
                if announced != num_layers_ready:
                    raise PrefillKVError(f"request {request_id}: layer {announced} announced before {num_layers_ready}")
                num_layers_ready += 1
            header = kv_transfer_pb2.KVChunk(
                request_id=request_id,
                layout=layout_to_proto(self._layout) if index == 0 else None,
                layer=layer,
                block_ids=dst_block_ids[start : start + blocks_per_chunk],
                last=index == len(spans) - 1,
                write_token=write_token,
            )
            src_ids = src_block_ids[start : start + blocks_per_chunk]
            encode = on_device(kv_cache.device, _encode_chunk)
            yield await asyncio.to_thread(encode, header, kv_cache, layer, src_ids)

    async def close(self) -> None:
        await self._client.close()


def _encode_chunk(header: kv_transfer_pb2.KVChunk, kv_cache: torch.Tensor, layer: int, block_ids: list[int]) -> bytes:
    """The encoded chunk of `header` carrying the K and V of `block_ids` in `layer`."""
    index = torch.tensor(block_ids, dtype=torch.long, device=kv_cache.device)
    key_value = kv_cache[layer].index_select(1, index).cpu()  # [2, n, block_size, num_kv_heads, entry_size]
    key, value = (memoryview(key_value[kv].view(torch.uint8).numpy()) for kv in (0, 1))
    return encode_chunk(header, key, value)


class DecodeEnd(Protocol):
    """What the KVTransfer service checks for every transport (kvtransfer/receiver.py); each
    method raises Refusal."""

    def check_layout(self, remote: KVLayout | None) -> None: ...

    def writing(self, request_id: str, write_token: bytes) -> contextlib.AbstractContextManager[list[int]]:
        """The reserved blocks, held for a write while the block runs."""

    def land(self, request_id: str, write_token: bytes, num_bytes: int) -> None: ...


async def receive_push(
    chunks: AsyncIterator[ReceivedChunk | MalformedChunk | kv_transfer_pb2.KVChunk], end: DecodeEnd, pool: KVPool
) -> kv_transfer_pb2.KVAck:
    """Writes one request's pushed chunks into its reserved blocks of `pool`; raises Refusal.

    Chunks come as `decode_chunk` leaves them (KVReceiver.add_to_server), or parsed by protobuf
    (the generated `add_KVTransferServicer_to_server`), which costs two more copies of the payload.
    """
    spec = pool.spec
    request_id: str | None = None
    written_block_ids: list[set[int]] = [set() for _ in range(spec.num_layers)]
    num_bytes = 0
    async for received in chunks:
        if isinstance(received, MalformedChunk):
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"malformed KV chunk: {received.reason}")
        if isinstance(received, kv_transfer_pb2.KVChunk):
            # Read once: every read copies the field out of the message.
            received = ReceivedChunk(received, memoryview(received.key), memoryview(received.value))
        chunk, key, value = received.header, received.key, received.value
        if request_id is None:
            request_id = chunk.request_id
            end.check_layout(layout_from_proto(chunk.layout) if chunk.HasField("layout") else None)
        elif chunk.request_id != request_id:
            raise Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"push for request {request_id} carries a chunk of request {chunk.request_id}",
            )
        with end.writing(request_id, chunk.write_token) as reserved:
            _check_chunk(spec, request_id, chunk, key, value, set(reserved))
            write = on_device(pool.tensor.device, _write)
            await _finish_even_if_cancelled(asyncio.to_thread(write, pool, chunk.layer, list(chunk.block_ids), key, value))
        written_block_ids[chunk.layer].update(chunk.block_ids)
        num_bytes += key.nbytes + value.nbytes
        if chunk.last:
            _check_complete(request_id, reserved, written_block_ids)
            end.land(request_id, chunk.write_token, num_bytes)
            return kv_transfer_pb2.KVAck(request_id=request_id, num_bytes=num_bytes)
    raise Refusal(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"KV push for request {request_id} ended before its last chunk" if request_id else "empty KV push",
    )


def _check_chunk(
    spec: KVCacheSpec, request_id: str, chunk: kv_transfer_pb2.KVChunk, key: memoryview, value: memoryview, reserved: set[int]
) -> None:
    if chunk.layer >= spec.num_layers:
        raise Refusal(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"request {request_id}: layer {chunk.layer} of a {spec.num_layers}-layer model",
        )
    if len(set(chunk.block_ids)) != len(chunk.block_ids):
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"request {request_id}: repeated block ids in a chunk")
    if not reserved.issuperset(chunk.block_ids):
        raise Refusal(
            grpc.StatusCode.PERMISSION_DENIED,
            f"request {request_id}: the chunk names blocks not reserved for it",
        )
    expected_bytes = len(chunk.block_ids) * spec.bytes_per_layer_block // 2  # K (or V) alone
    if key.nbytes != expected_bytes or value.nbytes != expected_bytes:
        raise Refusal(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"request {request_id}: {len(chunk.block_ids)} blocks need {expected_bytes} bytes each "
            f"of key and value, the chunk has {key.nbytes} and {value.nbytes}",
        )


def _check_complete(request_id: str, reserved: list[int], written_block_ids: list[set[int]]) -> None:
    reserved_set = set(reserved)
    for layer, written in enumerate(written_block_ids):
        if written != reserved_set:
            raise Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"request {request_id}: last chunk arrived with layer {layer} missing "
                f"{len(reserved_set - written)} of its {len(reserved_set)} blocks",
            )


async def _finish_even_if_cancelled(write) -> None:
    """Awaits `write`; if the caller is cancelled meanwhile, still waits for the write to end
    before the cancellation goes on (a thread cannot be stopped mid-copy)."""
    task = asyncio.ensure_future(write)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await asyncio.wait([task])
        raise


def _write(pool: KVPool, layer: int, block_ids: list[int], key: memoryview, value: memoryview) -> None:
    """Scatters the chunk's K and V blocks from the received bytes into `block_ids` of `layer`."""
    if not block_ids:
        return
    tensor = pool.tensor  # [num_layers, 2, num_blocks, block_size, num_kv_heads, entry_size]
    for kv, data in ((0, key), (1, value)):
        blocks = np.frombuffer(data, dtype=np.uint8).reshape(len(block_ids), -1)  # [n, bytes per K (or V) block]
        dst = tensor[layer, kv].view(pool.num_blocks, -1).view(torch.uint8)  # [num_blocks, bytes per block]
        if dst.is_cpu:
            # numpy reads the received bytes where they lie (torch only wraps writable buffers
            # without a warning) and scatters whole blocks at copy speed.
            dst.numpy()[block_ids] = blocks
        else:
            index = torch.tensor(block_ids, dtype=torch.long, device=dst.device)
            dst.index_copy_(0, index, torch.from_numpy(blocks.copy()).to(dst.device))
