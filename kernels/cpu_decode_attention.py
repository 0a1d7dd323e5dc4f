"""Compiled paged decode attention for CPU: `csrc/paged_decode_attention.c`, built on first use
(kernels/cpu_build.py) once per KV dtype it serves (`KV_DTYPE_FLAGS`: float32; bfloat16 widened as
it is read; int8 entries, kernels/kv_quant.py, scaled as they are read).

The library is called through `ctypes`, which releases the GIL for the call.
`load(dtype)` returns None when the kernel cannot be had (no compiler, a failed build, an
unsupported dtype, or `PDSERVE_CPU_KERNELS=0`), and the caller keeps the torch reference: the
compiled kernel is an optimisation, never a requirement. The query and output cross the call in
float32 or bfloat16 as they are; another query dtype is widened to float32 and the output narrowed back.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from pdserve.kernels.cpu_build import enabled, load_library

SOURCE_NAME = "paged_decode_attention.c"
KV_DTYPE_FLAGS = {torch.float32: (), torch.bfloat16: ("-DKV_BFLOAT16",), torch.int8: ("-DKV_INT8",)}


@functools.cache
def load(dtype: torch.dtype = torch.float32) -> ctypes.CDLL | None:
    """The kernel for a pool of `dtype`, built on first use."""
    return build(dtype) if enabled() and dtype in KV_DTYPE_FLAGS else None


def build(dtype: torch.dtype, extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The kernel for a pool of `dtype` built with `extra_flags` too (the tests build it with
    AVX-512 off), its function declared; None when it cannot be built."""
    library = load_library(SOURCE_NAME, KV_DTYPE_FLAGS[dtype] + extra_flags)
    if library is None:
        return None
    function = library.paged_decode_attention
    function.restype = ctypes.c_int64
    function.argtypes = ([ctypes.c_void_p] * 6 + [ctypes.c_int64] * 7
                         + [ctypes.c_float, ctypes.c_int64, ctypes.c_float, ctypes.c_int64, ctypes.c_int32,
                            ctypes.c_int32])
    return library


def decode_attention(library: ctypes.CDLL, query, k_cache, v_cache, block_tables, context_lens, scale, *,
                     sliding_window: int | None = None, logit_softcap: float | None = None):
    """`kernels.decode_attention` for CPU tensors of the documented layouts, K/V in the dtype that
    `library` was built for, any query dtype. The C kernel takes 0 for no window and for no softcap."""
    num_seqs, num_heads, head_dim = query.shape
    query_in = query if query.dtype in (torch.float32, torch.bfloat16) else query.float()
    if query_in.stride(2) != 1 or query_in.stride(1) != head_dim:  # rows apart will do, heads must be contiguous
        query_in = query_in.contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    context_lens = context_lens.to(torch.int32).contiguous()
    num_blocks, block_size, num_kv_heads = k_cache.shape[:3]
    out = torch.empty(query.shape, dtype=query_in.dtype)  # [num_seqs, num_heads, head_dim]
    status = library.paged_decode_attention(
        out.data_ptr(), query_in.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        block_tables.data_ptr(), context_lens.data_ptr(),
        num_seqs, num_heads, num_kv_heads, head_dim, num_blocks, block_size, block_tables.shape[1],
        scale, sliding_window or 0, logit_softcap or 0.0, query_in.stride(0), query_in.dtype == torch.bfloat16,
        torch.get_num_threads(),
    )
    if status == -1:
        raise MemoryError(f"decode attention: no scratch memory for {num_seqs} sequences")
    if status:
        seq = status - 1
        raise ValueError(f"decode attention: sequence {seq} has context length {int(context_lens[seq])} "
                         f"or a block id outside the pool of {num_blocks} blocks")
    return out.to(query.dtype)
