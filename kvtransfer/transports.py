"""The one table of KV transports: the decode pool each needs, its part of a `KVTarget`, its sender.

Each transport's module holds both of its ends (kvtransfer/shm.py, cuda_ipc.py, grpc_stream.py);
this module only picks one by its `common_pb2.Transport` number.
"""
from __future__ import annotations

import grpc
import torch

from pdserve.engine.kv_cache import KVCacheSpec
from pdserve.kvtransfer import cuda_ipc, grpc_stream, shm
from pdserve.kvtransfer.base import KVSender
from pdserve.kvtransfer.layout import KVLayout
from pdserve.kvtransfer.pool import KVPool
from pdserve.kvtransfer.rpc import ChannelFactory
from pdserve.protocol.errors import TransportUnavailableError
from pdserve.protocol.transport_choice import transport_name
from pdserve.v1 import common_pb2

DEFAULT_RPC_TIMEOUT_S = 30.0

# transport -> (its part of a KVTarget, its sender)
_TRANSPORTS = {
    common_pb2.TRANSPORT_SHM: (shm.target_fields, shm.ShmSender),
    common_pb2.TRANSPORT_GRPC: (grpc_stream.target_fields, grpc_stream.GrpcSender),
    common_pb2.TRANSPORT_CUDA_IPC: (cuda_ipc.target_fields, cuda_ipc.CudaIpcSender),
}


def create_kv_pool(spec: KVCacheSpec, num_blocks: int, device: torch.device | str, shared: bool) -> KVPool:
    """A zeroed decode pool. A CUDA pool can be exported through CUDA IPC wherever cupy is at
    hand; `shared` puts a CPU pool in shared memory, so that same-host prefill replicas can
    write into it."""
    device = torch.device(device)
    if device.type == "cuda":
        return cuda_ipc.create_cuda_pool(spec, num_blocks, device)
    if shared and device.type == "cpu":
        return shm.create_shared_pool(spec, num_blocks)
    return KVPool(spec, spec.allocate(num_blocks, device))


def target_fields(pool: KVPool, transport: int) -> dict[str, object]:
    """The pool's part of a `KVTarget` for `transport`, as keyword arguments; raises
    TransportUnavailableError if this pool cannot be reached that way."""
    if transport not in _TRANSPORTS:
        raise TransportUnavailableError(f"unknown KV transport {transport}")
    fields_of, _ = _TRANSPORTS[transport]
    return fields_of(pool)


def create_sender(
    transport: int, local_layout: KVLayout, open_channel: ChannelFactory = grpc.aio.insecure_channel,
    rpc_timeout_s: float = DEFAULT_RPC_TIMEOUT_S,
) -> KVSender:
    """A sender that reaches decode replicas through `open_channel`; raises
    TransportUnavailableError if `transport` cannot work in this process."""
    if transport not in _TRANSPORTS:
        raise TransportUnavailableError(f"no KV sender for {transport_name(transport)}")
    _, sender_class = _TRANSPORTS[transport]
    return sender_class(local_layout, rpc_timeout_s, open_channel)
