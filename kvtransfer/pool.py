"""A decode replica's KV pool, allocated so that a prefill replica can write into it.

The pool is the engine's one tensor `[num_layers, 2, num_blocks, block_size, num_kv_heads,
head_dim]`. A shared CPU pool lives in a POSIX shared-memory segment with a unique name: the
decode replica creates and owns it (`close()` unlinks the name; the resource tracker unlinks it
too if the process dies first), a prefill replica maps it by name and never unlinks it.

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

from engine.kv_cache import KVCacheSpec
from kvtransfer.errors import TransferError, TransportUnavailableError
from pdserve.v1 import common_pb2

# Linux exposes POSIX shared-memory segments as files in this directory.
SHM_DIR = "/dev/shm"
_SHM_NAME_PREFIX = "pdserve_kv_"


class KVPool:
    """The pool tensor, plus the shared-memory segment that backs it when shared on CPU."""

    def __init__(self, spec: KVCacheSpec, tensor: torch.Tensor, segment: shared_memory.SharedMemory | None):
        self.spec = spec
        self.tensor = tensor  # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        self._segment = segment
        self._cuda_ipc_handle: bytes | None = None  # exported once, on first use

    @property
    def num_blocks(self) -> int:
        return self.tensor.shape[2]

    @property
    def shm_name(self) -> str | None:
        """The segment's name for `KVTarget.shm_name`; None unless the pool is a shared CPU pool."""
        return None if self._segment is None else self._segment.name

    def target_fields(self, transport: int) -> dict[str, object]:
        """The pool's part of a `KVTarget` for `transport`, as keyword arguments.

        Raises TransportUnavailableError if this pool cannot be reached that way."""
        if transport == common_pb2.TRANSPORT_SHM:
            if self._segment is None:
                raise TransportUnavailableError(
                    f"TRANSPORT_SHM needs a shared CPU KV pool; this pool is on {self.tensor.device}"
                    + (", not shared" if self.tensor.device.type == "cpu" else "")
                )
            return {"shm_name": self._segment.name, "pool_num_blocks": self.num_blocks}
        if transport == common_pb2.TRANSPORT_CUDA_IPC:
            if self._cuda_ipc_handle is None:
                from kvtransfer.cuda_ipc import export_cuda_pool

                self._cuda_ipc_handle = export_cuda_pool(self.tensor)
            return {
                "cuda_ipc_handle": self._cuda_ipc_handle,
                "cuda_device": self.tensor.device.index or 0,
                "pool_num_blocks": self.num_blocks,
            }
        if transport == common_pb2.TRANSPORT_GRPC:
            return {"pool_num_blocks": self.num_blocks}
        raise TransportUnavailableError(f"unknown KV transport {transport}")

    def close(self) -> None:
        """Unlinks the shared segment (idempotent). Tensors still viewing it stay valid until dropped."""
        if self._segment is not None:
            self._segment.unlink()
            self._segment = None


def create_kv_pool(spec: KVCacheSpec, num_blocks: int, device: torch.device | str, shared: bool) -> KVPool:
    """Allocates a zeroed pool; `shared` puts a CPU pool in shared memory (CUDA pools export
    themselves through CUDA IPC instead, see kvtransfer/cuda_ipc.py)."""
    device = torch.device(device)
    if not shared or device.type != "cpu":
        return KVPool(spec, spec.allocate(num_blocks, device), None)
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
    return KVPool(spec, tensor, segment)


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
    # Elsewhere torch's indexed copies along dim 2 run far below memcpy speed; a strided copy
    # per run of consecutive blocks does not.
    for src_start, dst_start, num_blocks in _runs(src_block_ids, dst_block_ids):
        dst_pool[:, :, dst_start : dst_start + num_blocks].copy_(src_pool[:, :, src_start : src_start + num_blocks])


def _runs(src_block_ids: list[int], dst_block_ids: list[int]) -> list[tuple[int, int, int]]:
    """(src start, dst start, length) of the maximal runs where both id lists count up by one."""
    runs: list[tuple[int, int, int]] = []
    for src_id, dst_id in zip(src_block_ids, dst_block_ids, strict=True):
        if runs and runs[-1][0] + runs[-1][2] == src_id and runs[-1][1] + runs[-1][2] == dst_id:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((src_id, dst_id, 1))
    return runs

