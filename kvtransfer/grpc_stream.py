"""TRANSPORT_GRPC: the prompt's KV streamed to the decode replica's `KVTransfer.Push`.

Any host, any device. The stream goes layer by layer; each `KVChunk` holds the K and V bytes of
some of the request's blocks in one layer, at most `max_chunk_bytes` of them (so a chunk fits
gRPC's default 4 MiB message limit), and names the decode block ids it fills. The first chunk
carries the layout, the final one `last=True`. Chunk bytes are gathered on a worker thread.

With `layers_ready` (the layer numbers, in order, as the prefill forward pass completes them) the
stream starts while later layers are still being computed: each layer is sent as soon as it is
announced, so the transfer overlaps the prefill compute instead of following it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence

import torch

from engine.kv_cache import KVCacheSpec
from kvtransfer.base import TransferResult, validate_send
from kvtransfer.errors import TransferError
from kvtransfer.rpc import KVTransferClient
from pdserve.v1 import common_pb2, decode_pb2, kv_transfer_pb2

logger = logging.getLogger(__name__)

DEFAULT_MAX_CHUNK_BYTES = 3 * 2**20


class GrpcSender:
    def __init__(
        self, local_layout: common_pb2.KVLayout, rpc_timeout_s: float, max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    ):
        self._layout = local_layout
        self._spec = KVCacheSpec.from_layout(local_layout)
        self._client = KVTransferClient(rpc_timeout_s)
        self._max_chunk_bytes = max_chunk_bytes

    async def send(
        self,
        request_id: str,
        kv_cache: torch.Tensor,  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        block_ids: Sequence[int],
        target: decode_pb2.KVTarget,
        layers_ready: AsyncIterator[int] | None = None,
    ) -> TransferResult:
        start_s = time.perf_counter()
        validate_send(self._layout, request_id, kv_cache, block_ids, target)
        chunks = self._chunks(request_id, kv_cache, list(block_ids), list(target.block_ids), layers_ready)
        await self._client.push(request_id, target, chunks)
        num_bytes = len(block_ids) * self._spec.bytes_per_block
        seconds = time.perf_counter() - start_s
        logger.debug("request %s: %d KV bytes over grpc in %.4f s", request_id, num_bytes, seconds)
        return TransferResult(num_bytes=num_bytes, seconds=seconds, transport=common_pb2.TRANSPORT_GRPC)

    async def _chunks(
        self, request_id: str, kv_cache: torch.Tensor, src_block_ids: list[int], dst_block_ids: list[int],
        layers_ready: AsyncIterator[int] | None,
    ) -> AsyncIterator[kv_transfer_pb2.KVChunk]:
        blocks_per_chunk = max(1, self._max_chunk_bytes // self._spec.bytes_per_layer_block)
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
                    raise TransferError(f"request {request_id}: layer {announced} announced before {num_layers_ready}")
                num_layers_ready += 1
            src_ids = src_block_ids[start : start + blocks_per_chunk]
            key, value = await asyncio.to_thread(_layer_bytes, kv_cache, layer, src_ids)
            yield kv_transfer_pb2.KVChunk(
                request_id=request_id,
                layout=self._layout if index == 0 else None,
                layer=layer,
                block_ids=dst_block_ids[start : start + blocks_per_chunk],
                key=key,
                value=value,
                last=index == len(spans) - 1,
            )

    async def close(self) -> None:
        await self._client.close()


def _layer_bytes(kv_cache: torch.Tensor, layer: int, block_ids: list[int]) -> tuple[bytes, bytes]:
    """The K and V bytes of `block_ids` in `layer`, each [n, block_size, num_kv_heads, head_dim]."""
    index = torch.tensor(block_ids, dtype=torch.long, device=kv_cache.device)
    key_value = kv_cache[layer].index_select(1, index).cpu()  # [2, n, block_size, num_kv_heads, head_dim]
    return _as_bytes(key_value[0]), _as_bytes(key_value[1])


def _as_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()
