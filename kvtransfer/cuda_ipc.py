"""TRANSPORT_CUDA_IPC, both ends: the prefill replica copies device-to-device into the decode pool.

Same host, CUDA pools. Decode end: a `CudaIpcKVPool` exports itself once, on the first target
that asks, through torch's CUDA IPC (`_share_cuda_`); `target_fields` puts the exported fields,
as JSON, in `KVTarget.cuda_ipc_handle`. Prefill end: `CudaIpcSender` opens them once per decode
pool, through torch's own IPC cache, copies, and synchronizes before `KVTransfer.Commit`, so the
decode replica never reads a half-written block. `cuda_device` is a device index as both
processes see it: they must share CUDA_VISIBLE_DEVICES. There is no fallback: where CUDA IPC
cannot work, this raises TransportUnavailableError. Nothing here needs CUDA until it is used.
"""
from __future__ import annotations

import base64
import json

import grpc
import torch

from engine.kv_cache import KVCacheSpec
from kvtransfer.errors import TransferError, TransportUnavailableError
from kvtransfer.in_place import InPlaceSender, copy_blocks
from kvtransfer.layout import KVLayout
from kvtransfer.pool import KVPool
from kvtransfer.rpc import ChannelFactory
from kvtransfer.target import KVTarget
from pdserve.v1 import common_pb2

_BYTES_FIELDS = ("storage_handle", "ref_counter_handle", "event_handle")


class CudaIpcKVPool(KVPool):
    """A CUDA pool, exported to other processes on first use and only once."""

    def __init__(self, spec: KVCacheSpec, tensor: torch.Tensor):
        super().__init__(spec, tensor)
        self._handle: bytes | None = None

    def ipc_handle(self) -> bytes:
        if self._handle is None:
            self._handle = export_cuda_pool(self.tensor)
        return self._handle


def target_fields(pool: KVPool) -> dict[str, object]:
    """The pool's part of a TRANSPORT_CUDA_IPC `KVTarget`; raises TransportUnavailableError
    unless the pool is on CUDA."""
    if not isinstance(pool, CudaIpcKVPool):
        raise TransportUnavailableError(
            f"TRANSPORT_CUDA_IPC needs a CUDA KV pool, this one is on {pool.tensor.device}"
        )
    return {
        "cuda_ipc_handle": pool.ipc_handle(),
        "cuda_device": pool.tensor.device.index or 0,
        "pool_num_blocks": pool.num_blocks,
    }


def export_cuda_pool(tensor: torch.Tensor) -> bytes:
    """What a prefill replica needs to open `tensor`, a CUDA pool, from another process."""
    if not tensor.is_cuda:
        raise TransportUnavailableError(f"TRANSPORT_CUDA_IPC needs a CUDA KV pool, this one is on {tensor.device}")
    (
        device, storage_handle, storage_size_bytes, storage_offset_bytes,
        ref_counter_handle, ref_counter_offset, event_handle, event_sync_required,
    ) = tensor.untyped_storage()._share_cuda_()
    fields = {
        "device": device,
        "storage_handle": storage_handle,
        "storage_size_bytes": storage_size_bytes,
        "storage_offset_bytes": storage_offset_bytes,
        "ref_counter_handle": ref_counter_handle,
        "ref_counter_offset": ref_counter_offset,
        "event_handle": event_handle,
        "event_sync_required": event_sync_required,
        "tensor_offset": tensor.storage_offset(),
        "shape": list(tensor.shape),
        "stride": list(tensor.stride()),
        "dtype": str(tensor.dtype).removeprefix("torch."),
    }
    for name in _BYTES_FIELDS:
        fields[name] = base64.b64encode(fields[name]).decode()
    return json.dumps(fields).encode()


def open_cuda_pool(handle: bytes) -> torch.Tensor:
    """Opens a pool exported by `export_cuda_pool` in another process on this host."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    try:
        fields = json.loads(handle)
        for name in _BYTES_FIELDS:
            fields[name] = base64.b64decode(fields[name])
        dtype = getattr(torch, fields["dtype"])
    except (ValueError, KeyError, AttributeError, TypeError) as error:
        raise TransferError(f"malformed cuda_ipc_handle in the KV target: {error}") from error
    return rebuild_cuda_tensor(
        torch.Tensor,
        torch.Size(fields["shape"]),
        tuple(fields["stride"]),
        fields["tensor_offset"],
        torch.UntypedStorage,
        dtype,
        fields["device"],
        fields["storage_handle"],
        fields["storage_size_bytes"],
        fields["storage_offset_bytes"],
        False,
        fields["ref_counter_handle"],
        fields["ref_counter_offset"],
        fields["event_handle"],
        fields["event_sync_required"],
    )


class CudaIpcSender(InPlaceSender):
    transport = common_pb2.TRANSPORT_CUDA_IPC

    def __init__(self, local_layout: KVLayout, rpc_timeout_s: float, open_channel: ChannelFactory = grpc.aio.insecure_channel):
        if not torch.cuda.is_available():
            raise TransportUnavailableError(
                "TRANSPORT_CUDA_IPC needs a CUDA device, and this process sees none"
            )
        super().__init__(local_layout, rpc_timeout_s, open_channel)

    def _open_pool(self, target: KVTarget, kv_cache: torch.Tensor) -> torch.Tensor:
        if not kv_cache.is_cuda:
            raise TransportUnavailableError(
                f"TRANSPORT_CUDA_IPC needs the prefill pool on CUDA, it is on {kv_cache.device}"
            )
        if not target.cuda_ipc_handle:
            raise TransportUnavailableError(
                f"KV target of request {target.request_id} carries no CUDA IPC handle"
            )
        pool = self._pools.get(target.cuda_ipc_handle)
        if pool is None:
            pool = open_cuda_pool(target.cuda_ipc_handle)
            if pool.shape[2] != target.pool_num_blocks:
                raise TransferError(
                    f"opened decode pool has {pool.shape[2]} blocks, the target says {target.pool_num_blocks}"
                )
            self._pools[target.cuda_ipc_handle] = pool
        return pool

    def _copy(self, dst: torch.Tensor, dst_block_ids: list[int], src: torch.Tensor, src_block_ids: list[int]) -> None:
        # The prefill pool may have been written on another stream: finish that before reading it,
        # and finish the copy before the decode replica is told the blocks are complete.
        torch.cuda.synchronize(src.device)
        copy_blocks(dst, dst_block_ids, src, src_block_ids)
        torch.cuda.synchronize(dst.device)
