"""TRANSPORT_SHM, both ends: the decode pool lives in POSIX shared memory and the prefill replica
writes straight into it. Same host, CPU pools.

Decode end: `create_shared_pool` puts the pool in a segment with a unique name, which the decode
replica owns (`close()` unlinks it; the resource tracker unlinks it too if the process dies
first); `target_fields` names the segment in each `KVTarget`. Prefill end: `ShmSender` maps the
segment once per name (`map_shared_pool`, which never creates or unlinks one), copies blocks in
place on a worker thread under the reservation's write fence (kvtransfer/in_place.py), then
`KVTransfer.Commit` tells the decode replica they are complete.

Every mapping is an `mmap` object that only the tensor references and nobody closes, so the
memory stays mapped exactly as long as some tensor still views it: closing a pool can never
leave a dangling tensor behind.
"""
from __future__ import annotations

import mmap
import os
import uuid
from multiprocessing import shared_memory

import torch

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.in_place import InPlaceSender, copy_blocks
from pdserve.kvtransfer.pool import KVPool
from pdserve.kvtransfer.target import KVTarget
from pdserve.kvtransfer.write_fence import SHM_DIR
from pdserve.protocol.errors import TransferError, TransportUnavailableError
from pdserve.v1 import common_pb2

_SHM_NAME_PREFIX = "pdserve_kv_"


class SharedKVPool(KVPool):
    """A CPU pool in a shared-memory segment that this process created and unlinks."""

    def __init__(self, spec: KVCacheSpec, tensor: torch.Tensor, segment: shared_memory.SharedMemory):
        super().__init__(spec, tensor)
        self._segment: shared_memory.SharedMemory | None = segment
        self.segment_name = segment.name

    def close(self) -> None:
        """Unlinks the segment (idempotent). Tensors still viewing it stay valid until dropped."""
        if self._segment is not None:
            self._segment.unlink()
            self._segment = None


def create_shared_pool(spec: KVCacheSpec, num_blocks: int) -> SharedKVPool:
    """A zeroed CPU pool in a new segment."""
    segment = shared_memory.SharedMemory(
        name=_SHM_NAME_PREFIX + uuid.uuid4().hex, create=True, size=num_blocks * spec.bytes_per_block
    )
    try:
        tensor = map_shared_pool(segment.name, spec, num_blocks)
    except BaseException:
        segment.close()
        segment.unlink()
        raise
    # Our tensor maps the segment on its own; the SharedMemory object is kept only to unlink.
    segment.close()
    return SharedKVPool(spec, tensor, segment)


def target_fields(pool: KVPool) -> dict[str, object]:
    """The pool's part of a TRANSPORT_SHM `KVTarget`; raises TransportUnavailableError unless the
    pool is shared."""
    if not isinstance(pool, SharedKVPool):
        raise TransportUnavailableError(
            f"TRANSPORT_SHM needs a shared CPU KV pool; this pool is on {pool.tensor.device}"
            + (", not shared" if pool.tensor.device.type == "cpu" else "")
        )
    return {"shm_name": pool.segment_name, "pool_num_blocks": pool.num_blocks}


def map_shared_pool(shm_name: str, spec: KVCacheSpec, num_blocks: int) -> torch.Tensor:
    """Maps an existing segment as a pool of `num_blocks` blocks of `spec`; raises TransferError
    if the segment is gone or too small. Never creates or unlinks the segment."""
    shape = spec.shape(num_blocks)
    num_bytes = num_blocks * spec.bytes_per_block
    path = os.path.join(SHM_DIR, shm_name)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError as error:
        raise TransferError(f"cannot open the decode pool's shared memory {shm_name!r}: {error}") from error
    try:
        segment_bytes = os.fstat(fd).st_size
        if segment_bytes < num_bytes:
            raise TransferError(
                f"shared memory {shm_name!r} holds {segment_bytes} bytes, a pool of shape "
                f"{list(shape)} needs {num_bytes}"
            )
        mapping = mmap.mmap(fd, num_bytes)
    finally:
        os.close(fd)
    return torch.frombuffer(mapping, dtype=spec.dtype).view(shape)


class ShmSender(InPlaceSender):
    transport = common_pb2.TRANSPORT_SHM

    def _open_pool(self, target: KVTarget, kv_cache: torch.Tensor) -> torch.Tensor:
        if not target.shm_name:
            raise TransferError(f"KV target of request {target.request_id} names no shared memory")
        pool = self._pools.get(target.shm_name)
        if pool is None or pool.shape[2] != target.pool_num_blocks:
            pool = map_shared_pool(target.shm_name, self._spec, target.pool_num_blocks)
            self._pools[target.shm_name] = pool
        return pool

    def _copy(self, dst: torch.Tensor, dst_block_ids: list[int], src: torch.Tensor, src_block_ids: list[int]) -> None:
        copy_blocks(dst, dst_block_ids, src, src_block_ids)
