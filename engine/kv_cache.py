"""The paged KV pool: one tensor for all layers.

Layout `[num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]`: for each layer, K then
V, each a contiguous `[num_blocks, block_size, num_kv_heads, head_dim]` array that the kernels
index by slot (`block_id * block_size + offset`). One tensor keeps the pool exportable in one
piece (shared memory, CUDA IPC) and a block's bytes at a fixed stride.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import ModelConfig


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    @classmethod
    def for_model(cls, config: ModelConfig, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        return cls(config.num_layers, config.num_kv_heads, config.head_dim, block_size, dtype)

    @property
    def bytes_per_block(self) -> int:
        element_bytes = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * element_bytes

    def num_blocks_in(self, num_bytes: int) -> int:
        return num_bytes // self.bytes_per_block

    def allocate(self, num_blocks: int, device: torch.device) -> torch.Tensor:
        shape = (self.num_layers, 2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        return torch.zeros(shape, dtype=self.dtype, device=device)
