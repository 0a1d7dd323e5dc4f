"""`KVTarget`: where a prefill replica writes a prompt's KV, as the decode replica reserved it.

Decode.Reserve returns it, Prefill.Run hands it to a `KVSender`. The transport-specific fields
come from the transport's own module (`target_fields` in shm.py, cuda_ipc.py, grpc_stream.py) and
are empty for the others; the in-place transports' write fence comes with the reservation
(kvtransfer/write_fence.py). On the wire: `pdserve.v1.KVTarget` (see kvtransfer/wire.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from pdserve.kvtransfer.layout import KVLayout


@dataclass(frozen=True, slots=True)
class KVTarget:
    request_id: str
    block_ids: tuple[int, ...]  # the reserved decode blocks to fill, in the prompt's block order
    layout: KVLayout  # the decode replica's
    transport: int  # common_pb2.Transport
    decode_replica: str = ""
    kv_endpoint: str = ""  # host:port of the decode replica's KVTransfer service
    pool_num_blocks: int = 0  # blocks in the whole decode pool
    deadline_unix_s: float | None = None  # the reservation is released after it
    shm_name: str = ""  # TRANSPORT_SHM: the pool's shared-memory segment
    cuda_ipc_handle: bytes = b""  # TRANSPORT_CUDA_IPC: the pool's exported memory
    cuda_device: int = 0  # TRANSPORT_CUDA_IPC: the pool's device index
    num_cached_blocks: int = 0  # the prompt's leading blocks decode holds already; block_ids follow them
    write_token: bytes = b""  # the reservation's capability, carried by every write into it
    fence_name: str = ""  # TRANSPORT_SHM, TRANSPORT_CUDA_IPC: the pool's write fence (kvtransfer/write_fence.py)
    fence_generation: int = 0  # ... and the generation of block_ids[0] in it when the reservation was made
