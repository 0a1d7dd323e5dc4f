"""Loading one tile of K and V through a block table, shared by the attention kernels.

Paging in two lines: `block = table[pos // BLOCK_SIZE]`, `slot = block * BLOCK_SIZE +
pos % BLOCK_SIZE`; a cache row is `slot * stride_cache_slot + kv_head * stride_cache_head`.
Positions outside `valid` read neither the table nor the cache and come back as zeros. An int8
pool's row is HEAD_DIM levels and their float32 scale (kernels/kv_quant.py), widened to
levels * scale in float32.
"""
import triton
import triton.language as tl


@triton.jit
def _load_rows(cache_ptr, rows, valid, dims, HEAD_DIM: tl.constexpr):
    """Cache rows `rows` ([TILE]) as a [TILE, HEAD_DIM_PAD] tile: as stored, or widened from int8."""
    mask = valid[:, None] & (dims[None, :] < HEAD_DIM)
    tile = tl.load(cache_ptr + rows[:, None] + dims[None, :], mask=mask, other=0)
    if cache_ptr.dtype.element_ty == tl.int8:
        scale = tl.load((cache_ptr + rows + HEAD_DIM).to(tl.pointer_type(tl.float32)), mask=valid, other=0.0)
        tile = tile.to(tl.float32) * scale[:, None]
    return tile


@triton.jit
def load_kv_tile(k_cache_ptr, v_cache_ptr, table_row, positions, valid, kv_head, dims,
                 stride_cache_slot, stride_cache_head, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr):
    """K and V of `positions` ([TILE]) for one kv head: two [TILE, HEAD_DIM_PAD] tiles."""
    block = tl.load(table_row + positions // BLOCK_SIZE, mask=valid, other=0).to(tl.int64)
    slot = block * BLOCK_SIZE + positions % BLOCK_SIZE
    rows = slot * stride_cache_slot + kv_head * stride_cache_head  # [TILE]
    return _load_rows(k_cache_ptr, rows, valid, dims, HEAD_DIM), _load_rows(v_cache_ptr, rows, valid, dims, HEAD_DIM)
