"""`create_sender`: the one place that turns a transport into a KVSender."""
from __future__ import annotations

from kvtransfer.base import KVSender
from kvtransfer.choice import transport_name
from kvtransfer.cuda_ipc import CudaIpcSender
from kvtransfer.errors import TransportUnavailableError
from kvtransfer.grpc_stream import GrpcSender
from kvtransfer.shm import ShmSender
from pdserve.v1 import common_pb2

DEFAULT_RPC_TIMEOUT_S = 30.0

_SENDERS = {
    common_pb2.TRANSPORT_SHM: ShmSender,
    common_pb2.TRANSPORT_GRPC: GrpcSender,
    common_pb2.TRANSPORT_CUDA_IPC: CudaIpcSender,
}


def create_sender(
    transport: int, local_layout: common_pb2.KVLayout, rpc_timeout_s: float = DEFAULT_RPC_TIMEOUT_S
) -> KVSender:
    """Raises TransportUnavailableError if `transport` cannot work in this process."""
    if transport not in _SENDERS:
        raise TransportUnavailableError(f"no KV sender for {transport_name(transport)}")
    return _SENDERS[transport](local_layout, rpc_timeout_s)
