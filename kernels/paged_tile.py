"""Loading one tile of K and V through a block table, shared by the attention kernels.

Paging in two lines: `block = table[pos // BLOCK_SIZE]`, `slot = block * BLOCK_SIZE +
pos % BLOCK_SIZE`; a cache row is `slot * stride_cache_slot + kv_head * stride_cache_head`.
Positions outside `valid` read neither the table nor the cache and come back as zeros.
"""
import triton
import triton.language as tl


@triton.jit
def load_kv_tile(k_cache_ptr, v_cache_ptr, table_row, positions, valid, kv_head, dims, dim_mask,
                 stride_cache_slot, stride_cache_head, BLOCK_SIZE: tl.constexpr):
    """K and V of `positions` ([TILE]) for one kv head: two [TILE, HEAD_DIM_PAD] tiles."""
    block = tl.load(table_row + positions // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    slot = block * BLOCK_SIZE + positions % BLOCK_SIZE
    offsets = slot[:, None] * stride_cache_slot + kv_head * stride_cache_head + dims[None, :]
    mask = valid[:, None] & dim_mask[None, :]
    key = tl.load(k_cache_ptr + offsets, mask=mask, other=0.0)
    value = tl.load(v_cache_ptr + offsets, mask=mask, other=0.0)
    return key, value
