"""The senders that write straight into the decode pool's memory (shm, cuda_ipc), and then say so.

    validate → check the target's blocks and deadline → open the decode pool (once per pool)
             → copy the blocks on a worker thread → KVTransfer.Commit

A subclass says how to open a target's pool (`_open_pool`, which may refuse the source pool too)
and how to copy into it (`_copy`). Invariant: Commit is sent only after the copy has finished, so
the decode replica never reads a half-written block; a send that raises commits nothing.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import torch

from engine.kv_cache import KVCacheSpec
from kvtransfer.base import TransferResult, check_in_place_target, validate_send
from kvtransfer.choice import transport_name
from kvtransfer.rpc import KVTransferClient
from pdserve.v1 import common_pb2, decode_pb2

logger = logging.getLogger(__name__)


class InPlaceSender:
    transport: int  # common_pb2.Transport

    def __init__(self, local_layout: common_pb2.KVLayout, rpc_timeout_s: float):
        self._layout = local_layout
        self._spec = KVCacheSpec.from_layout(local_layout)
        self._client = KVTransferClient(rpc_timeout_s)
        self._pools: dict[str | bytes, torch.Tensor] = {}  # pool handle -> the decode pool, opened

    def _open_pool(self, target: decode_pb2.KVTarget, kv_cache: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _copy(self, dst: torch.Tensor, dst_block_ids: list[int], src: torch.Tensor, src_block_ids: list[int]) -> None:
        raise NotImplementedError

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
        decode_pool = self._open_pool(target, kv_cache)
        await asyncio.to_thread(self._copy, decode_pool, list(target.block_ids), kv_cache, list(block_ids))
        num_bytes = len(block_ids) * self._spec.bytes_per_block
        await self._client.commit(request_id, target, self._layout, num_bytes)
        seconds = time.perf_counter() - start_s
        logger.debug("request %s: %d KV bytes over %s in %.4f s",
                     request_id, num_bytes, transport_name(self.transport), seconds)
        return TransferResult(num_bytes=num_bytes, seconds=seconds, transport=self.transport)

    async def close(self) -> None:
        self._pools.clear()
        await self._client.close()
