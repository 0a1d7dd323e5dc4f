"""Linear layers on GGUF K-quant weights (Q4_K, Q6_K) for CPU, compiled: `csrc/kquant_linear.c`,
built on first use (kernels/cpu_build.py). The layouts and the exact dequantization are
`kernels/kquant_reference.py`'s; the interface is `cpu_block_linear`'s.

`block_linear(x, blocks, block_type)` multiplies activations by the weight without dequantizing it
whole: each super-block of 256 weights is unpacked into a buffer in L1 and multiplied with every
row, so a decode step reads the weight's 0.56 (Q4_K) or 0.82 (Q6_K) bytes a weight.
`dequantize(blocks, block_type, dtype)` writes the whole weight, for a prefill's many rows.

A row's product is the same bit for bit whatever other rows and thread count it is computed with.
It equals x.float() @ dequantized.T but for summation order, except that where the library is
built with AVX512-BF16 (`rounds_bfloat16_weights()`), bfloat16 x multiplies the weight rounded to
bfloat16 (as `dequantize(..., torch.bfloat16)` rounds it): then it equals
x.float() @ dequantize(blocks, block_type, torch.bfloat16).float().T but for summation order.

Both return None when they cannot serve their arguments (a tensor not on the CPU or not
contiguous, x neither float32 nor bfloat16, no compiler, `PDSERVE_CPU_KERNELS=0`): the caller runs
the reference then. Arguments the reference rejects too raise ValueError, as it does: an unknown
K-quant type, blocks whose width is no whole number of super-blocks, x whose width is not the
weight's. The library is called through `ctypes`, which releases the GIL for the call, on
`torch.get_num_threads()` threads.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from pdserve.kernels.cpu_build import enabled, load_library
from pdserve.kernels.kquant_reference import K_BLOCK_TYPES, in_features_of

SOURCE_NAME = "kquant_linear.c"
FLAGS: tuple[str, ...] = ()
_POINTER, _INT64, _INT32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
_FLOAT_DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def load() -> ctypes.CDLL | None:
    return build() if enabled() else None


def build(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The library built with FLAGS + extra_flags (the tests build the portable C with AVX-512 off),
    its functions declared; None when it cannot be built."""
    library = load_library(SOURCE_NAME, FLAGS + extra_flags)
    if library is None:
        return None
    library.kquant_linear.argtypes = [_POINTER] * 3 + [_INT32] + [_INT64] * 3 + [_INT32] * 2
    library.kquant_dequantize.argtypes = [_POINTER] * 2 + [_INT32] + [_INT64] * 2 + [_INT32] * 2
    library.kquant_linear.restype = library.kquant_dequantize.restype = _INT64
    library.kquant_linear_rounds_bfloat16_weights.argtypes = []
    library.kquant_linear_rounds_bfloat16_weights.restype = _INT32
    return library


def rounds_bfloat16_weights(library: ctypes.CDLL | None = None) -> bool:
    """Whether `block_linear` (or `library`'s) multiplies bfloat16 x by the weight rounded to
    bfloat16 (built with AVX512-BF16); False when there is no library."""
    library = library or load()
    return library is not None and bool(library.kquant_linear_rounds_bfloat16_weights())


def _check(status: int, what: str) -> None:
    if status == 2:
        raise MemoryError(f"{what}: no scratch memory")
    if status:
        raise ValueError(f"{what}: arguments rejected by the kernel (status {status})")


def block_linear(x: torch.Tensor, blocks: torch.Tensor, block_type: str) -> torch.Tensor | None:
    """x [M, K] float32 or bfloat16 times the weight [N, K] held as `blocks` (uint8 [N, (K / 256) *
    block_bytes]), transposed: [M, N] in x.dtype, summed in float32."""
    in_features = in_features_of(blocks, block_type)
    if x.dim() != 2 or x.shape[1] != in_features:
        raise ValueError(f"x {list(x.shape)} does not match a {block_type} weight of {in_features} in-features")
    library = load()
    if (library is None or x.dtype not in _FLOAT_DTYPES or not (x.is_cpu and blocks.is_cpu)
            or not (x.is_contiguous() and blocks.is_contiguous())):
        return None
    out = torch.empty(x.shape[0], blocks.shape[0], dtype=torch.float32)
    _check(library.kquant_linear(out.data_ptr(), x.data_ptr(), blocks.data_ptr(), K_BLOCK_TYPES[block_type].ggml_type,
                                 x.shape[0], blocks.shape[0], in_features, x.dtype == torch.bfloat16,
                                 torch.get_num_threads()), "kquant_linear")
    return out if x.dtype == torch.float32 else out.to(x.dtype)


def dequantize(blocks: torch.Tensor, block_type: str, dtype: torch.dtype = torch.float32, *,
               out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The weight [N, K] in dtype (float32, or bfloat16 rounded to nearest even) from `blocks`,
    written into `out` when given (contiguous [N, K] of dtype)."""
    in_features = in_features_of(blocks, block_type)
    if out is not None and (out.shape != (blocks.shape[0], in_features) or out.dtype != dtype):
        raise ValueError(f"out {out.dtype} {list(out.shape)} is not {dtype} {[blocks.shape[0], in_features]}")
    library = load()
    if (library is None or dtype not in _FLOAT_DTYPES or not blocks.is_cpu or not blocks.is_contiguous()
            or (out is not None and not (out.is_cpu and out.is_contiguous()))):
        return None
    if out is None:
        out = torch.empty(blocks.shape[0], in_features, dtype=dtype)
    _check(library.kquant_dequantize(out.data_ptr(), blocks.data_ptr(), K_BLOCK_TYPES[block_type].ggml_type,
                                     blocks.shape[0], in_features, dtype == torch.bfloat16, torch.get_num_threads()),
           "kquant_dequantize")
    return out
