"""The 8-bit KV pool's entries (`--kv-cache-dtype int8`): the one definition every kernel matches.

An int8 pool stores, for each token and kv head, `head_dim` int8 levels followed by their float32
scale, so an entry of `k_cache` (or `v_cache`) is `head_dim + KV_SCALE_BYTES` int8 elements:

    entry = [q_0, ..., q_{head_dim-1}, the 4 bytes of s]    x_d ~= s * q_d

q and s being the row's int8 levels and scale of kernels/int8_levels.py (0 for a row of zeros).

The scale is per token and head, not per block: a block fills one token at a time during decode,
and a block-wide scale would re-quantize the tokens before a larger one. Scales are read where
their entry is (no second tensor), so a block's bytes stay one contiguous run of the pool and
every transport moves them as it moves float blocks. Entries are computed in float32 from the
K/V as the model produced them.
"""
import torch

from pdserve.kernels.int8_levels import int8_levels

KV_SCALE_BYTES = 4  # one float32 scale after each entry's levels


def kv_entry_size(head_dim: int, dtype: torch.dtype) -> int:
    """Elements of `dtype` that one token's K (or V) of one kv head takes in a pool of `dtype`."""
    return head_dim + KV_SCALE_BYTES if dtype == torch.int8 else head_dim


def quantize_entries(x: torch.Tensor) -> torch.Tensor:
    """[..., head_dim] floats -> [..., head_dim + KV_SCALE_BYTES] int8 entries."""
    levels, scales = int8_levels(x)  # [..., head_dim], [..., 1]
    return torch.cat([levels, scales.view(torch.int8)], dim=-1)


def dequantize_entries(entries: torch.Tensor) -> torch.Tensor:
    """[..., head_dim + KV_SCALE_BYTES] int8 entries -> [..., head_dim] float32."""
    head_dim = entries.shape[-1] - KV_SCALE_BYTES
    scale = entries[..., head_dim:].contiguous().view(torch.float32)  # [..., 1]
    return entries[..., :head_dim].float() * scale


def widen(cache_rows: torch.Tensor) -> torch.Tensor:
    """Rows of a pool, [..., entry] of its dtype -> [..., head_dim] float32."""
    return dequantize_entries(cache_rows) if cache_rows.dtype == torch.int8 else cache_rows.float()
