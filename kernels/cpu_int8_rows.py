"""The passes around an int8 GEMM on CPU, compiled: `csrc/int8_rows.c` (a row's levels and
scale; the product's rows and columns scaled back to the dtype, plus the bias), one pass over
memory each where torch takes four or five. Built on first use (kernels/cpu_build.py) once per
dtype, float32 and bfloat16.

On an AMD EPYC (Zen 4, 2 cores) a 300-token SmolLM2 prefill in w8a8 spent 35 of its 200 ms in
torch's versions of these two passes. Each function returns None when it cannot serve its
arguments (another device or dtype, a non-contiguous tensor, no compiler, `PDSERVE_CPU_KERNELS=0`):
the caller runs its torch code then, whose results these equal bit for bit.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from pdserve.kernels.cpu_build import load_build_for

SOURCE_NAME = "int8_rows.c"
# Products scaled in torch's order, (product * row scale) * column scale, never reassociated.
DTYPE_FLAGS = {torch.float32: ("-fno-associative-math",), torch.bfloat16: ("-DBFLOAT16", "-fno-associative-math")}
_POINTER, _INT64 = ctypes.c_void_p, ctypes.c_int64


@functools.cache
def load(dtype: torch.dtype) -> ctypes.CDLL | None:
    library = load_build_for(SOURCE_NAME, DTYPE_FLAGS, dtype)
    if library is None:
        return None
    library.quantize_rows.argtypes = [_POINTER] * 4 + [_INT64] * 2
    library.scale_rows.argtypes = [_POINTER] * 5 + [_INT64] * 2
    library.quantize_rows.restype = library.scale_rows.restype = None
    return library


def quantize_rows(x: torch.Tensor, factors: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """x [rows, cols], each column times factors float32 [cols] (None: none) -> (levels int8
    [rows, cols], scales float32 [rows])."""
    tensors = (x, *(() if factors is None else (factors,)))
    library = load(x.dtype) if x.dim() == 2 and all(t.is_cpu and t.is_contiguous() for t in tensors) else None
    if library is None:
        return None
    levels = torch.empty(x.shape, dtype=torch.int8)
    scales = torch.empty(x.shape[0], dtype=torch.float32)
    library.quantize_rows(levels.data_ptr(), scales.data_ptr(), x.data_ptr(),
                          0 if factors is None else factors.data_ptr(), *x.shape)
    return levels, scales


def scale_rows(products: torch.Tensor, row_scales: torch.Tensor, col_scales: torch.Tensor,
               bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """products int32 [rows, cols] * row_scales [rows, 1-wide] * col_scales [cols] (float32) in
    `dtype`, plus bias [cols] of `dtype`."""
    tensors = (products, row_scales, col_scales, *(() if bias is None else (bias,)))
    library = load(dtype) if all(t.is_cpu and t.is_contiguous() for t in tensors) else None
    if library is None or (bias is not None and bias.dtype != dtype):
        return None
    out = torch.empty(products.shape, dtype=dtype)
    library.scale_rows(out.data_ptr(), products.data_ptr(), row_scales.data_ptr(), col_scales.data_ptr(),
                       0 if bias is None else bias.data_ptr(), *products.shape)
    return out
