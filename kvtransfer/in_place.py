"""The senders that write straight into the decode pool's memory (shm, cuda_ipc), and then say so.

    validate → check the target's blocks and deadline → open the decode pool (once per pool)
             → on a worker thread: hold the reservation's write fence → copy the blocks → drop it
             → check the deadline again → KVTransfer.Commit, with the target's write token

A subclass says how to open a target's pool (`_open_pool`, which may refuse the source pool too,
and returns the pool as its `_copy` takes it) and how to copy into it (`_copy`, on a worker
thread, usually through `copy_blocks`). Invariant: Commit is sent only after the copy has
finished, so the decode replica never reads a half-written block; a send that raises commits
nothing. The blocks written are those of the target, which only the caller of Reserve got, and
only while its reservation lasts: the copy runs under the write fence (kvtransfer/write_fence.py),
which the decode replica cannot close while the copy holds it and which no copy passes once
closed, so a sender paused anywhere, however long, never writes into blocks given to another
request (decode_svc/reservations.py).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import grpc
import numpy as np
import torch

from pdserve.engine.device_guard import on_device
from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.base import TransferResult, validate_send
from pdserve.kvtransfer.layout import KVLayout
from pdserve.kvtransfer.rpc import ChannelFactory, KVTransferClient
from pdserve.kvtransfer.target import KVTarget
from pdserve.kvtransfer.write_fence import hold
from pdserve.protocol.errors import TransferError
from pdserve.protocol.transport_choice import transport_name

logger = logging.getLogger(__name__)


class InPlaceSender:
    transport: int  # common_pb2.Transport
    streams_layers = False

    def __init__(self, local_layout: KVLayout, rpc_timeout_s: float, open_channel: ChannelFactory = grpc.aio.insecure_channel):
        self._layout = local_layout
        self._spec = KVCacheSpec.from_layout(local_layout)
        self._client = KVTransferClient(rpc_timeout_s, open_channel)
        self._pools: dict[str | bytes, torch.Tensor] = {}  # pool handle -> the decode pool, opened

    def _open_pool(self, target: KVTarget, kv_cache: torch.Tensor) -> Any:
        raise NotImplementedError

    def _copy(self, dst: Any, dst_block_ids: list[int], src: torch.Tensor, src_block_ids: list[int]) -> None:
        raise NotImplementedError

    async def send(
        self,
        request_id: str,
        kv_cache: torch.Tensor,  # [num_layers, 2, num_blocks, block_size, num_kv_heads, entry_size]
        block_ids: Sequence[int],
        target: KVTarget,
        layers_ready: None = None,
    ) -> TransferResult:
        start_s = time.perf_counter()
        validate_send(self._layout, request_id, kv_cache, block_ids, target)
        _check_in_place_target(request_id, target)
        decode_pool = self._open_pool(target, kv_cache)
        copy = on_device(kv_cache.device, self._fenced_copy)
        await asyncio.to_thread(copy, decode_pool, target, kv_cache, list(block_ids))
        _check_deadline(request_id, target, "the copy ended")
        num_bytes = len(block_ids) * self._spec.bytes_per_block
        await self._client.commit(request_id, target, self._layout, num_bytes)
        seconds = time.perf_counter() - start_s
        logger.debug("request %s: %d KV bytes over %s in %.4f s",
                     request_id, num_bytes, transport_name(self.transport), seconds)
        return TransferResult(num_bytes=num_bytes, seconds=seconds, transport=self.transport)

    def _fenced_copy(self, dst: Any, target: KVTarget, src: torch.Tensor, src_block_ids: list[int]) -> None:
        with hold(target):
            self._copy(dst, list(target.block_ids), src, src_block_ids)

    async def close(self) -> None:
        self._pools.clear()
        await self._client.close()


def _check_in_place_target(request_id: str, target: KVTarget) -> None:
    """In-place transports write straight into decode memory: only into blocks that exist, and
    not past the reservation's deadline, when the commit would be refused (the write fence, not
    this check, keeps a late copy out of blocks given to someone else)."""
    if not target.block_ids:
        raise TransferError(f"request {request_id}: the KV target names no decode blocks")
    if any(block_id >= target.pool_num_blocks for block_id in target.block_ids):
        raise TransferError(
            f"request {request_id}: decode block ids outside the pool's {target.pool_num_blocks} blocks"
        )
    _check_deadline(request_id, target, "the transfer")


def _check_deadline(request_id: str, target: KVTarget, event: str) -> None:
    if target.deadline_unix_s is not None and time.time() >= target.deadline_unix_s:
        raise TransferError(f"request {request_id}: the decode reservation expired before {event}")


def copy_blocks(
    dst_pool: torch.Tensor, dst_block_ids: list[int], src_pool: torch.Tensor, src_block_ids: list[int]
) -> None:
    """dst_pool[:, :, dst_block_ids] = src_pool[:, :, src_block_ids], across devices if needed."""
    if dst_pool.is_cuda and src_pool.device == dst_pool.device:
        # One gather and one scatter kernel, whatever the number of blocks.
        src_index = torch.tensor(src_block_ids, dtype=torch.long, device=src_pool.device)
        dst_index = torch.tensor(dst_block_ids, dtype=torch.long, device=dst_pool.device)
        dst_pool.index_copy_(2, dst_index, src_pool.index_select(2, src_index))
        return
    runs = block_runs(src_block_ids, dst_block_ids)
    if dst_pool.is_cpu and src_pool.is_cpu:
        # torch would split every run's copy over its intra-op threads and join them again, a
        # barrier per run that stalls whenever a core is busy elsewhere; numpy copies each run
        # on this thread, at memcpy speed however many runs there are.
        dst_bytes, src_bytes = _as_bytes(dst_pool), _as_bytes(src_pool)
        for src_start, dst_start, num_blocks in runs:
            dst_bytes[:, :, dst_start : dst_start + num_blocks] = src_bytes[:, :, src_start : src_start + num_blocks]
        return
    # Across devices torch's indexed copies along dim 2 run far below copy speed; a strided copy
    # per run of consecutive blocks does not.
    for src_start, dst_start, num_blocks in runs:
        dst_pool[:, :, dst_start : dst_start + num_blocks].copy_(src_pool[:, :, src_start : src_start + num_blocks])


def _as_bytes(pool: torch.Tensor) -> np.ndarray:
    """The pool's memory as uint8, [num_layers, 2, num_blocks, bytes per block of K (or V)]."""
    return pool.view(*pool.shape[:3], -1).view(torch.uint8).numpy()


def block_runs(src_block_ids: list[int], dst_block_ids: list[int]) -> list[tuple[int, int, int]]:
    """(src start, dst start, length) of the maximal runs where both id lists count up by one."""
    runs: list[tuple[int, int, int]] = []
    for src_id, dst_id in zip(src_block_ids, dst_block_ids, strict=True):
        if runs and runs[-1][0] + runs[-1][2] == src_id and runs[-1][1] + runs[-1][2] == dst_id:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((src_id, dst_id, 1))
    return runs
