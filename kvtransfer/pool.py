"""A decode replica's KV pool: the engine's one tensor, plus what the pool's memory needs released.

The tensor is `[num_layers, 2, num_blocks, block_size, num_kv_heads, entry_size]` (see
engine/kv_cache.py). A transport that writes straight into the pool's memory brings its own kind
of pool: `SharedKVPool` (kvtransfer/shm.py) lives in POSIX shared memory, `CudaIpcKVPool`
(kvtransfer/cuda_ipc.py) exports itself through CUDA IPC; a plain `KVPool` is reachable over gRPC
only. `kvtransfer.transports.create_kv_pool` picks the kind.
"""
from __future__ import annotations

import torch

from pdserve.engine.kv_cache import KVCacheSpec


class KVPool:
    def __init__(self, spec: KVCacheSpec, tensor: torch.Tensor):
        spec.check(tensor)
        self.spec = spec
        self.tensor = tensor  # [num_layers, 2, num_blocks, block_size, num_kv_heads, entry_size]

    @property
    def num_blocks(self) -> int:
        return self.tensor.shape[2]

    def close(self) -> None:
        """Releases what the pool's memory holds beyond the tensor (idempotent)."""
