"""Triton kernel that writes new tokens' K/V into the paged cache through a slot mapping.

One program per token copies all of its kv heads: key[token] -> k_cache slot slot_mapping[token]
(and likewise for value). The caches are addressed as flat slots (see `kernels` for the layout);
k_cache and v_cache share one layout. key and value may be strided views (e.g. slices of a fused
QKV projection) as long as head_dim is their innermost, unit-stride axis.
"""
import torch
import triton
import triton.language as tl


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
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)  # [heads, dims]

    key_offsets = token * stride_key_token + heads[:, None] * stride_key_head + dims[None, :]
    value_offsets = token * stride_value_token + heads[:, None] * stride_value_head + dims[None, :]
    cache_offsets = slot * stride_cache_slot + heads[:, None] * stride_cache_head + dims[None, :]
    key = tl.load(key_ptr + key_offsets, mask=mask)
    value = tl.load(value_ptr + value_offsets, mask=mask)
    tl.store(k_cache_ptr + cache_offsets, key, mask=mask)
    tl.store(v_cache_ptr + cache_offsets, value, mask=mask)


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
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64
) -> None:
    num_tokens, num_kv_heads, head_dim = key.shape
    k_slots = k_cache.view(-1, num_kv_heads, head_dim)  # [num_slots, num_kv_heads, head_dim]
    v_slots = v_cache.view(-1, num_kv_heads, head_dim)
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
