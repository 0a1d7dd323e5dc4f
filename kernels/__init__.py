"""The model's kernels, one function per op; each picks what serves its tensors, so the model
never branches on a device.

Attention and KV writes (here): Triton when the tensors are on CUDA; on CPU, when a C compiler is
at hand, a compiled C kernel for decode attention over a float32, bfloat16 or int8 pool
(`cpu_decode_attention`), for prefill attention in float32 or bfloat16 where the CPU has AVX-512
(AVX512-BF16 for bfloat16; `cpu_prefill_attention`) and for writes into a float pool
(`cpu_layer_ops`) or an int8 one (`cpu_store_kv_int8`), pure torch otherwise. Norms, rope and
gated activations (kernels/layer_ops.py): compiled CPU ops where they serve, torch otherwise.

KV cache layout, per layer: `k_cache` and `v_cache` are each
`[num_blocks, block_size, num_kv_heads, entry_size]`, contiguous, with one shared layout; an entry
is head_dim elements of the pool's float dtype, or of an int8 pool head_dim levels and a scale
(kernels/kv_quant.py). The token
at absolute position `pos` of a sequence lives in block `block_table[pos // block_size]` at
offset `pos % block_size`; its flat slot is `block_id * block_size + offset`.

GQA: query head h reads kv head h // (num_heads // num_kv_heads).
Masking: a query at absolute position i sees key position j iff j <= i and, with a
`sliding_window` w, i - j < w. Scores are s = scale * q.k; with a `logit_softcap` c they become
c * tanh(s / c) before the softmax. None turns either off.
Triton modules are imported on first CUDA call, so importing this package loads no kernels.
"""
import torch

from pdserve.kernels import cpu_decode_attention, cpu_layer_ops, cpu_prefill_attention, cpu_store_kv_int8
from pdserve.kernels.layer_ops import add_rms_norm, apply_rope, gelu_tanh_and_mul, rms_norm, silu_and_mul
from pdserve.kernels.reference import (
    decode_attention_reference,
    prefill_attention_reference,
    store_kv_reference,
)

__all__ = ["prepare", "store_kv", "decode_attention", "prefill_attention",
           "rms_norm", "add_rms_norm", "apply_rope", "silu_and_mul", "gelu_tanh_and_mul"]


def prepare(device: torch.device, dtype: torch.dtype, kv_dtype: torch.dtype) -> None:
    """Builds or loads ahead of time what the kernels on `device` will use for activations of
    `dtype` and a KV pool of `kv_dtype`, so that the first request does not wait for a compiler."""
    if device.type == "cpu":
        cpu_decode_attention.load(kv_dtype)
        cpu_layer_ops.load(dtype)
        if dtype == kv_dtype:
            cpu_prefill_attention.load(dtype)
        if kv_dtype == torch.int8:
            cpu_store_kv_int8.load(dtype)


def store_kv(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens] int64 flat slots
) -> None:
    """Write each token's K/V into its slot, in place."""
    if key.is_cuda:
        from pdserve.kernels import triton_store_kv

        triton_store_kv.store_kv(key, value, k_cache, v_cache, slot_mapping)
    elif k_cache.dtype == torch.int8:
        if not cpu_store_kv_int8.store_kv_int8(key, value, k_cache, v_cache, slot_mapping):
            store_kv_reference(key, value, k_cache, v_cache, slot_mapping)
    elif not cpu_layer_ops.store_kv(key, value, k_cache, v_cache, slot_mapping):
        store_kv_reference(key, value, k_cache, v_cache, slot_mapping)


def decode_attention(
    query: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    context_lens: torch.Tensor,  # [num_seqs] int32, including the new token
    scale: float,
    *,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim], query's dtype
    """Attention of each sequence's one new token (K/V already stored) over its context."""
    _check_masking(sliding_window, logit_softcap)
    masking = dict(sliding_window=sliding_window, logit_softcap=logit_softcap)
    if query.is_cuda:
        from pdserve.kernels import triton_decode_attention

        return triton_decode_attention.decode_attention(
            query, k_cache, v_cache, block_tables, context_lens, scale, **masking
        )
    if ((query.dtype == k_cache.dtype or k_cache.dtype == torch.int8) and k_cache.is_contiguous()
            and v_cache.is_contiguous() and (library := cpu_decode_attention.load(k_cache.dtype))):
        return cpu_decode_attention.decode_attention(
            library, query, k_cache, v_cache, block_tables, context_lens, scale, **masking)
    return decode_attention_reference(query, k_cache, v_cache, block_tables, context_lens, scale, **masking)


def prefill_attention(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim], sequences packed back to back
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [num_seqs, max_blocks_per_seq] int32
    query_start_loc: torch.Tensor,  # [num_seqs + 1] int32 cumulative offsets into query
    context_lens: torch.Tensor,  # [num_seqs] int32, cached prefix + new tokens
    scale: float,
    *,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Causal attention of new tokens (K/V already stored) over cached prefix and each other.

    New token i of sequence s sits at position context_lens[s] - q_len_s + i: prefix 0 is a
    plain prefill, a non-zero prefix is a later chunk of a chunked prefill.
    """
    _check_masking(sliding_window, logit_softcap)
    masking = dict(sliding_window=sliding_window, logit_softcap=logit_softcap)
    if query.is_cuda:
        from pdserve.kernels import triton_prefill_attention

        return triton_prefill_attention.prefill_attention(
            query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, **masking
        )
    if (cpu_prefill_attention.serves(query, k_cache, logit_softcap) and k_cache.is_contiguous()
            and v_cache.is_contiguous() and (library := cpu_prefill_attention.load(query.dtype))
            and cpu_prefill_attention.vectorised(library, query.shape[-1])):
        return cpu_prefill_attention.prefill_attention(
            library, query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale,
            sliding_window=sliding_window)
    return prefill_attention_reference(
        query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, **masking
    )


def _check_masking(sliding_window: int | None, logit_softcap: float | None) -> None:
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1, got {sliding_window}")
    if logit_softcap is not None and not logit_softcap > 0:
        raise ValueError(f"logit_softcap must be > 0, got {logit_softcap}")
