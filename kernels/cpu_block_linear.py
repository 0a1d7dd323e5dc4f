"""Linear layers on GGUF block-quantized weights (Q8_0, Q4_0, Q4_1) for CPU, compiled:
`csrc/block_linear.c`, built on first use (kernels/cpu_build.py). The layouts and the exact
dequantization are `kernels/block_quant_reference.py`'s.

`block_linear(x, blocks, block_type)` multiplies activations by the weight without dequantizing it
whole: each block is unpacked in registers as it is read, so a decode step reads the weight's
0.56 (Q4_0) to 1.06 (Q8_0) bytes a weight instead of bfloat16's 2. `dequantize(blocks, block_type,
dtype)` writes the whole weight, for a prefill's many rows (dequantize, then a float GEMM).

On one core of a 2-vCPU AMD EPYC (Zen 4), SmolLM2-135M in Q4_1 with a Q8_0 LM head, its weights
cold as in a decode step (30 layers' copies), bfloat16 x: the projections and head take ~11 ms for
one row, where PackedLinear takes ~21 ms on the weights in bfloat16; with AVX512-BF16 each further
row costs one bfloat16 pair multiply-add a weight pair (vdpbf16ps), ~24 ms for 8 rows (PackedLinear
~23) and ~41 for 16 (PackedLinear ~31), so from about 8 rows PackedLinear in bfloat16 is as fast.
Float32 x costs two float32 multiply-adds a weight a row (~31 ms for 8 rows).

A row's product is the same bit for bit whatever other rows and thread count it is computed
with. It equals x.float() @ dequantized.T but for summation order, except that where the library
is built with AVX512-BF16 (`rounds_bfloat16_weights()`), bfloat16 x multiplies the weight rounded
to bfloat16 (round to nearest even, as `dequantize(..., torch.bfloat16)` rounds it): then it equals
x.float() @ dequantize(blocks, block_type, torch.bfloat16).float().T but for summation order, what
a bfloat16 model and the dequantize-then-GEMM path compute.

Both return None when they cannot serve their arguments (a tensor not on the CPU or not
contiguous, x neither float32 nor bfloat16, no compiler, `PDSERVE_CPU_KERNELS=0`): the caller runs
the reference then. Arguments the reference rejects too raise ValueError, as it does: an unknown
block type, blocks whose width is no whole number of blocks, x whose width is not the weight's
(so any x whose width is not a multiple of 32). The library is called through `ctypes`, which
releases the GIL for the call, on `torch.get_num_threads()` threads.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from pdserve.kernels.block_quant_reference import BLOCK_TYPES, in_features_of
from pdserve.kernels.cpu_build import enabled, load_library

SOURCE_NAME = "block_linear.c"
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
    library.block_linear.argtypes = [_POINTER] * 3 + [_INT32] + [_INT64] * 3 + [_INT32] * 2
    library.block_dequantize.argtypes = [_POINTER] * 2 + [_INT32] + [_INT64] * 2 + [_INT32] * 2
    library.block_linear.restype = library.block_dequantize.restype = _INT64
    library.block_linear_rounds_bfloat16_weights.argtypes = []
    library.block_linear_rounds_bfloat16_weights.restype = _INT32
    return library


def rounds_bfloat16_weights(library: ctypes.CDLL | None = None) -> bool:
    """Whether `block_linear` (or `library`'s) multiplies bfloat16 x by the weight rounded to
    bfloat16 (built with AVX512-BF16), not the exact float32 weight; False when there is no library."""
    library = library or load()
    return library is not None and bool(library.block_linear_rounds_bfloat16_weights())


def _check(status: int, what: str) -> None:
    if status == 2:
        raise MemoryError(f"{what}: no scratch memory")
    if status:
        raise ValueError(f"{what}: arguments rejected by the kernel (status {status})")


def block_linear(x: torch.Tensor, blocks: torch.Tensor, block_type: str) -> torch.Tensor | None:
    """x [M, K] float32 or bfloat16 times the weight [N, K] held as `blocks` (uint8 [N, (K / 32) *
    block_bytes]), transposed: [M, N] in x.dtype, summed in float32."""
    in_features = in_features_of(blocks, block_type)
    if x.dim() != 2 or x.shape[1] != in_features:
        raise ValueError(f"x {list(x.shape)} does not match a {block_type} weight of {in_features} in-features")
    library = load()
    if (library is None or x.dtype not in _FLOAT_DTYPES or not (x.is_cpu and blocks.is_cpu)
            or not (x.is_contiguous() and blocks.is_contiguous())):
        return None
    out = torch.empty(x.shape[0], blocks.shape[0], dtype=torch.float32)
    _check(library.block_linear(out.data_ptr(), x.data_ptr(), blocks.data_ptr(), BLOCK_TYPES[block_type].ggml_type,
                                x.shape[0], blocks.shape[0], in_features, x.dtype == torch.bfloat16,
                                torch.get_num_threads()), "block_linear")
    return out if x.dtype == torch.float32 else out.to(x.dtype)


def dequantize(blocks: torch.Tensor, block_type: str, dtype: torch.dtype = torch.float32, *,
               out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The weight [N, K] in dtype (float32, or bfloat16 rounded to nearest even) from `blocks`,
    written into `out` when given (contiguous [N, K] of dtype: a buffer kept across calls spares
    the page faults of a fresh one, which cost the LM head's 113 MB eight times the dequantizing)."""
    in_features = in_features_of(blocks, block_type)
    if out is not None and (out.shape != (blocks.shape[0], in_features) or out.dtype != dtype):
        raise ValueError(f"out {out.dtype} {list(out.shape)} is not {dtype} {[blocks.shape[0], in_features]}")
    library = load()
    if (library is None or dtype not in _FLOAT_DTYPES or not blocks.is_cpu or not blocks.is_contiguous()
            or (out is not None and not (out.is_cpu and out.is_contiguous()))):
        return None
    if out is None:
        out = torch.empty(blocks.shape[0], in_features, dtype=dtype)
    _check(library.block_dequantize(out.data_ptr(), blocks.data_ptr(), BLOCK_TYPES[block_type].ggml_type,
                                    blocks.shape[0], in_features, dtype == torch.bfloat16, torch.get_num_threads()),
           "block_dequantize")
    return out
