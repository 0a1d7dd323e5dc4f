"""Flash-attention style prefill over the paged KV cache, causal with a cached prefix.

The new tokens of several sequences are packed back to back in `query`; sequence s owns rows
query_start_loc[s]..query_start_loc[s+1]. Its context holds context_lens[s] tokens, the last
q_len of which are the new ones (already stored), so new row i sits at absolute position
p = prefix_len + i with prefix_len = context_lens[s] - q_len.

Masking: row i sees positions j with j <= p and, with a window, p - j < SLIDING_WINDOW.
Scores are kept in base 2 (scale * log2 e) for exp2; a softcap c caps them at c * log2 e.

One program per (sequence, head, tile of QUERY_TILE new rows) streams the keys that some row of
its tile sees, from the first row's window start to the last row, in tiles of KEY_TILE with an
online softmax; keys before the window are never loaded. The grid's tile axis is sized by the
total number of new tokens (a bound on every sequence's q_len that needs no device-to-host sync);
programs past their sequence's last row return at once. An int8 pool's entries (kernels/kv_quant.py)
are widened tile by tile (paged_tile) and cast to the query's dtype before the products.
"""
import math

import torch
import triton
import triton.language as tl

from pdserve.kernels.paged_tile import load_kv_tile
from pdserve.kernels.softcap import softcap
from pdserve.kernels.tile_dot import needs_exact_dot, tile_dot

MIN_TILE = 16  # tl.dot needs every tile side >= 16


@triton.jit
def _prefill_kernel(
    query_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    context_lens_ptr,
    qk_scale_log2,
    stride_query_token,
    stride_query_head,
    stride_out_token,
    stride_out_head,
    stride_cache_slot,
    stride_cache_head,
    stride_table_seq,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    QUERIES_PER_KV: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    QUERY_TILE: tl.constexpr,
    KEY_TILE: tl.constexpr,
    EXACT_DOT: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
    LOGIT_SOFTCAP_LOG2: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    first_row = tl.program_id(2) * QUERY_TILE
    query_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - query_start
    if first_row >= query_len:
        return
    context_len = tl.load(context_lens_ptr + seq)
    prefix_len = context_len - query_len
    kv_head = head // QUERIES_PER_KV

    rows = first_row + tl.arange(0, QUERY_TILE)  # [QUERY_TILE]
    row_mask = rows < query_len
    query_positions = prefix_len + rows
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM
    row_dim_mask = row_mask[:, None] & dim_mask[None, :]
    tokens = (query_start + rows).to(tl.int64)
    query_offsets = tokens[:, None] * stride_query_token + head * stride_query_head + dims[None, :]
    query = tl.load(query_ptr + query_offsets, mask=row_dim_mask, other=0.0)  # [QUERY_TILE, HEAD_DIM_PAD]

    running_max = tl.full([QUERY_TILE], float("-inf"), tl.float32)
    running_sum = tl.zeros([QUERY_TILE], tl.float32)
    acc = tl.zeros([QUERY_TILE, HEAD_DIM_PAD], tl.float32)
    table_row = block_tables_ptr + seq * stride_table_seq
    key_start = tl.maximum(prefix_len + first_row - SLIDING_WINDOW + 1, 0) if SLIDING_WINDOW is not None else 0
    key_end = tl.minimum(prefix_len + first_row + QUERY_TILE, context_len)
    for tile_start in range(key_start, key_end, KEY_TILE):
        positions = tile_start + tl.arange(0, KEY_TILE)  # [KEY_TILE]
        in_range = positions < key_end
        key, value = load_kv_tile(k_cache_ptr, v_cache_ptr, table_row, positions, in_range, kv_head, dims,
                                  stride_cache_slot, stride_cache_head, BLOCK_SIZE, HEAD_DIM)
        key, value = key.to(query.dtype), value.to(query.dtype)  # [KEY_TILE, HEAD_DIM_PAD] each, widened if int8

        scores = tile_dot(query, tl.trans(key), EXACT_DOT) * qk_scale_log2  # [QUERY_TILE, KEY_TILE]
        if LOGIT_SOFTCAP_LOG2 is not None:
            scores = softcap(scores, LOGIT_SOFTCAP_LOG2)
        distance = query_positions[:, None] - positions[None, :]  # [QUERY_TILE, KEY_TILE]
        visible = (distance >= 0) & in_range[None, :]
        if SLIDING_WINDOW is not None:
            visible = visible & (distance < SLIDING_WINDOW)
        scores = tl.where(visible, scores, float("-inf"))
        tile_max = tl.maximum(running_max, tl.max(scores, axis=1))
        # A row whose window starts past every key so far has max -inf: shift it by 0, not -inf.
        shift = tl.where(tile_max == float("-inf"), 0.0, tile_max)
        probs = tl.exp2(scores - shift[:, None])
        rescale = tl.exp2(running_max - shift)
        running_sum = running_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None] + tile_dot(probs, value, EXACT_DOT)
        running_max = tile_max

    # A row's sum is at least 1, the term of its largest score, unless it saw no key at all: a row
    # past the sequence's new tokens whose window starts past its context, which is not stored.
    out = acc / tl.maximum(running_sum, 1.0)[:, None]
    out_offsets = tokens[:, None] * stride_out_token + head * stride_out_head + dims[None, :]
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=row_dim_mask)


def prefill_kernel_constants(
    head_dim: int,
    queries_per_kv: int,
    block_size: int,
    query_tile: int,
    key_tile: int,
    exact_dot: bool,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
) -> dict:
    return dict(
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        QUERIES_PER_KV=queries_per_kv,
        BLOCK_SIZE=block_size,
        QUERY_TILE=query_tile,
        KEY_TILE=key_tile,
        EXACT_DOT=exact_dot,
        SLIDING_WINDOW=sliding_window,
        LOGIT_SOFTCAP_LOG2=None if logit_softcap is None else logit_softcap * math.log2(math.e),
    )


def prefill_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, entry_size] (kv_quant.kv_entry_size)
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, entry_size]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    *,
    query_tile: int = 64,
    key_tile: int = 64,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Tile sizes are powers of two >= 16."""
    num_tokens, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if min(query_tile, key_tile) < MIN_TILE:
        raise ValueError(f"tiles must be >= {MIN_TILE}, got {query_tile} x {key_tile}")
    k_slots = k_cache.view(-1, num_kv_heads, k_cache.shape[-1])  # [num_slots, num_kv_heads, entry_size]
    v_slots = v_cache.view(-1, num_kv_heads, v_cache.shape[-1])
    out = torch.empty_like(query)
    if num_tokens == 0:
        return out
    num_seqs = block_tables.shape[0]
    _prefill_kernel[(num_seqs, num_heads, triton.cdiv(num_tokens, query_tile))](
        query,
        k_slots,
        v_slots,
        out,
        block_tables,
        query_start_loc,
        context_lens,
        scale * math.log2(math.e),
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        k_slots.stride(0),
        k_slots.stride(1),
        block_tables.stride(0),
        **prefill_kernel_constants(
            head_dim,
            num_heads // num_kv_heads,
            block_size,
            query_tile,
            key_tile,
            needs_exact_dot(query.dtype),
            sliding_window,
            logit_softcap,
        ),
    )
    return out
