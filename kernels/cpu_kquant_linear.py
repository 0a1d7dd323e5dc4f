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
the reference then. Arguments the reference rejects raise ValueError, as it does. The calls are
kernels/cpu_block_kernels.py's, shared with the other block kernels' library.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from pdserve.kernels.cpu_block_kernels import BlockKernels
from pdserve.kernels.cpu_build import enabled
from pdserve.kernels.kquant_reference import K_BLOCK_TYPES

KERNELS = BlockKernels("kquant_linear.c", "kquant", K_BLOCK_TYPES)
FLAGS: tuple[str, ...] = ()


@functools.cache
def load() -> ctypes.CDLL | None:
    return build() if enabled() else None


def build(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The library built with FLAGS + extra_flags (the tests build the portable C with AVX-512 off),
    its functions declared; None when it cannot be built."""
    return KERNELS.build(FLAGS + extra_flags)


def rounds_bfloat16_weights(library: ctypes.CDLL | None = None) -> bool:
    """Whether `block_linear` (or `library`'s) multiplies bfloat16 x by the weight rounded to
    bfloat16 (built with AVX512-BF16), not the exact float32 weight; False when there is no library."""
    return KERNELS.rounds_bfloat16_weights(library or load())


def block_linear(x: torch.Tensor, blocks: torch.Tensor, block_type: str) -> torch.Tensor | None:
    """x [M, K] float32 or bfloat16 times the weight [N, K] held as `blocks`, transposed: [M, N] in
    x.dtype, summed in float32."""
    return KERNELS.linear(load, x, blocks, block_type)


def dequantize(blocks: torch.Tensor, block_type: str, dtype: torch.dtype = torch.float32, *,
               out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The weight [N, K] in dtype (float32, or bfloat16 rounded to nearest even) from `blocks`,
    written into `out` when given (contiguous [N, K] of dtype: a buffer kept across calls spares
    the page faults of a fresh one)."""
    return KERNELS.dequantize(load, blocks, block_type, dtype, out)
