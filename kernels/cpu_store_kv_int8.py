"""Compiled writes into an int8 KV pool for CPU: `csrc/store_kv_int8.c`, built on first use
(kernels/cpu_build.py) once per activation dtype (float32, bfloat16). A decode step writes each
layer's K and V once, a few rows each, so the torch reference's dozen ops a write (about 0.1 ms on
one core) would cost a 30-layer step several milliseconds; the compiled write costs microseconds.

`store_kv_int8` returns False when it cannot serve its arguments (a dtype it was not built for,
heads not contiguous within a token, no compiler, `PDSERVE_CPU_KERNELS=0`): the caller runs the
reference then. Its entries equal the reference's bit for bit.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from pdserve.kernels.cpu_build import load_build_for

SOURCE_NAME = "store_kv_int8.c"
DTYPE_FLAGS = {torch.float32: (), torch.bfloat16: ("-DBFLOAT16",)}


@functools.cache
def load(dtype: torch.dtype) -> ctypes.CDLL | None:
    library = load_build_for(SOURCE_NAME, DTYPE_FLAGS, dtype)
    if library is None:
        return None
    library.store_kv_int8.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5
    library.store_kv_int8.restype = None
    return library


def store_kv_int8(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  slot_mapping: torch.Tensor) -> bool:
    """`kernels.store_kv` into an int8 pool on the CPU; True once written."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if (key.dtype != value.dtype or not (k_cache.is_contiguous() and v_cache.is_contiguous())
            or any(x.stride(2) != 1 or x.stride(1) != head_dim for x in (key, value))
            or (library := load(key.dtype)) is None):
        return False
    slot_mapping = slot_mapping.to(torch.int64).contiguous()
    library.store_kv_int8(k_cache.data_ptr(), v_cache.data_ptr(), key.data_ptr(), value.data_ptr(),
                          slot_mapping.data_ptr(), num_tokens, num_kv_heads, head_dim, key.stride(0), value.stride(0))
    return True
