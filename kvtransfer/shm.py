"""TRANSPORT_SHM: the prefill replica writes straight into the decode pool's shared memory.

Same host, CPU pools. The decode pool's segment is mapped once per name and kept; blocks are
copied in place on a worker thread, then `KVTransfer.Commit` tells the decode replica they are
complete. This side never unlinks a segment: the decode replica owns it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import torch

from kvtransfer.base import (
    TransferResult, check_in_place_target, decode_pool_shape, num_block_bytes, validate_send,
)
from kvtransfer.errors import TransferError
from kvtransfer.pool import copy_blocks, map_shared_pool
from kvtransfer.rpc import KVTransferClient
from pdserve.v1 import common_pb2, decode_pb2

logger = logging.getLogger(__name__)


class ShmSender:
    def __init__(self, local_layout: common_pb2.KVLayout, rpc_timeout_s: float):
        self._layout = local_layout
        self._client = KVTransferClient(rpc_timeout_s)
        self._pools: dict[str, torch.Tensor] = {}  # shm name -> the decode pool, mapped

    def _decode_pool(self, target: decode_pb2.KVTarget, dtype: torch.dtype) -> torch.Tensor:
        if not target.shm_name:
            raise TransferError(f"KV target of request {target.request_id} names no shared memory")
        shape = decode_pool_shape(self._layout, target.pool_num_blocks)
        pool = self._pools.get(target.shm_name)
        if pool is None or tuple(pool.shape) != shape:
            pool = map_shared_pool(target.shm_name, shape, dtype)
            self._pools[target.shm_name] = pool
        return pool

    async def send(
        self,
        request_id: str,
        kv_cache: torch.Tensor,  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        block_ids: Sequence[int],
        target: decode_pb2.KVTarget,
    ) -> TransferResult:
        start_s = time.perf_counter()
        validate_send(self._layout, request_id, kv_cache, block_ids, target)
        check_in_place_target(request_id, target)
        decode_pool = self._decode_pool(target, kv_cache.dtype)
        await asyncio.to_thread(copy_blocks, decode_pool, list(target.block_ids), kv_cache, list(block_ids))
        num_bytes = num_block_bytes(kv_cache, len(block_ids))
        await self._client.commit(request_id, target, self._layout, num_bytes)
        seconds = time.perf_counter() - start_s
        logger.debug("request %s: %d KV bytes over shm in %.4f s", request_id, num_bytes, seconds)
        return TransferResult(num_bytes=num_bytes, seconds=seconds, transport=common_pb2.TRANSPORT_SHM)

    async def close(self) -> None:
        self._pools.clear()
        await self._client.close()
