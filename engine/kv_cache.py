"""The paged KV pool's geometry: one tensor for all layers, and the one place its sizes are computed.

Layout `[num_layers, 2, num_blocks, block_size, num_kv_heads, entry_size]`: for each layer, K then
V, each a contiguous `[num_blocks, block_size, num_kv_heads, entry_size]` array that the kernels
index by slot (`block_id * block_size + offset`). An entry is one token's K (or V) of one kv head:
`head_dim` elements in a float pool, and in an int8 pool `head_dim` levels and their scale's
bytes (kernels/kv_quant.py). One tensor keeps the pool exportable in one
piece (shared memory, CUDA IPC) and a block's bytes at a fixed stride. Everything that sizes,
allocates, maps or checks a pool (the engine, every KV transport) asks a `KVCacheSpec`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from pdserve.engine.config import ModelConfig
from pdserve.kernels.kv_quant import KV_SCALE_BYTES, kv_entry_size
from pdserve.protocol.errors import InvalidConfigError, PdserveError


class KVCacheMismatchError(PdserveError, ValueError):
    """A tensor is not a KV pool of the expected spec; reading or writing it would corrupt blocks."""


class LayoutFields(Protocol):
    """The geometry part of a KV layout (see kvtransfer/layout.py); `dtype` by name ("bfloat16")."""

    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int


@dataclass(frozen=True, slots=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if self.dtype == torch.int8 and self.head_dim % KV_SCALE_BYTES:  # each entry's scale 4-byte aligned
            raise InvalidConfigError(f"an int8 KV pool needs a head_dim that is a multiple of {KV_SCALE_BYTES}, "
                                     f"not {self.head_dim}")

    @classmethod
    def for_model(cls, config: ModelConfig, block_size: int, dtype: torch.dtype) -> KVCacheSpec:
        return cls(config.num_layers, config.num_kv_heads, config.head_dim, block_size, dtype)

    @classmethod
    def from_layout(cls, layout: LayoutFields) -> KVCacheSpec:
        """The spec a layout describes; the way back is `kvtransfer.layout.make_layout`."""
        dtype = getattr(torch, layout.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise KVCacheMismatchError(f"KV layout names no torch dtype: {layout.dtype!r}")
        return cls(layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.block_size, dtype)

    def shape(self, num_blocks: int) -> tuple[int, ...]:
        """[num_layers, 2, num_blocks, block_size, num_kv_heads, entry_size]"""
        return (self.num_layers, 2, num_blocks, *self.block_shape)

    @property
    def block_shape(self) -> tuple[int, int, int]:
        """[block_size, num_kv_heads, entry_size]: one block of K (or of V) in one layer."""
        return (self.block_size, self.num_kv_heads, kv_entry_size(self.head_dim, self.dtype))

    @property
    def bytes_per_layer_block(self) -> int:
        """K and V of one block in one layer."""
        block_size, num_kv_heads, entry_size = self.block_shape
        return 2 * block_size * num_kv_heads * entry_size * self.dtype.itemsize

    @property
    def bytes_per_block(self) -> int:
        """K and V of one block in every layer."""
        return self.num_layers * self.bytes_per_layer_block

    def num_blocks_in(self, num_bytes: int) -> int:
        return num_bytes // self.bytes_per_block

    def allocate(self, num_blocks: int, device: torch.device) -> torch.Tensor:
        """A pool of `num_blocks`, uninitialised: every slot is written before a kernel reads it,
        and on a CPU the pages of blocks never used are never made resident."""
        return torch.empty(self.shape(num_blocks), dtype=self.dtype, device=device)

    def check(self, kv_cache: torch.Tensor) -> None:
        """Raises KVCacheMismatchError unless `kv_cache` is a pool of this spec (any number of blocks)."""
        if kv_cache.dim() == 6 and tuple(kv_cache.shape) == self.shape(kv_cache.shape[2]) and kv_cache.dtype == self.dtype:
            return
        expected = ", ".join(map(str, (self.num_layers, 2, "num_blocks", *self.block_shape)))
        raise KVCacheMismatchError(
            f"KV pool {list(kv_cache.shape)} {_dtype_name(kv_cache.dtype)} does not match its spec "
            f"[{expected}] {_dtype_name(self.dtype)}"
        )


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
