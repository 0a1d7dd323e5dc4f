"""Split-KV paged decode attention in Triton: one new query token per sequence.

Masking: the new token, at position context_len - 1, sees the positions from key_start =
max(0, context_len - SLIDING_WINDOW) (0 without a window) to itself, and nothing else is loaded.
Scores are kept in base 2 (scale * log2 e) for exp2; a softcap c caps them at c * log2 e.

Those keys are cut into splits of `split_tokens` positions from key_start. Pass 1 runs one program
per (sequence, kv head, split); it attends all query heads that share the kv head (GQA) over
the split with an online softmax and writes a normalised partial output and its log-sum-exp:

    partial_out [num_seqs, num_heads, num_splits, head_dim]  fp32
    partial_lse [num_seqs, num_heads, num_splits]            fp32, base 2

Splits that start past a sequence's context write nothing. Pass 2 runs one program per
(sequence, head) and merges that sequence's used splits, weighting each by exp2(lse - max lse).
An int8 pool's entries (kernels/kv_quant.py) are widened tile by tile (paged_tile) and cast to the
query's dtype before the products.

How pass 1 is launched (tokens per split and per tile, warps, pipeline stages) is a
`DecodeLaunch`; serving launches `DecodeLaunch()`. Its figures are Triton's default warps and
stages and the split and tile rules below, not yet chosen by a measured sweep on a GPU at
serving's shapes (a sweep script of the candidates is in git history at `a63e1e0`); its winner
belongs here, with the GPU and the figures it was measured on.
"""
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from pdserve.kernels.paged_tile import load_kv_tile
from pdserve.kernels.softcap import softcap
from pdserve.kernels.tile_dot import needs_exact_dot, tile_dot

MAX_SPLITS = 16
MIN_SPLIT_TOKENS = 256
MAX_TILE_TOKENS = 64
MIN_TILE_TOKENS = 16  # tl.dot needs every tile side >= 16
MIN_GROUP_ROWS = 16


@dataclass(frozen=True, slots=True)
class DecodeLaunch:
    split_tokens: int | None = None  # None: default_split_tokens of the most keys a sequence can attend
    tile_tokens: int | None = None  # None: the split's tokens rounded up to a power of 2, clamped to the tile range
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        tile = self.tile_tokens
        if tile is not None and (tile < MIN_TILE_TOKENS or tile & (tile - 1)):
            raise ValueError(f"tile_tokens must be a power of 2 >= {MIN_TILE_TOKENS}, got {tile}")


@triton.jit
def _decode_split_kernel(
    query_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    context_lens_ptr,
    partial_out_ptr,
    partial_lse_ptr,
    qk_scale_log2,
    split_tokens,
    stride_query_seq,
    stride_query_head,
    stride_cache_slot,
    stride_cache_head,
    stride_table_seq,
    stride_partial_seq,
    stride_partial_head,
    stride_partial_split,
    stride_lse_seq,
    stride_lse_head,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    QUERIES_PER_KV: tl.constexpr,
    GROUP_ROWS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_TOKENS: tl.constexpr,
    EXACT_DOT: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
    LOGIT_SOFTCAP_LOG2: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(context_lens_ptr + seq)
    key_start = tl.maximum(context_len - SLIDING_WINDOW, 0) if SLIDING_WINDOW is not None else 0
    split_start = key_start + split * split_tokens
    if split_start >= context_len:
        return
    split_end = tl.minimum(split_start + split_tokens, context_len)

    group = tl.arange(0, GROUP_ROWS)
    heads = kv_head * QUERIES_PER_KV + group  # [GROUP_ROWS]
    head_mask = group < QUERIES_PER_KV
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM
    query_offsets = seq * stride_query_seq + heads[:, None] * stride_query_head + dims[None, :]
    query = tl.load(
        query_ptr + query_offsets, mask=head_mask[:, None] & dim_mask[None, :], other=0.0
    )  # [GROUP_ROWS, HEAD_DIM_PAD]

    running_max = tl.full([GROUP_ROWS], float("-inf"), tl.float32)
    running_sum = tl.zeros([GROUP_ROWS], tl.float32)
    acc = tl.zeros([GROUP_ROWS, HEAD_DIM_PAD], tl.float32)
    table_row = block_tables_ptr + seq * stride_table_seq
    for tile_start in range(split_start, split_end, TILE_TOKENS):
        positions = tile_start + tl.arange(0, TILE_TOKENS)  # [TILE_TOKENS]
        in_split = positions < split_end
        key, value = load_kv_tile(k_cache_ptr, v_cache_ptr, table_row, positions, in_split, kv_head, dims,
                                  stride_cache_slot, stride_cache_head, BLOCK_SIZE, HEAD_DIM)
        key, value = key.to(query.dtype), value.to(query.dtype)  # [TILE_TOKENS, HEAD_DIM_PAD] each, widened if int8

        scores = tile_dot(query, tl.trans(key), EXACT_DOT) * qk_scale_log2  # [GROUP_ROWS, TILE_TOKENS]
        if LOGIT_SOFTCAP_LOG2 is not None:
            scores = softcap(scores, LOGIT_SOFTCAP_LOG2)
        scores = tl.where(in_split[None, :], scores, float("-inf"))
        tile_max = tl.maximum(running_max, tl.max(scores, axis=1))
        probs = tl.exp2(scores - tile_max[:, None])
        rescale = tl.exp2(running_max - tile_max)
        running_sum = running_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None] + tile_dot(probs, value, EXACT_DOT)
        running_max = tile_max

    partial_offsets = (
        seq * stride_partial_seq
        + heads[:, None] * stride_partial_head
        + split * stride_partial_split
        + dims[None, :]
    )
    tl.store(
        partial_out_ptr + partial_offsets,
        acc / running_sum[:, None],
        mask=head_mask[:, None] & dim_mask[None, :],
    )
    lse_offsets = seq * stride_lse_seq + heads * stride_lse_head + split
    tl.store(partial_lse_ptr + lse_offsets, running_max + tl.log2(running_sum), mask=head_mask)


@triton.jit
def _decode_reduce_kernel(
    partial_out_ptr,
    partial_lse_ptr,
    context_lens_ptr,
    out_ptr,
    split_tokens,
    stride_partial_seq,
    stride_partial_head,
    stride_partial_split,
    stride_lse_seq,
    stride_lse_head,
    stride_out_seq,
    stride_out_head,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    NUM_SPLITS_PAD: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    context_len = tl.load(context_lens_ptr + seq)
    key_start = tl.maximum(context_len - SLIDING_WINDOW, 0) if SLIDING_WINDOW is not None else 0
    num_used_splits = tl.cdiv(context_len - key_start, split_tokens)
    splits = tl.arange(0, NUM_SPLITS_PAD)
    split_mask = splits < num_used_splits
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM

    lse_offsets = seq * stride_lse_seq + head * stride_lse_head + splits
    lse = tl.load(partial_lse_ptr + lse_offsets, mask=split_mask, other=float("-inf"))
    weights = tl.exp2(lse - tl.max(lse, axis=0))  # [NUM_SPLITS_PAD], 0 for unused splits
    partial_offsets = (
        seq * stride_partial_seq
        + head * stride_partial_head
        + splits[:, None] * stride_partial_split
        + dims[None, :]
    )
    partial = tl.load(
        partial_out_ptr + partial_offsets, mask=split_mask[:, None] & dim_mask[None, :], other=0.0
    )  # [NUM_SPLITS_PAD, HEAD_DIM_PAD]
    out = tl.sum(weights[:, None] * partial, axis=0) / tl.sum(weights, axis=0)
    out_offsets = seq * stride_out_seq + head * stride_out_head + dims
    tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=dim_mask)


def split_kernel_constants(
    head_dim: int, queries_per_kv: int, block_size: int, split_tokens: int, exact_dot: bool,
    tile_tokens: int | None = None, sliding_window: int | None = None, logit_softcap: float | None = None,
) -> dict:
    if tile_tokens is None:
        tile_tokens = min(MAX_TILE_TOKENS, max(MIN_TILE_TOKENS, triton.next_power_of_2(split_tokens)))
    return dict(
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        QUERIES_PER_KV=queries_per_kv,
        GROUP_ROWS=max(MIN_GROUP_ROWS, triton.next_power_of_2(queries_per_kv)),
        BLOCK_SIZE=block_size,
        TILE_TOKENS=tile_tokens,
        EXACT_DOT=exact_dot,
        SLIDING_WINDOW=sliding_window,
        LOGIT_SOFTCAP_LOG2=None if logit_softcap is None else logit_softcap * math.log2(math.e),
    )


def reduce_kernel_constants(head_dim: int, num_splits: int, sliding_window: int | None = None) -> dict:
    return dict(
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=triton.next_power_of_2(head_dim),
        NUM_SPLITS_PAD=triton.next_power_of_2(num_splits),
        SLIDING_WINDOW=sliding_window,
    )


def max_attended_keys(max_context_len: int, sliding_window: int | None) -> int:
    """The most keys one new token attends in contexts up to `max_context_len`."""
    return max_context_len if sliding_window is None else min(max_context_len, sliding_window)


def default_split_tokens(max_keys: int) -> int:
    """Tokens per split when a new token attends up to `max_keys` keys: at most MAX_SPLITS splits."""
    num_splits = min(MAX_SPLITS, triton.cdiv(max_keys, MIN_SPLIT_TOKENS))
    return triton.cdiv(triton.cdiv(max_keys, num_splits), MAX_TILE_TOKENS) * MAX_TILE_TOKENS


def decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, entry_size] (kv_quant.kv_entry_size)
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, entry_size]
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    scale: float,
    launch: DecodeLaunch = DecodeLaunch(),
    *,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    """Split-KV decode; the split's size defaults to one derived from the block-table width and
    the window, so no device-to-host sync is needed."""
    num_seqs, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    max_keys = max_attended_keys(block_tables.shape[1] * block_size, sliding_window)
    split_tokens = launch.split_tokens or default_split_tokens(max_keys)
    num_splits = triton.cdiv(max_keys, split_tokens)
    k_slots = k_cache.view(-1, num_kv_heads, k_cache.shape[-1])  # [num_slots, num_kv_heads, entry_size]
    v_slots = v_cache.view(-1, num_kv_heads, v_cache.shape[-1])
    partial_out = query.new_empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32)
    partial_lse = query.new_empty(num_seqs, num_heads, num_splits, dtype=torch.float32)
    out = torch.empty_like(query)

    _decode_split_kernel[(num_seqs, num_kv_heads, num_splits)](
        query,
        k_slots,
        v_slots,
        block_tables,
        context_lens,
        partial_out,
        partial_lse,
        scale * math.log2(math.e),
        split_tokens,
        query.stride(0),
        query.stride(1),
        k_slots.stride(0),
        k_slots.stride(1),
        block_tables.stride(0),
        partial_out.stride(0),
        partial_out.stride(1),
        partial_out.stride(2),
        partial_lse.stride(0),
        partial_lse.stride(1),
        **split_kernel_constants(
            head_dim,
            num_heads // num_kv_heads,
            block_size,
            split_tokens,
            needs_exact_dot(query.dtype),
            launch.tile_tokens,
            sliding_window,
            logit_softcap,
        ),
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )
    _decode_reduce_kernel[(num_seqs, num_heads)](
        partial_out,
        partial_lse,
        context_lens,
        out,
        split_tokens,
        partial_out.stride(0),
        partial_out.stride(1),
        partial_out.stride(2),
        partial_lse.stride(0),
        partial_lse.stride(1),
        out.stride(0),
        out.stride(1),
        **reduce_kernel_constants(head_dim, num_splits, sliding_window),
    )
    return out
