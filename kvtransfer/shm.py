"""TRANSPORT_SHM: the prefill replica writes straight into the decode pool's shared memory.

Same host, CPU pools. The decode pool's segment is mapped once per name and kept; blocks are
copied in place on a worker thread, then `KVTransfer.Commit` tells the decode replica they are
complete. This side never unlinks a segment: the decode replica owns it.
"""
from __future__ import annotations

import torch

from kvtransfer.errors import TransferError
from kvtransfer.in_place import InPlaceSender
from kvtransfer.pool import copy_blocks, map_shared_pool
from pdserve.v1 import common_pb2, decode_pb2


class ShmSender(InPlaceSender):
    transport = common_pb2.TRANSPORT_SHM

    def _open_pool(self, target: decode_pb2.KVTarget, kv_cache: torch.Tensor) -> torch.Tensor:
        if not target.shm_name:
            raise TransferError(f"KV target of request {target.request_id} names no shared memory")
        pool = self._pools.get(target.shm_name)
        if pool is None or pool.shape[2] != target.pool_num_blocks:
            pool = map_shared_pool(target.shm_name, self._spec, target.pool_num_blocks)
            self._pools[target.shm_name] = pool
        return pool

    def _copy(self, dst: torch.Tensor, dst_block_ids: list[int], src: torch.Tensor, src_block_ids: list[int]) -> None:
        copy_blocks(dst, dst_block_ids, src, src_block_ids)
