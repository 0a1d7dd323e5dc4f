"""TRANSPORT_CUDA_IPC, both ends: the prefill replica copies device-to-device into the decode pool.

Same host, CUDA pools, CUDA's own IPC through cupy's public API (the `gpu` extra):

    decode   the pool is a cudaMalloc of its own (an IPC handle maps its whole allocation, and
             torch's allocator shares allocations between tensors), with a random generation;
             exported once (ipcGetMemHandle) into `KVTarget.cuda_ipc_handle` (`PoolExport`)
    prefill  per decode replica, the mapping of its current generation, opened once
             (ipcOpenMemHandle, on the pool's GPU); a target with a new generation (the replica
             came back with a new pool) replaces it, and the old mapping is closed once no copy
             uses it (`OpenedPools`)
             → under the reservation's write fence (kvtransfer/in_place.py): the copy, on this
             sender's own stream of the prefill GPU, after the work already queued there → the
             copy's event waited on, on the copy thread
             → the deadline checked again → KVTransfer.Commit (kvtransfer/in_place.py)

Invariant: Commit follows the copy's event, so the decode replica never reads a half-written
block; so does dropping the write fence, so no block goes to another request under a copy still
queued on a GPU. The sender waits for nothing else on either GPU. Across GPUs the copy goes peer
to peer. Device indexes are as both processes see them: they must share one view of the GPUs
(`pdserve up` and `pdserve compose-gpus` arrange that). There is no fallback: where CUDA IPC
cannot work, this raises TransportUnavailableError. Nothing here imports cupy or touches CUDA
until a CUDA pool or a sender is made.
"""
from __future__ import annotations

import base64
import json
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import grpc
import torch

from pdserve.engine.device_guard import resolve_device
from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer.in_place import InPlaceSender, copy_blocks
from pdserve.kvtransfer.layout import KVLayout
from pdserve.kvtransfer.pool import KVPool
from pdserve.kvtransfer.rpc import ChannelFactory
from pdserve.kvtransfer.target import KVTarget
from pdserve.protocol.errors import TransferError, TransportUnavailableError
from pdserve.v1 import common_pb2

GENERATION_BYTES = 16
_LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess: a pool on another GPU maps too
T = TypeVar("T")


def import_cupy():
    try:
        import cupy
    except ImportError as error:
        raise TransportUnavailableError(
            f"TRANSPORT_CUDA_IPC needs cupy (pip install 'pdserve[gpu]'): {error}") from error
    return cupy


@dataclass(frozen=True, slots=True)
class PoolExport:
    """What `KVTarget.cuda_ipc_handle` carries: enough for another process to map the pool."""
    generation: str  # random per pool: a decode replica that came back has a new one
    mem_handle: bytes  # the cudaIpcMemHandle_t of the pool's allocation
    num_bytes: int  # of the allocation

    def encode(self) -> bytes:
        return json.dumps({"generation": self.generation, "num_bytes": self.num_bytes,
                           "mem_handle": base64.b64encode(self.mem_handle).decode()}).encode()

    @classmethod
    def decode(cls, data: bytes) -> PoolExport:
        try:
            fields = json.loads(data)
            return cls(str(fields["generation"]), base64.b64decode(fields["mem_handle"], validate=True),
                       int(fields["num_bytes"]))
        except (ValueError, KeyError, TypeError) as error:
            raise TransferError(f"malformed cuda_ipc_handle in the KV target: {error!r}") from error


class CudaIpcKVPool(KVPool):
    """A CUDA pool, exported to other processes on first use and only once; a pool torch
    allocated (cupy missing) serves every transport but this one."""

    def __init__(self, spec: KVCacheSpec, tensor: torch.Tensor, exportable: bool):
        super().__init__(spec, tensor)
        self.generation = secrets.token_hex(GENERATION_BYTES)
        self._exportable = exportable
        self._handle: bytes | None = None

    def ipc_handle(self) -> bytes:
        if not self._exportable:
            import_cupy()
            raise TransportUnavailableError("TRANSPORT_CUDA_IPC needs a pool allocated through cupy")
        if self._handle is None:
            cupy = import_cupy()
            with cupy.cuda.Device(self.tensor.device.index):
                mem_handle = cupy.cuda.runtime.ipcGetMemHandle(self.tensor.data_ptr())
            num_bytes = self.tensor.numel() * self.tensor.element_size()
            self._handle = PoolExport(self.generation, bytes(mem_handle), num_bytes).encode()
        return self._handle


def create_cuda_pool(spec: KVCacheSpec, num_blocks: int, device: torch.device) -> CudaIpcKVPool:
    """A zeroed pool in a cudaMalloc of its own where cupy is at hand, else from torch."""
    device = resolve_device(device)
    try:
        cupy = import_cupy()
    except TransportUnavailableError:
        return CudaIpcKVPool(spec, spec.allocate(num_blocks, device), exportable=False)
    num_bytes = num_blocks * spec.bytes_per_block
    with cupy.cuda.Device(device.index):
        memory = cupy.cuda.Memory(num_bytes)  # a cudaMalloc, not cupy's pool
        raw = cupy.ndarray((num_bytes,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))
        tensor = torch.from_dlpack(raw).zero_()  # keeps `raw`, and so `memory`, alive
    return CudaIpcKVPool(spec, tensor.view(spec.dtype).view(spec.shape(num_blocks)), exportable=True)


def target_fields(pool: KVPool) -> dict[str, object]:
    """The pool's part of a TRANSPORT_CUDA_IPC `KVTarget`; raises TransportUnavailableError
    unless the pool is on CUDA and exportable."""
    if not isinstance(pool, CudaIpcKVPool):
        raise TransportUnavailableError(
            f"TRANSPORT_CUDA_IPC needs a CUDA KV pool, this one is on {pool.tensor.device}"
        )
    return {
        "cuda_ipc_handle": pool.ipc_handle(),
        "cuda_device": pool.tensor.device.index,
        "pool_num_blocks": pool.num_blocks,
    }


class OpenedPools(Generic[T]):
    """The prefill end's mappings of decode pools (pure policy; the mapping is any `T`).

    `acquire(replica, generation, open_mapping)` returns the mapping of that replica's pool of
    that generation, opening it on first use; `release(generation)` ends one use. A replica's
    new generation makes its old mapping stale: closed at once if unused, else at its last
    release, so no mapping is closed under a copy. Thread-safe: copies run on worker threads.
    """

    def __init__(self, close_mapping: Callable[[T], None]):
        self._close_mapping = close_mapping
        self._lock = threading.Lock()
        self._generation_of: dict[str, str] = {}  # decode replica -> its current pool generation
        self._mappings: dict[str, T] = {}  # generation -> its mapping
        self._num_users: dict[str, int] = {}  # generation -> copies using it now
        self._stale: set[str] = set()

    def acquire(self, replica: str, generation: str, open_mapping: Callable[[], T]) -> T:
        with self._lock:
            if generation in self._stale:
                raise TransferError(f"decode replica {replica!r} has a newer pool than the one targeted")
            previous = self._generation_of.get(replica)
            if previous is not None and previous != generation:
                self._retire(previous)
            if generation not in self._mappings:
                self._mappings[generation] = open_mapping()
                self._num_users[generation] = 0
            self._generation_of[replica] = generation
            self._num_users[generation] += 1
            return self._mappings[generation]

    def release(self, generation: str) -> None:
        with self._lock:
            self._num_users[generation] -= 1
            if generation in self._stale and self._num_users[generation] == 0:
                self._close(generation)

    def close(self) -> None:
        """Retires every mapping (each closes once unused)."""
        with self._lock:
            for generation in list(self._mappings):
                self._retire(generation)
            self._generation_of.clear()

    def _retire(self, generation: str) -> None:
        self._stale.add(generation)
        if self._num_users[generation] == 0:
            self._close(generation)

    def _close(self, generation: str) -> None:
        del self._num_users[generation]
        self._close_mapping(self._mappings.pop(generation))


@dataclass(frozen=True, slots=True)
class _Mapping:
    pool: torch.Tensor  # the decode pool, on its own GPU, as this process maps it
    pointer: int  # what ipcOpenMemHandle returned, for ipcCloseMemHandle


@dataclass(frozen=True, slots=True)
class _PoolRef:
    """A target's decode pool, before it is mapped (on the copy thread)."""
    replica: str
    export: PoolExport
    device_index: int
    num_blocks: int


class CudaIpcSender(InPlaceSender):
    transport = common_pb2.TRANSPORT_CUDA_IPC

    def __init__(self, local_layout: KVLayout, rpc_timeout_s: float, open_channel: ChannelFactory = grpc.aio.insecure_channel):
        if not torch.cuda.is_available():
            raise TransportUnavailableError(
                "TRANSPORT_CUDA_IPC needs a CUDA device, and this process sees none"
            )
        self._cupy = import_cupy()
        super().__init__(local_layout, rpc_timeout_s, open_channel)
        self._opened: OpenedPools[_Mapping] = OpenedPools(self._close_mapping)
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def _open_pool(self, target: KVTarget, kv_cache: torch.Tensor) -> _PoolRef:
        if not kv_cache.is_cuda:
            raise TransportUnavailableError(
                f"TRANSPORT_CUDA_IPC needs the prefill pool on CUDA, it is on {kv_cache.device}"
            )
        if not target.cuda_ipc_handle:
            raise TransportUnavailableError(
                f"KV target of request {target.request_id} carries no CUDA IPC handle"
            )
        export = PoolExport.decode(target.cuda_ipc_handle)
        if export.num_bytes != target.pool_num_blocks * self._spec.bytes_per_block:
            raise TransferError(
                f"the decode pool exports {export.num_bytes} bytes, {target.pool_num_blocks} blocks take "
                f"{target.pool_num_blocks * self._spec.bytes_per_block}"
            )
        return _PoolRef(target.decode_replica or target.kv_endpoint, export, target.cuda_device,
                        target.pool_num_blocks)

    def _copy(self, dst: _PoolRef, dst_block_ids: list[int], src: torch.Tensor, src_block_ids: list[int]) -> None:
        mapping = self._opened.acquire(dst.replica, dst.export.generation, lambda: self._open_mapping(dst))
        try:
            if (stream := self._streams.get(src.device)) is None:
                stream = self._streams[src.device] = torch.cuda.Stream(src.device)
            stream.wait_stream(torch.cuda.current_stream(src.device))  # the prefill pool's writes
            with torch.cuda.stream(stream):
                copy_blocks(mapping.pool, dst_block_ids, src, src_block_ids)
                done = torch.cuda.Event()
                done.record(stream)
            done.synchronize()
        finally:
            self._opened.release(dst.export.generation)

    async def close(self) -> None:
        self._opened.close()
        await super().close()

    def _open_mapping(self, ref: _PoolRef) -> _Mapping:
        cupy = self._cupy
        with cupy.cuda.Device(ref.device_index):
            try:
                pointer = cupy.cuda.runtime.ipcOpenMemHandle(ref.export.mem_handle, _LAZY_ENABLE_PEER_ACCESS)
            except cupy.cuda.runtime.CUDARuntimeError as error:
                raise TransferError(f"cannot open decode replica {ref.replica!r}'s pool: {error}") from error
            memory = cupy.cuda.UnownedMemory(pointer, ref.export.num_bytes, None, ref.device_index)
            raw = cupy.ndarray((ref.export.num_bytes,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))
            pool = torch.from_dlpack(raw).view(self._spec.dtype).view(self._spec.shape(ref.num_blocks))
        return _Mapping(pool, pointer)

    def _close_mapping(self, mapping: _Mapping) -> None:
        with self._cupy.cuda.Device(mapping.pool.device.index):
            self._cupy.cuda.runtime.ipcCloseMemHandle(mapping.pointer)
