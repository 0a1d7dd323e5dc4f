"""Compiled paged prefill attention for CPU: `csrc/paged_prefill_attention.c` (flash attention over
K and V repacked into tiles of 16 keys; the method is its header's), built on first use
(kernels/cpu_build.py) once per dtype, float32 and bfloat16.

It serves a query and a pool of one of those dtypes, without a logit softcap, where the CPU has
AVX-512 (and AVX512-BF16 for bfloat16: `vectorised`). On an AMD EPYC without AMX, a 330-token
SmolLM2 layer (9 heads, 3 KV heads, 64 dims) attends in bfloat16 in 0.54 ms on two threads and
1.26 ms on one, against 1.56 and 2.43 ms for torch's fused attention called 64 query rows at a
time (kernels/reference.py); in float32 in 0.72 and 1.14 ms against 1.32 and 2.06. Elsewhere its portable C computes the
same up to summation order and is tested, but torch's kernel is faster, so callers keep the
reference.

The library is called through `ctypes`, which releases the GIL for the call; `load()` returns
None when the kernel cannot be had (no compiler, a failed build, `PDSERVE_CPU_KERNELS=0`).
"""
from __future__ import annotations

import ctypes
import functools

import torch

from pdserve.kernels.cpu_build import enabled, load_library

SOURCE_NAME = "paged_prefill_attention.c"
DTYPE_FLAGS = {torch.float32: (), torch.bfloat16: ("-DBFLOAT16",)}
_POINTER, _INT64 = ctypes.c_void_p, ctypes.c_int64


@functools.cache
def load(dtype: torch.dtype = torch.bfloat16, extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The kernel for `dtype`, built on first use (`extra_flags` for tests of the portable path)."""
    if not enabled() or dtype not in DTYPE_FLAGS:
        return None
    library = load_library(SOURCE_NAME, DTYPE_FLAGS[dtype] + extra_flags)
    if library is None:
        return None
    library.paged_prefill_attention.restype = _INT64
    library.paged_prefill_attention.argtypes = [_POINTER] * 7 + [_INT64] * 7 + [ctypes.c_float, _INT64, ctypes.c_int32]
    library.prefill_attention_vectorised.restype = ctypes.c_int32
    library.prefill_attention_vectorised.argtypes = [_INT64]
    return library


def serves(query: torch.Tensor, k_cache: torch.Tensor, logit_softcap: float | None) -> bool:
    """Whether a build serves these arguments (either path): CPU tensors of one of DTYPE_FLAGS'
    dtypes, head_dim a multiple of 16, no softcap."""
    return (query.dtype == k_cache.dtype and query.dtype in DTYPE_FLAGS and not query.is_cuda
            and not k_cache.is_cuda and query.shape[-1] % 16 == 0 and logit_softcap is None)


def vectorised(library: ctypes.CDLL, head_dim: int) -> bool:
    """Whether the build runs on AVX-512 for `head_dim`, where it beats torch's attention."""
    return bool(library.prefill_attention_vectorised(head_dim))


def prefill_attention(library: ctypes.CDLL, query, k_cache, v_cache, block_tables, query_start_loc, context_lens,
                      scale: float, *, sliding_window: int | None = None) -> torch.Tensor:
    """`kernels.prefill_attention` for arguments `serves` accepts, K and V contiguous (read in place)."""
    query = query.contiguous()
    block_tables = block_tables.to(torch.int32).contiguous()
    query_start_loc = query_start_loc.to(torch.int32).contiguous()
    context_lens = context_lens.to(torch.int32).contiguous()
    _, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads = k_cache.shape[:3]
    out = torch.empty_like(query)  # [num_tokens, num_heads, head_dim]
    status = library.paged_prefill_attention(
        out.data_ptr(), query.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(),
        query_start_loc.data_ptr(), context_lens.data_ptr(), context_lens.shape[0], num_heads, num_kv_heads,
        head_dim, num_blocks, block_size, block_tables.shape[1], scale, sliding_window or 0,
        torch.get_num_threads(),
    )
    if status == -1:
        raise MemoryError(f"prefill attention: no scratch memory for {context_lens.shape[0]} sequences")
    if status:
        seq = status - 1
        raise ValueError(f"prefill attention: sequence {seq} has lengths or block ids outside the pool "
                         f"of {num_blocks} blocks")
    return out
