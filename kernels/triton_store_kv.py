"""Triton kernel that writes new tokens' K/V into the paged cache through a slot mapping.

One program per token copies all of its kv heads: key[token] -> k_cache slot slot_mapping[token]
(and likewise for value). The caches are addressed as flat slots (see `kernels` for the layout);
k_cache and v_cache share one layout. key and value may be strided views (e.g. slices of a fused
QKV projection) as long as head_dim is their innermost, unit-stride axis. An int8 pool gets each
row as `quantize_entries` writes it (kernels/kv_quant.py), levels and scale bit for bit.
"""
import torch
import triton
import triton.language as tl

from pdserve.kernels.int8_levels import MAX_LEVEL

LEVELS = tl.constexpr(float(MAX_LEVEL))
# fp32 numbers near 1.5 * 2**23 are whole: (y + it) - it is y rounded half to even for |y| < 2**22.
ROUNDING_SHIFT = tl.constexpr(1.5 * 2**23)


@triton.jit
def _store_rows(cache_ptr, rows, x, mask, head_mask, dims, HEAD_DIM: tl.constexpr):
    """Stores x ([heads, HEAD_DIM_PAD], zero outside `mask`) at cache rows `rows` ([heads]): as is,
    or into an int8 pool as levels round(x / scale) (half to even, as torch.round; 0 where the scale
    is 0) and their fp32 scale."""
    if cache_ptr.dtype.element_ty == tl.int8:
        x = x.to(tl.float32)  # div_rn divides as torch does; a GPU's `/` is approximate
        scale = tl.math.div_rn(tl.max(tl.abs(x), axis=1), LEVELS)  # [heads]
        scaled = tl.math.div_rn(x, tl.where(scale > 0, scale, 1.0)[:, None])  # [heads, HEAD_DIM_PAD]
        levels = (scaled + ROUNDING_SHIFT) - ROUNDING_SHIFT
        levels = tl.minimum(tl.maximum(levels, -LEVELS), LEVELS)
        tl.store(cache_ptr + rows[:, None] + dims[None, :], levels.to(tl.int8), mask=mask)
        scale_ptrs = (cache_ptr + rows + HEAD_DIM).to(tl.pointer_type(tl.float32))
        tl.store(scale_ptrs, scale, mask=head_mask)
    else:
        tl.store(cache_ptr + rows[:, None] + dims[None, :], x, mask=mask)


@triton.jit
def _store_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_mapping_ptr,
    stride_key_token,
    stride_key_head,
    stride_value_token,
    stride_value_head,
    stride_cache_slot,
    stride_cache_head,
    NUM_KV_HEADS: tl.constexpr,
    NUM_KV_HEADS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    heads = tl.arange(0, NUM_KV_HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    head_mask = heads < NUM_KV_HEADS
    mask = head_mask[:, None] & (dims[None, :] < HEAD_DIM)  # [heads, dims]

    key_offsets = token * stride_key_token + heads[:, None] * stride_key_head + dims[None, :]
    value_offsets = token * stride_value_token + heads[:, None] * stride_value_head + dims[None, :]
    cache_rows = slot * stride_cache_slot + heads * stride_cache_head  # [heads]
    key = tl.load(key_ptr + key_offsets, mask=mask, other=0.0)
    value = tl.load(value_ptr + value_offsets, mask=mask, other=0.0)
    _store_rows(k_cache_ptr, cache_rows, key, mask, head_mask, dims, HEAD_DIM)
    _store_rows(v_cache_ptr, cache_rows, value, mask, head_mask, dims, HEAD_DIM)


def store_kv_constants(num_kv_heads: int, head_dim: int) -> dict:
    return dict(
        NUM_KV_HEADS=num_kv_heads,
        NUM_KV_HEADS_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
    )


def store_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, entry_size] (kv_quant.kv_entry_size)
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, entry_size]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    k_slots = k_cache.view(-1, num_kv_heads, k_cache.shape[-1])  # [num_slots, num_kv_heads, entry_size]
    v_slots = v_cache.view(-1, num_kv_heads, v_cache.shape[-1])
    if num_tokens == 0:
        return
    _store_kv_kernel[(num_tokens,)](
        key,
        value,
        k_slots,
        v_slots,
        slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        k_slots.stride(0),
        k_slots.stride(1),
        **store_kv_constants(num_kv_heads, head_dim),
    )
